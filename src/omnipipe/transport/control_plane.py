"""ZMQ control plane: socket factories and one encode/decode pair for every message family.

Orchestrator binds, stages connect, so a restarted stage finds every address where it was. Abort is a PUB/SUB
broadcast. A frame that does not decode into the expected message type is logged and dropped: a malformed
message never kills the receiver.

Over tcp the sockets are authenticated and encrypted with ZMQ CURVE: the orchestrator makes one ``ControlKeys``
per run (a server and a client key pair) and hands it to its stages in their launch spec. Every socket that binds
a tcp address is a CURVE server whose ZAP handler admits only the run's client key; every socket that connects
is a CURVE client holding that key. A peer without the run's keys (another host, a forged socket) never gets a
message through: the handshake fails, or the ZAP handler denies it, is counted and logged. ipc and inproc
addresses are left as they are (file permissions and the process boundary guard them).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, TypeVar

import msgspec
import zmq
import zmq.auth.thread

from omnipipe.transport.messages import Broadcast, ChunkReady, FromStage, ToStage

logger = logging.getLogger(__name__)

T = TypeVar("T")
SocketT = TypeVar("SocketT", bound=zmq.Socket)  # a plain socket, or a zmq.asyncio one from an asyncio context

_encoder = msgspec.msgpack.Encoder()
TO_STAGE = msgspec.msgpack.Decoder(ToStage)
FROM_STAGE = msgspec.msgpack.Decoder(FromStage)
BROADCAST = msgspec.msgpack.Decoder(Broadcast)
CHUNK = msgspec.msgpack.Decoder(ChunkReady)


def encode(message: Any) -> bytes:
    return _encoder.encode(message)


def decode(decoder: msgspec.msgpack.Decoder, frame: bytes, where: str) -> Any | None:
    """Decode ``frame`` or log why not and return None."""
    try:
        return decoder.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        logger.warning("%s: dropped a malformed control message (%d bytes): %s", where, len(frame), exc)
        return None


class ControlKeys(msgspec.Struct, frozen=True):
    """One run's CURVE keys (z85 text). Whoever holds the client secret may talk to the run's sockets."""

    server_public: str
    server_secret: str
    client_public: str
    client_secret: str

    @classmethod
    def generate(cls) -> ControlKeys:
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public.decode(), server_secret.decode(), client_public.decode(), client_secret.decode())


class _RunKeyOnly:
    """ZAP credentials check: only the run's client key gets in; every refusal is counted and logged."""

    def __init__(self, keys: ControlKeys) -> None:
        self.allowed = keys.client_public.encode()
        self.denied = 0

    def callback(self, domain: str, key: bytes) -> bool:
        if key == self.allowed:
            return True
        self.denied += 1
        logger.warning("control plane: refused a connection with an unknown CURVE key (%s)",
                       key.decode(errors="replace"))
        return False


class _Secured:
    def __init__(self, keys: ControlKeys, authenticator: zmq.auth.thread.ThreadAuthenticator,
                 check: _RunKeyOnly) -> None:
        self.keys = keys
        self.authenticator = authenticator
        self.check = check


_secured: dict[int, _Secured] = {}  # libzmq context address -> its keys and ZAP handler
_secured_lock = threading.Lock()


def secure_context(ctx: zmq.Context, keys: ControlKeys) -> None:
    """Make every tcp socket ``make_socket`` creates on ``ctx`` from now on use ``keys`` (CURVE), and start the
    ZAP handler that admits only the run's client key on the sockets it binds. ``release_context`` stops it."""
    with _secured_lock:
        if ctx.underlying in _secured:
            return
        check = _RunKeyOnly(keys)
        # a plain context over the same libzmq context: the handler's thread must not use asyncio sockets
        authenticator = zmq.auth.thread.ThreadAuthenticator(zmq.Context.shadow(ctx.underlying), log=logger)
        authenticator.start()
        authenticator.configure_curve_callback(domain="*", credentials_provider=check)
        _secured[ctx.underlying] = _Secured(keys, authenticator, check)


def release_context(ctx: zmq.Context) -> None:
    """Stop ``ctx``'s ZAP handler (before the context is terminated)."""
    with _secured_lock:
        secured = _secured.pop(ctx.underlying, None)
    if secured is not None:
        secured.authenticator.stop()


def refused_connections(ctx: zmq.Context) -> int:
    """How many connections the ZAP handler of ``ctx`` turned away (an unknown CURVE key)."""
    secured = _secured.get(ctx.underlying)
    return secured.check.denied if secured is not None else 0


def _apply_curve(sock: zmq.Socket, keys: ControlKeys, server: bool) -> None:
    if server:
        sock.curve_secretkey = keys.server_secret.encode()
        sock.curve_publickey = keys.server_public.encode()
        sock.curve_server = True
    else:
        sock.curve_secretkey = keys.client_secret.encode()
        sock.curve_publickey = keys.client_public.encode()
        sock.curve_serverkey = keys.server_public.encode()


def make_socket(ctx: zmq.Context[SocketT], kind: int, address: str, *, bind: bool, hwm: int = 0) -> SocketT:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    secured = _secured.get(ctx.underlying)
    if secured is not None and address.startswith("tcp://"):
        _apply_curve(sock, secured.keys, server=bind)
    if hwm:
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.RCVHWM, hwm)
    if kind == zmq.SUB:
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    if bind:
        if address.startswith("ipc://"):
            path = address.removeprefix("ipc://")
            if os.path.exists(path):
                os.unlink(path)
        sock.bind(address)
    else:
        sock.connect(address)
    return sock


def bind_address(transport: str, host: str, ipc_dir: str, name: str) -> str:
    """What to bind: a path in the run's directory for ipc; for tcp any free port, chosen by the kernel at bind
    time (``tcp://host:*``) and read back with ``bound_address``, so no port is probed and re-bound later."""
    if transport == "ipc":
        return f"ipc://{os.path.join(ipc_dir, name)}"
    return f"tcp://{host}:*"


def bound_address(sock: zmq.Socket) -> str:
    """The concrete endpoint a socket was last bound to (the port the kernel chose for ``tcp://host:*``)."""
    endpoint = sock.getsockopt(zmq.LAST_ENDPOINT)
    return endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint)


def ipc_path(address: str) -> str | None:
    return address.removeprefix("ipc://") if address.startswith("ipc://") else None
