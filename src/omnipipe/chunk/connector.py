"""Transport-only chunk connector: ``put(to_stage, key, data)`` and ``get(key)``.

It knows nothing about requests' lifecycles: the transfer adapter builds keys and decides what to wait for.
Sender side: encodes the chunk, writes its tensors through the edge's relay, and pushes a ``ChunkReady`` to
the consumer stage's chunk socket. Receiver side: ``receive(timeout)`` blocks on that socket, reads the relay
(which frees the sender's slot at once), and files the chunk under its key until ``get`` takes it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq

from omnipipe.transport import control_plane
from omnipipe.transport.messages import ChunkReady
from omnipipe.transport.relay.base import Relay, RelayError
from omnipipe.transport.relay_io import read_payload, write_payload

logger = logging.getLogger(__name__)


@dataclass
class ReceivedChunk:
    key: str
    request_id: str
    from_stage: str
    chunk_id: int
    is_last: bool
    data: dict[str, Any] | None
    nbytes: int
    transfer_s: float


@dataclass
class EdgeLink:
    """Sender end of one edge: where the consumer listens and how bytes travel."""

    address: str | None  # None until the orchestrator sends the consumer's bound address (ChunkRoutes)
    relay: Relay
    inline_threshold_bytes: int


class ChunkConnector:
    def __init__(self, ctx: zmq.Context, stage: str, links: dict[str, EdgeLink], listen_address: str | None,
                 receive_relays: dict[str, Relay]) -> None:
        self.stage = stage
        self._links = links
        self._ctx = ctx
        self._push: dict[str, zmq.Socket] = {}
        self._push_address: dict[str, str] = {}
        for target, link in links.items():
            if link.address is not None:
                self.connect(target, link.address)
        self._pull = (control_plane.make_socket(ctx, zmq.PULL, listen_address, bind=True)
                      if listen_address else None)
        self.listen_address = control_plane.bound_address(self._pull) if self._pull is not None else None
        self._receive_relays = receive_relays
        self._store: dict[str, ReceivedChunk] = {}
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- sender (save loop thread only)
    def connect(self, to_stage: str, address: str) -> None:
        """Send ``to_stage``'s chunks to ``address`` from now on (a consumer restarted on a new port)."""
        if self._push_address.get(to_stage) == address:
            return
        old = self._push.pop(to_stage, None)
        if old is not None:
            old.close(0)
        self._push[to_stage] = control_plane.make_socket(self._ctx, zmq.PUSH, address, bind=False)
        self._push_address[to_stage] = address

    def put(self, to_stage: str, key: str, request_id: str, chunk_id: int, is_last: bool,
            data: dict[str, Any] | None) -> int:
        link = self._links[to_stage]
        sock = self._push.get(to_stage)
        if sock is None:
            raise RelayError(f"no address for stage {to_stage!r}'s chunk socket yet")
        payload = (write_payload(data, link.relay, request_id, link.inline_threshold_bytes)
                   if data is not None else None)
        message = ChunkReady(key, request_id, self.stage, to_stage, chunk_id, is_last, payload, time.time())
        sock.send(control_plane.encode(message), copy=False)
        return payload.nbytes if payload is not None else 0

    # -------------------------------------------------------------- receiver (recv loop thread only)
    @property
    def receive_socket(self) -> zmq.Socket | None:
        return self._pull

    def receive(self) -> ReceivedChunk | None:
        """Take one message off the socket (call when it is readable). Malformed input is dropped."""
        assert self._pull is not None
        frame = self._pull.recv()
        message = control_plane.decode(control_plane.CHUNK, frame, f"stage {self.stage} chunk socket")
        if message is None:
            return None
        data = None
        if message.payload is not None:
            try:
                data = read_payload(message.payload, self._receive_relays, message.request_id)
            except (RelayError, ValueError) as exc:
                logger.error("stage %s: chunk %s unreadable: %s", self.stage, message.key, exc)
                return None
        nbytes = (len(message.payload.skeleton) + message.payload.nbytes) if message.payload else 0
        chunk = ReceivedChunk(message.key, message.request_id, message.from_stage, message.chunk_id,
                              message.is_last, data, nbytes, max(0.0, time.time() - message.sent_at_s))
        with self._lock:
            self._store[message.key] = chunk
        return chunk

    # ------------------------------------------------------------------------ either thread
    def get(self, key: str) -> ReceivedChunk | None:
        with self._lock:
            return self._store.pop(key, None)

    def drop(self, request_id: str) -> int:
        with self._lock:
            keys = [k for k, chunk in self._store.items() if chunk.request_id == request_id]
            for key in keys:
                del self._store[key]
            return len(keys)

    def pending(self) -> int:
        with self._lock:
            return len(self._store)

    def close(self) -> None:
        for sock in self._push.values():
            sock.close(0)
        if self._pull is not None:
            self._pull.close(0)
