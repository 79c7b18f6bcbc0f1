"""Two-process benchmark plumbing: run a peer function in a fresh interpreter and talk to it over ZMQ ipc://."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import zmq

from omnipipe.transport import control_plane

STOP = b"stop"
RECV_TIMEOUT_MS = 60_000
PEER_IDLE_TIMEOUT_MS = 300_000  # a peer whose benchmark process is gone exits after this long


def ms(seconds: float) -> float:
    return seconds * 1e3


def human_bytes(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


@dataclass
class Peer:
    push: zmq.Socket  # to the peer
    pull: zmq.Socket  # from the peer
    process: subprocess.Popen[bytes]

    def recv(self) -> bytes:
        """Receive one frame, failing at once if the peer process has died."""
        deadline = time.monotonic() + RECV_TIMEOUT_MS / 1e3
        while not self.pull.poll(200):
            if self.process.poll() is not None:
                raise RuntimeError(f"benchmark peer exited with code {self.process.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"benchmark peer sent nothing for {RECV_TIMEOUT_MS / 1e3:.0f} s")
        return self.pull.recv()


@contextlib.contextmanager
def run_peer(target: Callable[..., None], *args: str) -> Iterator[Peer]:
    """Run ``target(to_peer, from_peer, *args)`` (a module-level function) in a fresh interpreter and yield the
    sockets to talk to it.

    This end binds and the peer connects, as the orchestrator and the stages do. The peer says b"ready" first
    and stops on b"stop".
    """
    run_dir = tempfile.mkdtemp(prefix="omnipipe-bench-")
    to_peer, from_peer = f"ipc://{run_dir}/to-peer", f"ipc://{run_dir}/from-peer"
    ctx = zmq.Context()
    push = control_plane.make_socket(ctx, zmq.PUSH, to_peer, bind=True)
    pull = control_plane.make_socket(ctx, zmq.PULL, from_peer, bind=True)
    pull.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    push.setsockopt(zmq.SNDTIMEO, RECV_TIMEOUT_MS)
    code = f"import sys; from {target.__module__} import {target.__name__} as peer; peer(*sys.argv[1:])"
    process = subprocess.Popen([sys.executable, "-c", code, to_peer, from_peer, *args], stdin=subprocess.DEVNULL)
    peer = Peer(push, pull, process)
    try:
        if peer.recv() != b"ready":
            raise RuntimeError("benchmark peer did not start")
        yield peer
        push.send(STOP)
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
        push.close(0)
        pull.close(0)
        ctx.term()
        shutil.rmtree(run_dir, ignore_errors=True)


def connect_peer(to_peer: str, from_peer: str) -> tuple[zmq.Context, zmq.Socket, zmq.Socket]:
    """The peer's end: connect both sockets and say b"ready"."""
    ctx = zmq.Context()
    pull = control_plane.make_socket(ctx, zmq.PULL, to_peer, bind=False)
    pull.setsockopt(zmq.RCVTIMEO, PEER_IDLE_TIMEOUT_MS)
    push = control_plane.make_socket(ctx, zmq.PUSH, from_peer, bind=False)
    push.send(b"ready")
    return ctx, pull, push
