"""The Qwen thinker -> talker hand-offs: per family one typed schema for the streamed and the whole edge, with
float32 torch tensors, which crosses the stage transport (payload codec over the shm relay) and reads back the same."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from omnipipe.models.qwen2_5_omni import handoff as qwen2_5
from omnipipe.models.qwen3_omni import handoff as qwen3
from omnipipe.transport.relay.shm import ShmRelay
from omnipipe.transport.relay_io import read_payload, write_payload

WIDTH = 6


def _random(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=generator)


def qwen3_step_data(tokens: int) -> list[dict[str, Any]]:
    """A Qwen3 thinker's step data: the prompt with its first token, then each token's embedding."""
    g = torch.Generator().manual_seed(3)
    prompt = qwen3.Qwen3TalkerPrompt(torch.arange(5), _random(g, 5, WIDTH), _random(g, 2, WIDTH),
                                     {"image_grid_thw": torch.tensor([[1, 2, 2]])})
    data = [{"token": 100 + i, "embed": _random(g, WIDTH)} for i in range(tokens)]
    data[0]["prompt"] = prompt.to_dict()
    return data


def qwen2_5_step_data(tokens: int) -> list[dict[str, Any]]:
    """A Qwen2.5 thinker's step data: the prompt with its first token, then each read token's embedding and hidden
    state."""
    g = torch.Generator().manual_seed(4)
    prompt = qwen2_5.Qwen25TalkerPrompt(
        torch.arange(5), torch.ones(5, dtype=torch.int64), _random(g, 5, WIDTH), _random(g, 5, WIDTH), 100,
        _random(g, WIDTH), _random(g, WIDTH), {"Chelsie": _random(g, WIDTH), "Ethan": _random(g, WIDTH)},
        {"audio_feature_lengths": torch.tensor([40])})
    data: list[dict[str, Any]] = [{"prompt": prompt.to_dict()}]
    data += [{"token": 101 + i, "embed": _random(g, WIDTH), "hidden": _random(g, WIDTH)} for i in range(tokens - 1)]
    return data


FAMILIES = {
    "qwen3": (qwen3.Qwen3TalkerHandoff, qwen3.thinker2talker, qwen3.thinker2talker_async_chunk, qwen3_step_data),
    "qwen2_5": (qwen2_5.Qwen25TalkerHandoff, qwen2_5.thinker2talker, qwen2_5.thinker2talker_async_chunk,
                qwen2_5_step_data),
}


def through_the_relay(chunk: dict[str, Any], run: str) -> dict[str, Any]:
    sender, receiver = ShmRelay(run, "tx", slot_bytes=1 << 16, num_slots=2), ShmRelay(run, "rx")
    try:
        return read_payload(write_payload(chunk, sender, "r", inline_threshold_bytes=0), {"shm": receiver}, "r")
    finally:
        sender.close()
        receiver.close()


def same(a: Any, b: Any) -> bool:
    """Two hand-offs (or their parts) hold the same values, tensors of the same dtype and shape included."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if hasattr(a, "__dataclass_fields__"):
        return type(a) is type(b) and all(same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return bool(a == b)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_hand_off_crosses_the_shm_relay_and_reads_back_the_same(family: str) -> None:
    handoff_type, whole_edge, _, step_data = FAMILIES[family]
    sent = handoff_type.from_chunk(whole_edge(step_data(4))[0])
    got = handoff_type.from_chunk(through_the_relay(sent.to_chunk(), f"handoff-{family}"))
    assert same(sent, got) and got.prompt is not None and got.done
    assert got.text_embeds.dtype == torch.float32 and got.text_embeds.shape[-1] == WIDTH


@pytest.mark.parametrize("family", FAMILIES)
def test_the_streamed_hand_offs_join_into_the_whole_one(family: str) -> None:
    handoff_type, whole_edge, streamed_edge, step_data = FAMILIES[family]
    data = step_data(4)
    state: dict[str, Any] = {}
    streamed = [handoff_type.from_chunk(chunk) for i, output in enumerate(data)
                for chunk in streamed_edge(state, output, i == len(data) - 1, None)]
    whole = handoff_type.from_chunk(whole_edge(data)[0])
    assert streamed[0].prompt is not None and all(h.prompt is None for h in streamed[1:])
    assert [h.done for h in streamed] == [False] * (len(streamed) - 1) + [True]
    assert same(whole.prompt, streamed[0].prompt)
    assert torch.equal(torch.cat([h.text_embeds for h in streamed]), whole.text_embeds)
    assert len(whole.text_embeds) == 3  # Qwen3: the last token is not spoken; Qwen2.5: the first carries no item


@pytest.mark.parametrize("family", FAMILIES)
def test_a_thinker_that_said_nothing_hands_off_an_empty_finished_text(family: str) -> None:
    handoff_type, whole_edge, streamed_edge, step_data = FAMILIES[family]
    whole = handoff_type.from_chunk(whole_edge(step_data(1))[0])
    assert whole.done and whole.prompt is not None and whole.text_embeds.shape == (0, WIDTH)
    (only,) = streamed_edge({}, step_data(1)[0], True, None)
    assert same(handoff_type.from_chunk(only), whole)


def test_a_chunk_missing_a_field_is_refused_naming_it() -> None:
    chunk = qwen2_5.thinker2talker(qwen2_5_step_data(2))[0]
    del chunk["prompt"]["text_pad"]
    with pytest.raises(ValueError, match="'text_pad'"):
        qwen2_5.Qwen25TalkerHandoff.from_chunk(chunk)
    with pytest.raises(ValueError, match="'text_embeds'"):
        qwen3.Qwen3TalkerHandoff.from_chunk({"done": True})
