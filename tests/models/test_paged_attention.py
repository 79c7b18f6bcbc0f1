"""The paged-attention seam: a Qwen-Omni thinker whose option ``paged_attention`` names a kernel reads the KV
cache's blocks through it (the reference kernel, and one registered by a test by name, as a GPU kernel would be) and
gives the same tokens and talker hand-off as the dense path, batched, with prompts of several blocks; an unknown
kernel is refused naming the option."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnipipe.stage import paged_attention
from omnipipe.stage.runner import RunnerContext
from omnipipe.stage.runner_driver import Arrival, drive
from omnipipe.util.field_error import FieldError
from omnipipe.util.media import load_image
from tests.models import media_files

GREEDY = {"temperature": 0.0, "max_tokens": 8}
BOUND = 1e-5  # of the values' absmax: the same sums, gathered by another path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omnipipe.models.qwen3_omni.weights.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen3-omni") / "ckpt", seed=0)


def thinker(checkpoint: Path, **options: Any) -> Any:
    from omnipipe.models.qwen3_omni.runners.thinker import Qwen3ThinkerRunner

    loaded = Qwen3ThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {"model": str(checkpoint),
                                                                        "prefix_caching": False, **options}))
    loaded.load()
    return loaded


def _outputs(runner: Any) -> dict[str, tuple[list[int], torch.Tensor]]:
    """Each request's tokens and the talker's hidden states of its image (layer ``accept_hidden_layer``)."""
    rng = np.random.default_rng(2)
    image = np.asarray(load_image(media_files.png(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)), "image"))
    arrivals = [Arrival(f"r{i}", GREEDY, [{"text": f"question {i}: " + "tell me more " * 4 * i, "images": [image]}],
                        step=i) for i in range(5)]
    result = drive(runner, arrivals)
    assert not result.errors
    out = {}
    for arrival in arrivals:
        data = [o.data for o in result.outputs[arrival.request_id] if o.data]
        out[arrival.request_id] = ([d["token"] for d in data], data[0]["prompt"]["mm_hidden"])
    return out


@pytest.mark.models
def test_a_named_kernel_reads_the_blocks_and_changes_nothing(checkpoint: Path) -> None:
    calls: list[tuple[int, ...]] = []

    def counted(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, step: paged_attention.PagedStep,
                mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
        calls.append(tuple(step.block_tables.shape))
        # what a paged kernel reads: each row's blocks and length, consistent with the slots it would gather
        for row in range(step.block_tables.shape[0]):
            length = int(step.lengths[row])
            blocks = step.block_tables[row][: -(-length // step.block_tokens)].long()
            positions = (blocks[:, None] * step.block_tokens + torch.arange(step.block_tokens)).view(-1)[:length]
            assert torch.equal(positions, step.slots[row, :length])
        return paged_attention.reference_kernel(query, keys, values, step, mask, scaling)

    paged_attention.register_kernel("counted", counted)
    try:
        want = _outputs(thinker(checkpoint))
        for name in ("reference", "counted"):
            got = _outputs(thinker(checkpoint, paged_attention=name))
            for rid, (tokens, hidden) in want.items():
                assert got[rid][0] == tokens, (name, rid)
                assert hidden.numel() and got[rid][1].shape == hidden.shape
                assert float((got[rid][1] - hidden).abs().max()) <= BOUND * max(1.0, float(hidden.abs().max()))
        assert calls and max(shape[0] for shape in calls) > 1  # batched steps went through it
        assert max(shape[1] for shape in calls) > 2  # rows of several blocks
    finally:
        paged_attention.KERNELS.pop("counted", None)


def test_an_unknown_kernel_is_refused_naming_the_option(checkpoint: Path) -> None:
    with pytest.raises(FieldError) as refused:
        thinker(checkpoint, paged_attention="flashinfer")
    assert refused.value.field.endswith("paged_attention") and "reference" in str(refused.value)
