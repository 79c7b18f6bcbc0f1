"""The relay interface: put / get / cleanup / close. Backends own transport only."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class RelayError(RuntimeError):
    """A relay transfer failed (pool exhausted, segment gone, metadata malformed)."""


class Relay(ABC):
    """Moves one flat buffer (a list of byte pieces at given offsets) from a sender to a receiver."""

    name: str = ""
    # False: tensors are copied to host memory and travel as bytes (put/get). True: the relay moves tensors as
    # objects (put_objects/get_objects), so the payload codec keeps each tensor's device and storage.
    keeps_device: bool = False

    @abstractmethod
    def put(self, pieces: list[tuple[int, memoryview]], nbytes: int, request_id: str) -> dict[str, Any]:
        """Write ``pieces`` (offset, bytes) into a buffer of ``nbytes``; return the metadata a receiver needs to
        fetch it (it rides in the control message). The buffer is freed when the receiver acknowledges it."""

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

    def put_objects(self, objects: list[Any], request_id: str) -> dict[str, Any]:
        """Hand over tensors as objects (``keeps_device`` relays only); return the receiver's metadata."""
        raise RelayError(f"relay {self.name!r} moves bytes, not objects")

    def get_objects(self, metadata: dict[str, Any], request_id: str) -> list[Any]:
        """Take the objects of one ``put_objects`` (``keeps_device`` relays only)."""
        raise RelayError(f"relay {self.name!r} moves bytes, not objects")

    def slots_in_use(self) -> int:
        return 0
