"""Qwen3-Omni's thinker -> talker hand-off: what the talker reads, as types, and the edge functions that build it.

The talker starts from the prompt (its user turns and the assistant's first token) and reads one generated token's
embedding per step after that. As in the model's own ``generate``, the embedding of the thinker's last token (never
fed back to the thinker) is not spoken, so each token's embedding is shipped once the next one is known; the last
chunk says the text is done.

One schema for both forms: the streamed edge (``thinker2talker_async_chunk``) sends a ``Qwen3TalkerHandoff`` a
step, the prompt with the first; the whole edge (``thinker2talker``) sends one with all of it. Every tensor is a
float32 (ids: int64) CPU torch tensor. On the wire a hand-off is the plain dict of ``to_chunk`` (the payload codec
carries its tensors; ``transport/payload_codec.py``), read back with ``from_chunk``.

The thinker's step data (its ``RunnerOutput.data``) is ``{"token": id, "embed": [D]}``, the first step's with
``"prompt"`` (``Qwen3TalkerPrompt.to_dict``); a turn of tool calls ships no ``embed`` (it is not spoken).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from omnipipe.chunk.context import ChunkContext


def _tensor(chunk: dict[str, Any], key: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if key not in chunk:
        raise ValueError(f"a Qwen3-Omni talker hand-off has no {key!r}")
    return torch.as_tensor(chunk[key]).to(dtype)


@dataclass
class Qwen3TalkerPrompt:
    """What the talker's prefill reads of the thinker's prompt: its ids [L] (int64), their layer-0 embeddings
    [L, D], the multimodal positions' hidden states at the talker's ``accept_hidden_layer`` [M, D], and the grids
    its rope index needs (``image_grid_thw``, ``video_grid_thw``, ``audio_feature_lengths``, as the thinker's
    processor made them)."""

    ids: torch.Tensor
    embeds: torch.Tensor
    mm_hidden: torch.Tensor
    grids: dict[str, torch.Tensor] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"ids": self.ids, "embeds": self.embeds, "mm_hidden": self.mm_hidden, "grids": dict(self.grids)}

    @classmethod
    def from_dict(cls, part: dict[str, Any]) -> Qwen3TalkerPrompt:
        return cls(_tensor(part, "ids", torch.int64), _tensor(part, "embeds"), _tensor(part, "mm_hidden"),
                   {key: torch.as_tensor(value) for key, value in (part.get("grids") or {}).items()})


@dataclass
class Qwen3TalkerHandoff:
    """One talker input: the next spoken tokens' embeddings [n, D] (n may be 0), whether the thinker's text is done,
    and the prompt (the first hand-off of a request only)."""

    text_embeds: torch.Tensor
    done: bool = False
    prompt: Qwen3TalkerPrompt | None = None

    def to_chunk(self) -> dict[str, Any]:
        chunk: dict[str, Any] = {"text_embeds": self.text_embeds, "done": self.done}
        if self.prompt is not None:
            chunk["prompt"] = self.prompt.to_dict()
        return chunk

    @classmethod
    def from_chunk(cls, chunk: dict[str, Any]) -> Qwen3TalkerHandoff:
        prompt = chunk.get("prompt")
        return cls(_tensor(chunk, "text_embeds"), bool(chunk.get("done")),
                   None if prompt is None else Qwen3TalkerPrompt.from_dict(prompt))


def thinker2talker(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The whole thinker output as the talker's one input: the prompt and every generated token's embedding but the
    last one's."""
    first = next((o for o in outputs if "prompt" in o), None)
    if first is None:
        return []
    prompt = Qwen3TalkerPrompt.from_dict(first["prompt"])
    embeds = [torch.as_tensor(o["embed"]) for o in outputs if "embed" in o][:-1]
    text = torch.stack(embeds).float() if embeds else prompt.embeds[:0]
    return [Qwen3TalkerHandoff(text, done=True, prompt=prompt).to_chunk()]


def thinker2talker_async_chunk(state: dict[str, Any], output: dict[str, Any], is_last: bool,
                               ctx: ChunkContext | None) -> list[dict[str, Any]]:
    """Per thinker step: the previous token's embedding (the first chunk carries the prompt with it); at the end,
    what is left and ``done``."""
    if "prompt" in output:
        state["prompt"] = Qwen3TalkerPrompt.from_dict(output["prompt"])
        state["width"] = int(state["prompt"].embeds.shape[-1])
    ready: list[torch.Tensor] = []
    if "embed" in output:
        if "pending" in state:
            ready.append(state["pending"])
        state["pending"] = torch.as_tensor(output["embed"]).float()
    if not ready and not is_last:
        return []
    if "prompt" not in state and not state.get("sent_prompt"):
        return []
    prompt: Qwen3TalkerPrompt | None = None
    if not state.get("sent_prompt"):
        prompt = state.pop("prompt")
        state["sent_prompt"] = True
    text = torch.stack(ready) if ready else torch.zeros(0, state["width"])
    return [Qwen3TalkerHandoff(text, done=is_last, prompt=prompt).to_chunk()]
