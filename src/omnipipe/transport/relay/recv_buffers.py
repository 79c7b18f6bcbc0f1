"""Receive buffers a copying reader reuses, so a large payload is copied into memory already faulted in.

A fresh ``np.empty`` of tens of MiB is a new mapping: the copy into it page-faults every page (and freeing it
unmaps them again), which made the copying shm receive about a third of memcpy's speed at 64 MiB. A pool keeps
a few buffers per size class (powers of two from ``min_bytes``) and hands out a view of one, ``nbytes`` long.

Ownership rule: a buffer handed out belongs to whoever holds anything made from it (the view, arrays decoded over
it, slices of those: each keeps a reference to the buffer). The pool reuses a buffer only when it holds the last
reference to it itself, so nothing a caller can still reach is ever overwritten; a caller that keeps its data just
keeps the buffer out of the pool, and the next receive of that size gets another one (or a fresh array once
``max_bytes`` is pooled). ``on_new`` is called with each buffer the pool creates, before it is handed out (the
mooncake relay registers it with its transfer engine there, once). Only memory reached without a Python reference
(a raw pointer taken from the array and kept after the array is dropped) could see a later payload: don't.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import numpy as np

DEFAULT_MIN_BYTES = 1 << 20  # smaller payloads: a fresh array is cheap (malloc's own free lists serve it)
DEFAULT_MAX_BYTES = 256 << 20  # per pool: what the pooled buffers may hold in all
_POOL_REFS = 3  # sys.getrefcount of a pooled buffer no caller holds: the pool's list, the loop variable, the argument


class RecvBufferPool:
    def __init__(self, min_bytes: int = DEFAULT_MIN_BYTES, max_bytes: int = DEFAULT_MAX_BYTES,
                 on_new: Callable[[np.ndarray], None] | None = None) -> None:
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.on_new = on_new
        self._classes: dict[int, list[np.ndarray]] = {}  # class size -> its buffers
        self._pooled_bytes = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A writable uint8 array of ``nbytes`` that no one else can reach: a pooled buffer no caller holds any
        more, a new pooled one, or (small sizes, or the pool full) a fresh array."""
        if nbytes < self.min_bytes:
            return np.empty(nbytes, dtype=np.uint8)
        size = 1 << (nbytes - 1).bit_length()
        with self._lock:
            buffers = self._classes.setdefault(size, [])
            for buffer in buffers:
                if sys.getrefcount(buffer) <= _POOL_REFS:  # nothing made from it is alive
                    return buffer[:nbytes]
            if self._pooled_bytes + size > self.max_bytes:
                return np.empty(nbytes, dtype=np.uint8)
            buffer = np.empty(size, dtype=np.uint8)
            if self.on_new is not None:
                self.on_new(buffer)
            buffers.append(buffer)
            self._pooled_bytes += size
            return buffer[:nbytes]

    def in_use(self) -> int:
        """How many pooled buffers a caller still holds."""
        with self._lock:
            return sum(1 for buffers in self._classes.values() for b in buffers if sys.getrefcount(b) > _POOL_REFS)

    @property
    def pooled_bytes(self) -> int:
        return self._pooled_bytes

    def clear(self) -> None:
        """Forget every buffer (those still held stay valid: they are their holders' now)."""
        with self._lock:
            self._classes.clear()
            self._pooled_bytes = 0
