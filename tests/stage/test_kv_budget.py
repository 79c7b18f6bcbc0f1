"""The KV budget of a decoder stage on a GPU: its share of the device less its weights and one step's activations,
and never more than the device has free (other stages on the same GPU keep what they hold). The figures are given,
not read from a device, so the reckoning is checked on any machine."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from omnipipe.models.qwen3_omni.weights.tiny import RELEASED
from omnipipe.stage.checkpoint_options import gpu_kv_budget
from omnipipe.stage.kv_cache import step_activation_bytes

GIB = 1 << 30


def test_the_budget_keeps_one_steps_activations_inside_the_share() -> None:
    weights, activations = 12 * GIB, 2 * GIB
    budget = gpu_kv_budget("cuda:0", 140 * GIB, 0.12, weights, free=100 * GIB, activation_bytes=activations)
    assert budget.bytes + weights + activations == int(140 * GIB * 0.12)
    assert budget.reckoning == ("0.12 x 140.00 GiB of cuda:0 = 16.80 GiB, less 12.00 GiB of weights and 2.00 GiB kept "
                                "for one step's activations")


def test_the_budget_never_takes_what_other_processes_hold_on_the_device() -> None:
    budget = gpu_kv_budget("cuda:1", 140 * GIB, 0.9, 10 * GIB, free=30 * GIB, activation_bytes=2 * GIB)
    assert budget.bytes == 28 * GIB
    assert budget.reckoning.endswith("; only 30.00 GiB of the device is free (other processes hold the rest)")
    assert gpu_kv_budget("cuda:0", 80 * GIB, 0.1, 9 * GIB, 60 * GIB, 2 * GIB).bytes == 0  # the stage then refuses


def test_a_released_thinkers_step_needs_gigabytes_that_grow_with_rows_and_context() -> None:
    """Qwen3-Omni's released thinker at README's one-GPU layout (8 rows, 2048-token prefill pieces, its whole
    65536-token context): one layer's history gathered for every row is the bulk, about 1 GiB."""
    config = SimpleNamespace(**RELEASED["text"])
    eight = step_activation_bytes(config, torch.bfloat16, step_tokens=2048, rows=8, context=65536)
    history = 8 * 65536 * 4 * 128 * 2 * 2
    assert history < eight < 2 * history
    assert step_activation_bytes(config, torch.bfloat16, step_tokens=2048, rows=64, context=65536) > 5 * eight
    assert step_activation_bytes(config, torch.bfloat16, step_tokens=2048, rows=8, context=4096) < eight / 4
