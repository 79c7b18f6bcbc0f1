"""ZMQ control plane: socket factories and one encode/decode pair for every message family.

Orchestrator binds, stages connect, so a restarted stage finds every address where it was. Abort is a PUB/SUB
broadcast. A frame that does not decode into the expected message type is logged and dropped: a malformed
message never kills the receiver.
"""

from __future__ import annotations

import logging
import os
from typing import Any, TypeVar

import msgspec
import zmq

from omnipipe.transport.messages import Broadcast, ChunkReady, FromStage, ToStage

logger = logging.getLogger(__name__)

T = TypeVar("T")

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


def make_socket(ctx: zmq.Context, kind: int, address: str, *, bind: bool, hwm: int = 0) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
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
