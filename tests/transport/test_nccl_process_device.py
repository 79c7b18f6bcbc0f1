"""An nccl relay uses its process's device (a stage's own GPU) from any thread, not the thread's current device
(CUDA's current device is per thread: a chunk thread's is cuda:0 unless set)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnipipe.transport.relay import torch_dist
from omnipipe.transport.relay.torch_dist import TorchDistRelay


@pytest.fixture
def process_device() -> object:
    yield torch_dist.set_process_device
    torch_dist.set_process_device(None)


def test_a_put_without_cuda_tensors_stages_through_the_stage_gpu(process_device, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: pytest.fail("asked the thread's current device"))
    torch_dist.set_process_device("cuda:1")
    relay = TorchDistRelay("nccl")
    assert relay._wire_device([np.zeros(3, np.float32)]) == torch.device("cuda", 1)
    assert torch_dist._nccl_device(torch) == torch.device("cuda", 1)  # where reads land
    assert TorchDistRelay("gloo")._wire_device([np.zeros(3)]) == torch.device("cpu")
