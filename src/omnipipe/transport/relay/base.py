"""The relay interface: put / get / cleanup / close with operation handles. Backends own transport only."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Any


class RelayError(RuntimeError):
    """A relay transfer failed (pool exhausted, segment gone, metadata malformed)."""


class RelayOperation:
    """Handle of one put or get. ``metadata`` goes into the control message; completion means the buffer is free."""

    def __init__(self, metadata: dict[str, Any], done: bool = False) -> None:
        self.metadata = metadata
        self._done = threading.Event()
        if done:
            self._done.set()

    def mark_done(self) -> None:
        self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait_for_completion(self, timeout_s: float | None = None) -> bool:
        return self._done.wait(timeout_s)


class Relay(ABC):
    """Moves one flat buffer (a list of byte pieces at given offsets) from a sender to a receiver."""

    name: str = ""

    @abstractmethod
    def put(self, pieces: list[tuple[int, memoryview]], nbytes: int, request_id: str) -> RelayOperation:
        """Write ``pieces`` (offset, bytes) into a buffer of ``nbytes``; return an operation with its metadata."""

    @abstractmethod
    def get(self, metadata: dict[str, Any], nbytes: int, request_id: str) -> Any:
        """Return the buffer described by ``metadata`` (any object with the buffer protocol) and acknowledge it,
        at once for a private copy, or when the returned buffer is released for a zero-copy view."""

    @abstractmethod
    def cleanup(self, request_id: str) -> None:
        """Release every buffer this end still holds for ``request_id`` (finish or abort)."""

    @abstractmethod
    def close(self) -> None:
        """Release everything; the relay is unusable afterwards."""

    def slots_in_use(self) -> int:
        return 0
