"""A sender's slot pool, shared by the relays that copy into memory of their own (``shm``, ``mooncake``).

One block of ``num_slots`` fixed slots is the sender's credits. ``take`` hands out a free slot (a payload larger than
a slot gets a one-off block of its own, one slot long) stamped with a fresh generation, and holds it until a
receiver acknowledges that generation; the pool takes acknowledged slots back on its next ``take`` (or in
``in_use``/``release_request``), and ``release_request`` drops what a finished or aborted request still holds. When
every credit is out, ``take`` waits (back-pressure) up to ``acquire_timeout_s`` for a receiver, then raises.

What a block is, how a receiver acknowledges a slot, and how a block is given back belong to the transport: a
relay subclasses ``SlotPool`` with those hooks. ``take`` runs under the relay's lock (passed in) and lets go of it
while it waits; ``release_request`` and ``in_use`` take that lock themselves.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from omnipipe.transport.relay.base import RelayError


class SlotBlock(Protocol):
    """Memory laid out as ``num_slots`` slots of ``slot_bytes``."""

    num_slots: int
    slot_bytes: int

    def slot_view(self, slot: int, nbytes: int) -> memoryview:
        """The first ``nbytes`` of ``slot``, writable."""


BlockT = TypeVar("BlockT", bound=SlotBlock)


@dataclass
class SlotLease(Generic[BlockT]):
    """One slot a sender holds for ``request_id`` until a receiver acknowledges ``generation``."""

    block: BlockT
    slot: int
    generation: int
    request_id: str
    one_off: bool  # a block of its own (the payload was larger than a slot), dropped once acknowledged

    def write(self, pieces: list[tuple[int, memoryview]], nbytes: int) -> None:
        """Copy ``pieces`` (offset, bytes) into the first ``nbytes`` of the slot."""
        target = self.block.slot_view(self.slot, nbytes)
        for offset, piece in pieces:
            target[offset : offset + len(piece)] = piece
        del target  # no view may outlive the write (a mapping closes only once its views are gone)


class SlotPool(ABC, Generic[BlockT]):
    """Credits, leases and generations of one sender; the transport supplies the blocks and acknowledgements."""

    def __init__(self, lock: threading.Lock, num_slots: int, slot_bytes: int, acquire_timeout_s: float,
                 relay_name: str) -> None:
        self.lock = lock
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.acquire_timeout_s = acquire_timeout_s
        self.relay_name = relay_name
        self.pool: BlockT | None = None  # made on the first put that fits a slot
        self.free: list[int] = []
        self.leases: dict[int, SlotLease[BlockT]] = {}  # generation -> what a receiver has not acknowledged
        self.generation = 0
        self.closed = False

    # ------------------------------------------------------------------ transport hooks
    @abstractmethod
    def new_block(self, num_slots: int, slot_bytes: int, one_off: bool) -> BlockT:
        """Memory for the pool (``one_off`` False, made once) or for one oversized payload."""

    @abstractmethod
    def acknowledged(self, lease: SlotLease[BlockT]) -> bool:
        """Whether a receiver has acknowledged ``lease`` (read from the slot's header record)."""

    @abstractmethod
    def clear_slot(self, block: BlockT, slot: int) -> None:
        """Mark a pool slot taken back in its header record (a late reader then sees it released)."""

    @abstractmethod
    def drop_block(self, block: BlockT) -> None:
        """Give a block's memory back (a one-off block once acknowledged, the pool at close)."""

    @abstractmethod
    def exhausted_message(self) -> str:
        """The error when every credit stayed out for ``acquire_timeout_s``."""

    # ------------------------------------------------------------------ sender
    def take(self, nbytes: int, request_id: str) -> SlotLease[BlockT]:
        """A slot for ``nbytes`` held for ``request_id`` under a fresh generation (a one-off block if it does not
        fit a slot); waits for a credit when all are out."""
        self.reap()
        if nbytes > self.slot_bytes:
            block, slot, one_off = self.new_block(1, nbytes, True), 0, True
        else:
            (block, slot), one_off = self._acquire(), False
        self.generation += 1
        lease = SlotLease(block, slot, self.generation, request_id, one_off)
        self.leases[lease.generation] = lease
        return lease

    def _acquire(self) -> tuple[BlockT, int]:
        if self.pool is None:
            self.pool = self.new_block(self.num_slots, self.slot_bytes, False)
            self.free = list(range(self.num_slots))
        if not self.free:
            # back-pressure only: every credit is out; wait for a receiver to acknowledge one
            deadline = time.monotonic() + self.acquire_timeout_s
            pause_s = 50e-6
            while not self.free:
                if time.monotonic() > deadline:
                    raise RelayError(self.exhausted_message())
                self.lock.release()
                try:
                    time.sleep(pause_s)
                finally:
                    self.lock.acquire()
                if self.closed:
                    raise RelayError(f"{self.relay_name} relay closed while waiting for a free slot")
                pause_s = min(pause_s * 2, 5e-3)
                self.reap()
        assert self.pool is not None
        return self.pool, self.free.pop()

    def reap(self) -> None:
        """Take back every slot whose current generation a receiver has acknowledged."""
        for lease in list(self.leases.values()):
            if self.acknowledged(lease):
                self._release(lease)

    def _release(self, lease: SlotLease[BlockT]) -> None:
        del self.leases[lease.generation]
        if lease.one_off:
            self.drop_block(lease.block)
        else:
            self.clear_slot(lease.block, lease.slot)
            self.free.append(lease.slot)

    def release_request(self, request_id: str) -> None:
        """Drop every slot still held for ``request_id`` (finish or abort); a late read of one fails cleanly.
        Takes the relay's lock; nothing to do once the pool is closed."""
        with self.lock:
            if self.closed:
                return
            self.reap()
            for lease in list(self.leases.values()):
                if lease.request_id == request_id:
                    self._release(lease)

    def in_use(self) -> int:
        """How many slots receivers have not acknowledged yet (0 once closed). Takes the relay's lock."""
        with self.lock:
            if self.closed:
                return 0
            self.reap()
            return len(self.leases)

    def close(self) -> None:
        """Drop every block; a ``take`` waiting for a credit raises."""
        self.closed = True
        for lease in self.leases.values():
            if lease.one_off:
                self.drop_block(lease.block)
        self.leases.clear()
        if self.pool is not None:
            self.drop_block(self.pool)
            self.pool = None
        self.free.clear()
