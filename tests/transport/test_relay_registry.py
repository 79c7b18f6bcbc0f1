"""One registry builds both ends of every relay backend; a keeps_device relay hands tensors over untouched."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from omnipipe.config.deploy_config import DeployConfig
from omnipipe.transport.relay import mooncake, shm, torch_dist
from omnipipe.transport.relay.registry import BACKENDS, RELAY_BACKENDS, create_receivers, create_relay
from omnipipe.transport.relay_io import read_payload, write_payload
from tests.conftest import shm_segments


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_registry_builds_both_ends_and_they_talk(backend: str) -> None:
    if backend == "mooncake" and importlib.util.find_spec("mooncake") is None:
        pytest.skip("the mooncake relay needs the Mooncake transfer engine: pip install 'omnipipe[mooncake]'")
    if backend == "nccl":  # both ends in one process would be two NCCL ranks on one GPU, which NCCL refuses
        pytest.skip("nccl needs its two ends on two GPUs: tests/transport/test_torch_dist_relay.py covers it")
    run_id = f"reg{backend}"
    sender = create_relay(backend, run_id=run_id, owner="tx", options={"shm": {"slot_bytes": 1 << 16}})
    receivers = create_receivers(run_id, "rx")
    assert set(receivers) == set(BACKENDS) and sender.name == backend
    body = {"audio": np.arange(5000, dtype=np.float32), "tokens": torch.arange(7), "nested": [{"n": 1}]}
    try:
        payload = write_payload(body, sender, "r1", inline_threshold_bytes=0)
        assert payload.backend == backend
        restored = read_payload(payload, receivers, "r1")
        np.testing.assert_array_equal(restored["audio"], body["audio"])
        assert torch.equal(restored["tokens"], body["tokens"]) and restored["nested"] == [{"n": 1}]
        assert sender.slots_in_use() == 0
    finally:
        sender.close()
        for receiver in receivers.values():
            receiver.close()
    assert shm_segments(run_id) == []


def test_relay_options_are_keyed_by_backend_and_read_by_its_factory() -> None:
    options = DeployConfig().relay_options()
    torch_dist_options = {"host": torch_dist.DEFAULT_HOST, "timeout_s": torch_dist.DEFAULT_TIMEOUT_S,
                          "max_pending": torch_dist.DEFAULT_MAX_PENDING}
    assert options == {"shm": {"slot_bytes": shm.DEFAULT_SLOT_BYTES, "num_slots": shm.DEFAULT_NUM_SLOTS},
                       "mooncake": {"slot_bytes": mooncake.DEFAULT_SLOT_BYTES, "num_slots": mooncake.DEFAULT_NUM_SLOTS,
                                    "protocol": "tcp", "host": "127.0.0.1"},
                       "gloo": torch_dist_options, "nccl": torch_dist_options}
    relay = create_relay("shm", run_id="opts", owner="tx", options={"shm": {"slot_bytes": 8192, "num_slots": 3}})
    try:
        assert (relay.slot_bytes, relay.num_slots) == (8192, 3)
    finally:
        relay.close()
    assert "local" not in RELAY_BACKENDS  # same-process only: a deploy file cannot put it between processes


def test_a_keeps_device_relay_hands_tensors_over_without_a_copy() -> None:
    sender, receivers = create_relay("local", run_id="dev", owner="tx"), create_receivers("dev", "rx")
    assert sender.keeps_device and not receivers["shm"].keeps_device and not receivers["inline"].keeps_device
    tensor = torch.arange(1024, dtype=torch.float32)
    array = np.ones(16, np.int16)
    payload = write_payload({"hidden": tensor, "codes": (array,)}, sender, "r1", inline_threshold_bytes=1 << 20)
    assert payload.nbytes == 0 and payload.data is None
    restored = read_payload(payload, receivers, "r1")
    assert restored["hidden"].data_ptr() == tensor.data_ptr() and restored["hidden"].device == tensor.device
    assert restored["codes"][0] is array  # tuples come back as lists, as through every other relay


def test_a_byte_relay_copies_tensors_to_host_memory() -> None:
    tensor = torch.arange(1024, dtype=torch.float32)
    payload = write_payload({"hidden": tensor}, create_relay("inline", run_id="b", owner="tx"), "r1", 0)
    restored = read_payload(payload, create_receivers("b", "rx"), "r1")
    assert torch.equal(restored["hidden"], tensor) and restored["hidden"].data_ptr() != tensor.data_ptr()
