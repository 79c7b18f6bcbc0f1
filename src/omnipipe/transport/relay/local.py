"""Local relay: same-process object handoff for colocated stages, by reference.

Contract: the receiver treats what it gets as read-only, and the sender does not mutate or reuse the object
after ``put``. Nothing is serialised; the control message carries only a handle. A handle taken by ``get`` is
gone; ``cleanup`` drops what a request left unread.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

from omnipipe.transport.relay.base import RelayError

_objects: dict[int, tuple[str, Any]] = {}
_lock = threading.Lock()
_counter = itertools.count(1)


class LocalRelay:
    """Not a byte relay: hands a Python object to a receiver in the same process."""

    name = "local"

    def put_object(self, obj: Any, request_id: str) -> dict[str, Any]:
        handle = next(_counter)
        with _lock:
            _objects[handle] = (request_id, obj)
        return {"handle": handle, "pid": os.getpid()}

    def get_object(self, metadata: dict[str, Any], request_id: str) -> Any:
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
