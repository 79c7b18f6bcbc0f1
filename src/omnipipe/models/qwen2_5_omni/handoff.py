"""Qwen2.5-Omni's thinker -> talker hand-off: what the talker reads, as types, and the edge functions that build it.

The talker's prefill reads the thinker's prompt (``Qwen25TalkerPrompt``) and the first generated token's item; every
later step reads the next token's item: its layer-0 embedding plus its last-layer hidden state (the thinker's state
when it read that token). Once the thinker is done, the talker reads the text-end embedding, then the pad embedding.

One schema for both forms: the streamed edge (``thinker2talker_async_chunk``) sends a ``Qwen25TalkerHandoff`` a
step (the prompt with the first item), the whole edge (``thinker2talker``) one with all of it. Every tensor is a
float32 (ids and masks: int64) CPU torch tensor. On the wire a hand-off is the plain dict of ``to_chunk`` (the
payload codec carries its tensors; ``transport/payload_codec.py``), read back with ``from_chunk``.

The thinker's step data (its ``RunnerOutput.data``) is ``{"token": id, "embed": [D], "hidden": [D]}`` (the
embedding and hidden state of the token the step read); the first step's carries ``"prompt"``
(``Qwen25TalkerPrompt.to_dict``) and no item.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from omnipipe.chunk.context import ChunkContext


def _tensor(part: dict[str, Any], key: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if key not in part:
        raise ValueError(f"a Qwen2.5-Omni talker hand-off has no {key!r}")
    return torch.as_tensor(part[key]).to(dtype)


@dataclass
class Qwen25TalkerPrompt:
    """What the talker's prefill reads of the thinker's prompt: its ids and attention mask [L] (int64), the
    embeddings the thinker's layer 0 read [L, D] (multimodal positions zeroed: the talker does not read them) and
    its last layer's hidden states [L, D], the thinker's first generated token, the thinker's embeddings of the
    text-end and pad tokens and of each voice's begin token [D], and the grids the talker's rope index needs
    (``image_grid_thw``, ``video_grid_thw``, ``video_second_per_grid``, ``audio_feature_lengths``)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    embeds: torch.Tensor
    hidden: torch.Tensor
    first_token: int
    text_eos: torch.Tensor
    text_pad: torch.Tensor
    speaker_bos: dict[str, torch.Tensor]
    grids: dict[str, torch.Tensor] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "embeds": self.embeds,
                "hidden": self.hidden, "first_token": self.first_token, "text_eos": self.text_eos,
                "text_pad": self.text_pad, "speaker_bos": dict(self.speaker_bos), "grids": dict(self.grids)}

    @classmethod
    def from_dict(cls, part: dict[str, Any]) -> Qwen25TalkerPrompt:
        if "first_token" not in part:
            raise ValueError("a Qwen2.5-Omni talker hand-off has no 'first_token'")
        return cls(_tensor(part, "input_ids", torch.int64), _tensor(part, "attention_mask", torch.int64),
                   _tensor(part, "embeds"), _tensor(part, "hidden"), int(part["first_token"]),
                   _tensor(part, "text_eos"), _tensor(part, "text_pad"),
                   {name: torch.as_tensor(vector).float() for name, vector in (part.get("speaker_bos") or {}).items()},
                   {key: torch.as_tensor(value) for key, value in (part.get("grids") or {}).items()})


@dataclass
class Qwen25TalkerHandoff:
    """One talker input: the next tokens' items, as their embeddings and hidden states [n, D] each (n may be 0),
    whether the thinker is done, and the prompt (the first hand-off of a request only)."""

    text_embeds: torch.Tensor
    text_hidden: torch.Tensor
    done: bool = False
    prompt: Qwen25TalkerPrompt | None = None

    def to_chunk(self) -> dict[str, Any]:
        chunk: dict[str, Any] = {"text_embeds": self.text_embeds, "text_hidden": self.text_hidden, "done": self.done}
        if self.prompt is not None:
            chunk["prompt"] = self.prompt.to_dict()
        return chunk

    @classmethod
    def from_chunk(cls, chunk: dict[str, Any]) -> Qwen25TalkerHandoff:
        prompt = chunk.get("prompt")
        handoff = cls(_tensor(chunk, "text_embeds"), _tensor(chunk, "text_hidden"), bool(chunk.get("done")),
                      None if prompt is None else Qwen25TalkerPrompt.from_dict(prompt))
        if handoff.text_embeds.shape != handoff.text_hidden.shape:
            raise ValueError(f"a Qwen2.5-Omni talker hand-off has {tuple(handoff.text_embeds.shape)} text embeddings "
                             f"but {tuple(handoff.text_hidden.shape)} hidden states")
        return handoff


def thinker2talker(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The whole thinker output as one talker input (the streamed hand-offs joined)."""
    if not outputs:
        return []
    state: dict[str, Any] = {}
    handoffs = [Qwen25TalkerHandoff.from_chunk(chunk) for index, output in enumerate(outputs)
                for chunk in thinker2talker_async_chunk(state, output, index == len(outputs) - 1, None)]
    prompt = next((handoff.prompt for handoff in handoffs if handoff.prompt is not None), None)
    whole = Qwen25TalkerHandoff(torch.cat([handoff.text_embeds for handoff in handoffs]),
                                torch.cat([handoff.text_hidden for handoff in handoffs]),
                                any(handoff.done for handoff in handoffs), prompt)
    return [whole.to_chunk()]


def thinker2talker_async_chunk(state: dict[str, Any], output: dict[str, Any], is_last: bool,
                               ctx: ChunkContext | None) -> list[dict[str, Any]]:
    """Per thinker step: the prompt waits for the first item, then each item goes at once; the last hand-off says
    the thinker is done (the talker then reads the text-end and pad embeddings)."""
    if "prompt" in output:
        state["prompt"] = Qwen25TalkerPrompt.from_dict(output["prompt"])
        state["width"] = int(state["prompt"].embeds.shape[-1])
    has_item = "embed" in output
    if not has_item and not is_last:
        return []
    if has_item:
        embeds = torch.as_tensor(output["embed"]).float()[None]
        hidden = torch.as_tensor(output["hidden"]).float()[None]
    else:
        embeds = hidden = torch.zeros(0, state.get("width", 0))
    return [Qwen25TalkerHandoff(embeds, hidden, is_last, state.pop("prompt", None)).to_chunk()]
