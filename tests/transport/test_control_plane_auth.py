"""The tcp control plane admits only sockets holding the run's CURVE keys."""

from __future__ import annotations

import time

import pytest
import zmq

from omnipipe.transport import control_plane
from omnipipe.transport.control_plane import ControlKeys


@pytest.fixture
def server():
    keys = ControlKeys.generate()
    ctx = zmq.Context()
    control_plane.secure_context(ctx, keys)
    pull = control_plane.make_socket(ctx, zmq.PULL, "tcp://127.0.0.1:*", bind=True)
    yield ctx, keys, pull, control_plane.bound_address(pull)
    pull.close(0)
    control_plane.release_context(ctx)
    ctx.term()


def _client(keys: ControlKeys | None, address: str) -> tuple[zmq.Context, zmq.Socket]:
    ctx = zmq.Context()
    if keys is not None:
        control_plane.secure_context(ctx, keys)
    return ctx, control_plane.make_socket(ctx, zmq.PUSH, address, bind=False)


def _close(ctx: zmq.Context, sock: zmq.Socket) -> None:
    sock.close(0)
    control_plane.release_context(ctx)
    ctx.term()


def _received(pull: zmq.Socket, timeout_ms: int) -> list[bytes]:
    got = []
    while pull.poll(timeout_ms):
        got.append(pull.recv())
        timeout_ms = 50
    return got


def test_a_client_with_the_run_keys_gets_through(server):
    ctx, keys, pull, address = server
    cctx, push = _client(keys, address)
    try:
        push.send(b"hello")
        assert _received(pull, 5000) == [b"hello"]
        assert control_plane.refused_connections(ctx) == 0
    finally:
        _close(cctx, push)


def test_a_plain_socket_cannot_inject(server):
    ctx, keys, pull, address = server
    cctx, push = _client(None, address)  # no CURVE at all: the handshake fails
    try:
        if push.poll(1000, zmq.POLLOUT):
            push.send(b"forged", zmq.NOBLOCK)
        assert _received(pull, 1000) == []
    finally:
        _close(cctx, push)


def test_a_curve_client_with_its_own_keys_is_refused_and_counted(server):
    ctx, keys, pull, address = server
    # it knows the server's public key (that is public) but not the run's client secret
    own_public, own_secret = zmq.curve_keypair()
    forged = ControlKeys(keys.server_public, "", own_public.decode(), own_secret.decode())
    cctx, push = _client(forged, address)
    try:
        if push.poll(1000, zmq.POLLOUT):
            push.send(b"forged", zmq.NOBLOCK)
        assert _received(pull, 1000) == []
        deadline = time.monotonic() + 5
        while control_plane.refused_connections(ctx) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert control_plane.refused_connections(ctx) >= 1
    finally:
        _close(cctx, push)


def test_ipc_sockets_are_left_plain(tmp_path):
    keys = ControlKeys.generate()
    ctx = zmq.Context()
    control_plane.secure_context(ctx, keys)
    try:
        address = f"ipc://{tmp_path}/sock"
        pull = control_plane.make_socket(ctx, zmq.PULL, address, bind=True)
        assert not pull.curve_server
        other = zmq.Context()
        push = control_plane.make_socket(other, zmq.PUSH, address, bind=False)
        push.send(b"x")
        assert _received(pull, 5000) == [b"x"]
        push.close(0)
        other.term()
        pull.close(0)
    finally:
        control_plane.release_context(ctx)
        ctx.term()
