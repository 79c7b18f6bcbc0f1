"""Copying receives reuse their buffers, and a buffer whose data a caller still holds is never overwritten."""

from __future__ import annotations

import numpy as np

from omnipipe.transport.relay.recv_buffers import RecvBufferPool
from omnipipe.transport.relay.shm import ShmRelay
from omnipipe.transport.relay_io import read_payload, write_payload

MiB = 1 << 20


def test_a_dropped_buffer_is_reused_and_a_held_one_is_not() -> None:
    pool = RecvBufferPool(min_bytes=MiB, max_bytes=64 * MiB)
    first = pool.take(3 * MiB)
    first_base = id(first.base)  # an id, not a reference: holding the base would keep it in use
    assert first.nbytes == 3 * MiB and first.flags.writeable
    second = pool.take(3 * MiB)  # the first is still held: another buffer
    assert id(second.base) != first_base
    assert pool.in_use() == 2
    del first
    third = pool.take(2 * MiB + 1)  # the same 4 MiB class; the first one's buffer is free again
    assert id(third.base) == first_base
    assert pool.pooled_bytes == 8 * MiB


def test_anything_made_from_a_buffer_keeps_it_out_of_the_pool() -> None:
    pool = RecvBufferPool(min_bytes=MiB, max_bytes=64 * MiB)
    out = pool.take(MiB)
    decoded = np.frombuffer(memoryview(out)[16:], dtype=np.float32)[::2]  # a view of a view, as the codec makes
    base = id(out.base)
    del out
    assert pool.in_use() == 1
    assert id(pool.take(MiB).base) != base
    del decoded
    assert pool.in_use() == 0


def test_small_sizes_and_a_full_pool_get_fresh_arrays() -> None:
    pool = RecvBufferPool(min_bytes=MiB, max_bytes=2 * MiB)
    small = pool.take(1000)
    assert small.base is None and pool.pooled_bytes == 0
    held = [pool.take(MiB), pool.take(MiB)]
    extra = pool.take(MiB)  # both pooled buffers held, no room for a third
    assert extra.base is None and pool.pooled_bytes == 2 * MiB
    assert all(h.base is not None for h in held)


def test_shm_copying_reads_keep_what_the_caller_holds() -> None:
    """The ownership rule end to end: payloads read one after another through the same pooled class; the ones
    still held keep their values, and memory comes back to the pool once they are dropped."""
    sender, receiver = ShmRelay("rxbuf", "tx", slot_bytes=8 * MiB, num_slots=2), ShmRelay("rxbuf", "rx")
    try:
        held = []
        for i in range(4):
            data = {"x": np.full(MiB // 2, i, np.float32), "y": np.arange(MiB // 4, dtype=np.float32)}  # 3 MiB
            out = read_payload(write_payload(data, sender, f"r{i}", 0), {"shm": receiver}, f"r{i}")
            if i % 2 == 0:
                held.append((i, out))
        for i, out in held:
            assert (out["x"] == i).all()
            np.testing.assert_array_equal(out["y"], np.arange(MiB // 4, dtype=np.float32))
        pool = receiver._recv_buffers
        assert pool.in_use() == 2 and pool.pooled_bytes == 3 * 4 * MiB  # two held, one reused by r1 and r3
        held.clear()
        del out  # the loop variable held the last one
        assert pool.in_use() == 0
    finally:
        sender.close()
        receiver.close()
