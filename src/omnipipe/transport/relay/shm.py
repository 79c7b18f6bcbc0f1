"""Shared-memory relay: one reusable pool of fixed-size slots per sender, credits freed by the receiver.

Layout of a pool segment: a header of ``num_slots`` records ``(state, generation)`` (two uint64 each), padded to a
page, then the slots. The sender takes a free slot (a credit), copies the payload in, marks it FULL and sends the
metadata over the control plane. The receiver copies the bytes out (into a reused, already-faulted buffer:
``recv_buffers.py``, which also states who owns it) and marks the slot FREE again: that is its acknowledgement,
and the sender reuses the slot on its next put. A payload larger than a slot gets a one-off segment of its own with
the same one-slot layout, unlinked by the sender once the receiver has freed it. Credits, generations and
back-pressure are the shared slot pool's (``slot_pool.py``); this module owns the segments and their header words.

Segments are files under /dev/shm named ``omnipipe-{run_id}-{owner}-...`` so the engine can sweep everything an
owner left behind if that process is killed. Only the sender creates and unlinks; receivers only map.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np

from omnipipe.transport.relay.base import Relay, RelayError
from omnipipe.transport.relay.recv_buffers import RecvBufferPool
from omnipipe.transport.relay.slot_pool import SlotLease, SlotPool

logger = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
SEGMENT_PREFIX = "omnipipe-"
_HEADER_RECORD_WORDS = 2
_PAGE_BYTES = 4096
_FREE, _FULL = 0, 1
DEFAULT_SLOT_BYTES = 4 << 20
DEFAULT_NUM_SLOTS = 8
_instances = itertools.count()


def segment_prefix(run_id: str, owner: str | None = None) -> str:
    return f"{SEGMENT_PREFIX}{run_id}-" + (f"{owner}-" if owner else "")


def sweep_segments(prefix: str) -> list[str]:
    """Unlink every segment whose name starts with ``prefix`` (after a crash, or at shutdown)."""
    removed: list[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed


class _Segment:
    """A mapped /dev/shm file holding a header of slot records and the slots."""

    def __init__(self, name: str, num_slots: int, slot_bytes: int, create: bool) -> None:
        self.name = name
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        header = num_slots * _HEADER_RECORD_WORDS * 8
        self.data_offset = (header + _PAGE_BYTES - 1) // _PAGE_BYTES * _PAGE_BYTES
        self.size = self.data_offset + num_slots * slot_bytes
        path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, self.size)
            elif os.fstat(fd).st_size < self.size:
                raise RelayError(f"shm segment {name} is smaller than its metadata says")
            self.mm = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self.header = np.frombuffer(self.mm, dtype=np.uint64, count=num_slots * _HEADER_RECORD_WORDS).reshape(
            num_slots, _HEADER_RECORD_WORDS
        )

    def slot_view(self, slot: int, nbytes: int) -> memoryview:
        start = self.data_offset + slot * self.slot_bytes
        return memoryview(self.mm)[start : start + nbytes]

    def close(self) -> None:
        self.header = None  # type: ignore[assignment]
        with contextlib.suppress(BufferError):  # a view is still alive; the mapping goes when it does
            self.mm.close()


class _SegmentSlots(SlotPool[_Segment]):
    """A sender's slots in /dev/shm: a pool segment made once, a one-off segment per oversized payload. A receiver
    acknowledges a slot by marking it FREE in the segment's header (``_release_slot``)."""

    def __init__(self, prefix: str, num_slots: int, slot_bytes: int, acquire_timeout_s: float,
                 lock: threading.Lock) -> None:
        super().__init__(lock, num_slots, slot_bytes, acquire_timeout_s, "shm")
        self.prefix = prefix
        self._one_off_count = 0

    def new_block(self, num_slots: int, slot_bytes: int, one_off: bool) -> _Segment:
        if not one_off:
            return _Segment(f"{self.prefix}pool", num_slots, slot_bytes, create=True)
        self._one_off_count += 1
        return _Segment(f"{self.prefix}big{self._one_off_count}", num_slots, slot_bytes, create=True)

    def acknowledged(self, lease: SlotLease[_Segment]) -> bool:
        return bool(lease.block.header[lease.slot, 0] == _FREE)

    def clear_slot(self, block: _Segment, slot: int) -> None:
        block.header[slot, 0] = _FREE

    def drop_block(self, block: _Segment) -> None:
        block.close()
        _unlink(block.name)

    def exhausted_message(self) -> str:
        return (f"shm relay pool exhausted: {self.num_slots} slots held for {self.acquire_timeout_s:.0f} s "
                "without the receiver freeing one")


class ShmRelay(Relay):
    name = "shm"

    def __init__(
        self,
        run_id: str,
        owner: str,
        slot_bytes: int = DEFAULT_SLOT_BYTES,
        num_slots: int = DEFAULT_NUM_SLOTS,
        acquire_timeout_s: float = 30.0,
        zero_copy: bool = False,
    ) -> None:
        self.prefix = f"{segment_prefix(run_id, owner)}{os.getpid()}.{next(_instances)}-"
        self.zero_copy = zero_copy
        self.slot_bytes = slot_bytes
        self.num_slots = num_slots
        self.acquire_timeout_s = acquire_timeout_s
        self._lock = threading.Lock()
        self._slots = _SegmentSlots(self.prefix, num_slots, slot_bytes, acquire_timeout_s, self._lock)  # sender
        self._mapped: dict[str, _Segment] = {}  # receiver side
        # a copying receiver copies into these (recv_buffers.py: reused only once no caller holds one)
        self._recv_buffers = RecvBufferPool()
        self._closed = False

    # ---------------------------------------------------------------- sender
    def put(self, pieces: list[tuple[int, memoryview]], nbytes: int, request_id: str) -> dict[str, Any]:
        with self._lock:
            if self._closed:
                raise RelayError("relay is closed")
            lease = self._slots.take(nbytes, request_id)
            lease.write(pieces, nbytes)
            segment, slot = lease.block, lease.slot
            segment.header[slot, 1] = lease.generation
            segment.header[slot, 0] = _FULL
            return {
                "segment": segment.name,
                "slot": slot,
                "num_slots": segment.num_slots,
                "slot_bytes": segment.slot_bytes,
                "generation": lease.generation,
                "one_off": lease.one_off,
            }

    def cleanup(self, request_id: str) -> None:
        self._slots.release_request(request_id)

    def slots_in_use(self) -> int:
        return self._slots.in_use()

    # -------------------------------------------------------------- receiver
    def get(self, metadata: dict[str, Any], nbytes: int, request_id: str) -> Any:
        """Return the bytes of a slot. Copying (default): a private copy, the slot is freed at once.
        Zero-copy: a read-only uint8 array over the slot itself, freed when the last view of it is dropped."""
        try:
            name = str(metadata["segment"])
            slot = int(metadata["slot"])
            num_slots = int(metadata["num_slots"])
            slot_bytes = int(metadata["slot_bytes"])
            generation = int(metadata["generation"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RelayError(f"malformed shm relay metadata: {exc!r}") from exc
        if not name.startswith(SEGMENT_PREFIX) or "/" in name or not 0 <= slot < num_slots or nbytes > slot_bytes:
            raise RelayError(f"shm relay metadata out of range: {metadata!r}")
        one_off = bool(metadata.get("one_off", False))
        with self._lock:
            segment = self._mapped.get(name)
            if segment is None:
                try:
                    segment = _Segment(name, num_slots, slot_bytes, create=False)
                except FileNotFoundError as exc:
                    raise RelayError(f"shm segment {name} is gone (its sender exited)") from exc
                if not one_off:
                    self._mapped[name] = segment
            if segment.header[slot, 0] != _FULL or segment.header[slot, 1] != generation:
                if one_off:
                    segment.close()
                raise RelayError(f"shm slot {name}[{slot}] was released before it was read")
            start = segment.data_offset + slot * segment.slot_bytes
            if self.zero_copy:
                view = np.frombuffer(segment.mm, dtype=np.uint8, count=nbytes, offset=start)
                view.flags.writeable = False
                weakref.finalize(view, _release_slot, segment, slot, generation, one_off)
                return view
            out = self._recv_buffers.take(nbytes)  # reused only once nothing made from it is alive
            np.copyto(out, np.frombuffer(segment.mm, dtype=np.uint8, count=nbytes, offset=start))
            reused = segment.header[slot, 1] != generation
            _release_slot(segment, slot, generation, one_off)
            if reused:
                raise RelayError(f"shm slot {name}[{slot}] was reused while it was read")
            return out

    # ---------------------------------------------------------------- common
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._slots.close()
            for segment in self._mapped.values():
                segment.close()
            self._mapped.clear()
            self._recv_buffers.clear()


def _release_slot(segment: _Segment, slot: int, generation: int, one_off: bool) -> None:
    """The receiver's acknowledgement: the sender may reuse the slot (a one-off mapping is dropped)."""
    header = segment.header
    if header is not None and header[slot, 1] == generation:
        header[slot, 0] = _FREE
    if one_off:
        segment.close()


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, name))


def make_sender(run_id: str, owner: str, options: dict[str, Any]) -> ShmRelay:
    """A sender's pool; ``options``: ``slot_bytes``, ``num_slots``."""
    return ShmRelay(run_id, owner, slot_bytes=int(options.get("slot_bytes", DEFAULT_SLOT_BYTES)),
                    num_slots=int(options.get("num_slots", DEFAULT_NUM_SLOTS)))


def make_receiver(run_id: str, owner: str, zero_copy: bool) -> ShmRelay:
    """A receiver only maps the senders' segments; zero-copy reads free a slot when its view is dropped."""
    return ShmRelay(run_id, owner, zero_copy=zero_copy)
