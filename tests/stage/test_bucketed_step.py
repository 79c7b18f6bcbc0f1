"""A bucketed decode step: the batch padded to its bucket's rows and the history to a fixed width, so the step's
shapes stay the same from one step to the next whatever the batch and the histories. On the CPU this is shown the
way a CUDA graph would need it: the tiny Qwen3-Omni thinker's decode step through the paged cache and the paged
attention compiles with ``torch.compile(fullgraph=True, dynamic=False)`` into one graph that serves batches of 3 and
4 over growing histories, with the same hidden states as the eager, unpadded step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnipipe.stage.kv_cache import PagedKVCache
from omnipipe.stage.runner import RunnerContext

BUCKET, WIDTH, PROMPT = 4, 64, 20


def test_padding_rows_read_zeros_write_the_scratch_row_and_leave_the_requests_alone() -> None:
    kv = PagedKVCache(num_layers=1, kv_heads=1, head_dim=2, num_blocks=4, block_tokens=4)
    kv.reserve("a", 6)
    kv.bind(["a"], 3)
    kv.update(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2), 0)
    kv.bind(["a"], 1, rows=3, width=8)
    keys, _ = kv.update(torch.full((3, 1, 1, 2), 2.0), torch.full((3, 1, 1, 2), 2.0), 0)
    assert keys.shape == (3, 1, 8, 2)
    assert keys[0, 0, :4, 0].tolist() == [1.0, 1.0, 1.0, 2.0] and float(keys[1:].abs().sum()) == 0.0
    assert float(kv.keys[0][kv.pad_slot].abs().sum()) == 0.0  # the padding row stays zero
    assert kv.keys[0][kv.scratch_slot].view(-1).tolist() == [2.0, 2.0]
    assert kv.length("a") == 4
    assert torch.isfinite(kv.attention_mask()).any(dim=-1).all()  # every row sees a key: no NaN softmax
    with pytest.raises(ValueError, match="holds not the 8"):
        kv.bind(["a"], 1, width=4)
    with pytest.raises(ValueError, match="bucket of 0 rows"):
        kv.bind(["a"], 1, rows=0)
    assert kv.length("a") == 4  # a refused step changed nothing


@pytest.mark.slow
def test_one_compiled_graph_serves_a_bucket_and_equals_the_eager_step(tmp_path: Path) -> None:
    from omnipipe.models.qwen3_omni.runners.thinker import Qwen3ThinkerRunner
    from omnipipe.models.qwen3_omni.weights.tiny import write_tiny_checkpoint

    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt", seed=0)
    runner = Qwen3ThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {
        "model": str(checkpoint), "prefix_caching": False, "paged_attention": "reference"}))
    runner.load()
    decoder, kv = runner.decoder, runner.kv
    hidden = decoder.config.hidden_size
    torch.manual_seed(0)
    keys = [f"r{i}" for i in range(BUCKET)]
    with torch.inference_mode():
        for index, key in enumerate(keys):  # prompts of different lengths
            tokens = PROMPT + 3 * index
            kv.reserve(key, WIDTH)
            kv.bind([key], tokens)
            decoder(inputs_embeds=torch.randn(1, tokens, hidden),
                    position_ids=torch.arange(tokens).view(1, 1, -1).expand(4, 1, tokens), **kv.step_inputs())

    def step(embeds: torch.Tensor, positions: torch.Tensor, inputs: dict) -> torch.Tensor:
        return decoder(inputs_embeds=embeds, position_ids=positions, **inputs).last_hidden_state

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    frames = torch._dynamo.utils.counters["stats"]
    before = frames["unique_graphs"]
    with torch.inference_mode():
        for batch in (4, 3, 4, 3, 3, 4):  # the bucket's batches; every row's history grows a token a step
            members = keys[:batch]
            starts = [kv.length(key) for key in members]
            embeds = torch.randn(batch, 1, hidden)
            positions = torch.tensor(starts + [0] * (BUCKET - batch)).view(1, -1, 1).expand(4, -1, 1)
            kv.bind(members, 1, rows=BUCKET, width=WIDTH)
            padded = torch.cat([embeds, torch.zeros(BUCKET - batch, 1, hidden)])
            got = compiled(padded, positions, kv.step_inputs())[:batch]
            for key, start in zip(members, starts, strict=True):
                kv.set_length(key, start)
            kv.bind(members, 1)  # the same step, eager and unpadded
            want = step(embeds, positions[:, :batch], kv.step_inputs())
            assert float((got - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max()))
    assert frames["unique_graphs"] - before == 1  # one graph for the whole bucket
