"""Local relay: same-process handoff for colocated stages, by reference.

Tensors travel as objects (``keeps_device``): a GPU tensor stays on its GPU and no byte is copied. The payload
skeleton still goes through the codec, so a receiver sees the same shapes of data whatever the relay.
Contract: the receiver treats what it gets as read-only, and the sender does not mutate or reuse a tensor after
``put_objects``. A handle taken by ``get_objects`` is gone; ``cleanup`` drops what a request left unread.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

from omnipipe.transport.relay.base import Relay, RelayError

_objects: dict[int, tuple[str, Any]] = {}  # one store per process, shared by every LocalRelay in it
_lock = threading.Lock()
_counter = itertools.count(1)


class LocalRelay(Relay):
    name = "local"
    keeps_device = True

    def put_objects(self, objects: list[Any], request_id: str) -> dict[str, Any]:
        return self._store(request_id, list(objects))

    def get_objects(self, metadata: dict[str, Any], request_id: str) -> list[Any]:
        objects = self._take(metadata)
        if not isinstance(objects, list):
            raise RelayError("local relay handle holds bytes, not objects")
        return objects

    def put(self, pieces: list[tuple[int, memoryview]], nbytes: int, request_id: str) -> dict[str, Any]:
        buffer = bytearray(nbytes)
        for offset, piece in pieces:
            buffer[offset : offset + len(piece)] = piece
        return self._store(request_id, buffer)

    def get(self, metadata: dict[str, Any], nbytes: int, request_id: str) -> Any:
        buffer = self._take(metadata)
        if not isinstance(buffer, bytearray) or len(buffer) != nbytes:
            raise RelayError(f"local relay handle does not hold {nbytes} bytes")
        return buffer

    def _store(self, request_id: str, value: Any) -> dict[str, Any]:
        handle = next(_counter)
        with _lock:
            _objects[handle] = (request_id, value)
        return {"handle": handle, "pid": os.getpid()}

    def _take(self, metadata: dict[str, Any]) -> Any:
        if metadata.get("pid") != os.getpid():
            raise RelayError("local relay handle was made in another process; use shm or inline across processes")
        with _lock:
            entry = _objects.pop(metadata.get("handle"), None)  # type: ignore[arg-type]
        if entry is None:
            raise RelayError(f"local relay handle {metadata.get('handle')!r} is unknown or already taken")
        return entry[1]

    def cleanup(self, request_id: str) -> None:
        with _lock:
            for handle in [h for h, (rid, _) in _objects.items() if rid == request_id]:
                del _objects[handle]

    def close(self) -> None:
        return None

    def slots_in_use(self) -> int:
        with _lock:
            return len(_objects)


def make_sender(run_id: str, owner: str, options: dict[str, Any]) -> LocalRelay:
    return LocalRelay()


def make_receiver(run_id: str, owner: str, zero_copy: bool) -> LocalRelay:
    return LocalRelay()
