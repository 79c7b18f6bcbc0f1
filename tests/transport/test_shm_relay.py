"""The shm relay reuses one pool, frees slots on receipt, sweeps one-off segments, and never leaks."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from omnipipe.transport.relay.base import RelayError
from omnipipe.transport.relay.shm import ShmRelay, segment_prefix, sweep_segments
from omnipipe.transport.relay_io import read_payload, write_payload


def segments(run_id: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(segment_prefix(run_id)))


def test_pool_is_reused_not_one_segment_per_message() -> None:
    sender, receiver = ShmRelay("reuse", "tx", slot_bytes=1 << 20, num_slots=2), ShmRelay("reuse", "rx")
    try:
        for i in range(200):
            data = {"x": np.full(10_000, i, np.float32)}
            payload = write_payload(data, sender, f"r{i}", inline_threshold_bytes=0)
            out = read_payload(payload, {"shm": receiver}, f"r{i}")
            assert out["x"][0] == i
        assert len(segments("reuse")) == 1
        assert sender.slots_in_use() == 0
    finally:
        sender.close()
        receiver.close()
    assert segments("reuse") == []


def test_oversized_payload_gets_a_one_off_segment_that_is_removed_after_reading() -> None:
    sender, receiver = ShmRelay("big", "tx", slot_bytes=1 << 16, num_slots=2), ShmRelay("big", "rx")
    try:
        data = {"x": np.arange(1 << 18, dtype=np.float32)}
        payload = write_payload(data, sender, "r", inline_threshold_bytes=0)
        assert any("big" in s for s in segments("big"))
        np.testing.assert_array_equal(read_payload(payload, {"shm": receiver}, "r")["x"], data["x"])
        assert sender.slots_in_use() == 0  # reaping removes the one-off segment
        assert not [s for s in segments("big") if "-big" in s.split("-", 3)[-1]]
    finally:
        sender.close()
        receiver.close()
    assert segments("big") == []


def test_exhausted_pool_applies_back_pressure_then_errors() -> None:
    sender = ShmRelay("full", "tx", slot_bytes=4096, num_slots=2, acquire_timeout_s=0.2)
    try:
        for i in range(2):
            write_payload({"x": np.zeros(100, np.float32)}, sender, f"r{i}", 0)
        with pytest.raises(RelayError, match="pool exhausted"):
            write_payload({"x": np.zeros(100, np.float32)}, sender, "r2", 0)
        sender.cleanup("r0")  # abort frees the request's slots
        write_payload({"x": np.zeros(100, np.float32)}, sender, "r3", 0)
    finally:
        sender.close()


def test_a_put_waiting_for_a_credit_fails_when_the_relay_closes() -> None:
    sender = ShmRelay("closing", "tx", slot_bytes=4096, num_slots=1, acquire_timeout_s=30.0)
    errors: list[Exception] = []

    def second_put() -> None:
        try:
            write_payload({"x": np.zeros(100, np.float32)}, sender, "r1", 0)
        except RelayError as exc:
            errors.append(exc)

    write_payload({"x": np.zeros(100, np.float32)}, sender, "r0", 0)  # the only credit, never read
    waiting = threading.Thread(target=second_put)
    waiting.start()
    time.sleep(0.1)  # stays: the second put must be waiting for a credit when the relay closes
    assert waiting.is_alive()
    sender.close()
    waiting.join(5)
    assert not waiting.is_alive() and len(errors) == 1 and "closed while waiting" in str(errors[0])
    assert segments("closing") == []


def test_reading_a_released_slot_is_an_error_not_garbage() -> None:
    sender, receiver = ShmRelay("stale", "tx", slot_bytes=4096, num_slots=1), ShmRelay("stale", "rx")
    try:
        payload = write_payload({"x": np.ones(10, np.float32)}, sender, "r", 0)
        sender.cleanup("r")
        with pytest.raises(RelayError, match="released"):
            read_payload(payload, {"shm": receiver}, "r")
    finally:
        sender.close()
        receiver.close()


@pytest.mark.parametrize("metadata", [
    {},
    {"segment": "../../etc/passwd", "slot": 0, "num_slots": 1, "slot_bytes": 10, "generation": 1},
    {"segment": "omnipipe-x-missing", "slot": 0, "num_slots": 1, "slot_bytes": 10, "generation": 1},
    {"segment": "omnipipe-x", "slot": 5, "num_slots": 1, "slot_bytes": 10, "generation": 1},
    {"segment": "omnipipe-x", "slot": "a", "num_slots": 1, "slot_bytes": 10, "generation": 1},
])
def test_malformed_metadata_is_refused(metadata) -> None:
    receiver = ShmRelay("meta", "rx")
    with pytest.raises(RelayError):
        receiver.get(metadata, 8, "r")


def test_sweep_removes_what_a_killed_owner_left() -> None:
    sender = ShmRelay("sweep", "stage1-out", slot_bytes=4096, num_slots=1)
    write_payload({"x": np.ones(10, np.float32)}, sender, "r", 0)
    assert segments("sweep")
    removed = sweep_segments(segment_prefix("sweep", "stage1"))
    assert removed and segments("sweep") == []
    sender.close()


def test_zero_copy_receive_holds_the_slot_until_the_data_is_dropped() -> None:
    import gc

    sender, receiver = ShmRelay("zc", "tx", slot_bytes=1 << 20, num_slots=1), ShmRelay("zc", "rx", zero_copy=True)
    try:
        data = {"x": np.arange(1000, dtype=np.float32)}
        out = read_payload(write_payload(data, sender, "r", 0), {"shm": receiver}, "r")
        np.testing.assert_array_equal(out["x"], data["x"])
        assert not out["x"].flags.writeable  # read-only contract
        assert sender.slots_in_use() == 1  # still in use: the receiver reads it in place
        del out
        gc.collect()
        assert sender.slots_in_use() == 0
    finally:
        sender.close()
        receiver.close()
    assert segments("zc") == []
