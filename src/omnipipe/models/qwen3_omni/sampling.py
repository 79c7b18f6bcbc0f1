"""Choosing the next token from a step's logits: repetition, presence and frequency penalties over the tokens this
stage generated so far (transformers' generate also counts the prompt's tokens for the repetition penalty of a
stage given input ids: the talker, fed embeddings, matches it; the thinker does not), suppressed ids, then greedy
(temperature 0) or temperature / top-k / top-p sampling with the request's own seeded generator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Decoding:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    @classmethod
    def from_params(cls, params: dict[str, Any], defaults: "Decoding") -> "Decoding":
        """A stage's SamplingParams as the engine hands them over (a dict with every field, or empty when the caller
        gave that stage none: then ``defaults``)."""
        given = {k: params[k] for k in ("temperature", "top_k", "top_p", "repetition_penalty", "presence_penalty",
                                        "frequency_penalty", "seed") if params.get(k) is not None}
        return cls(**{**defaults.__dict__, **given})

    def generator(self) -> torch.Generator | None:
        if self.temperature <= 0:
            return None
        generator = torch.Generator()
        generator.manual_seed(self.seed if self.seed is not None else int(torch.randint(0, 2**62, ()).item()))
        return generator


def next_token(logits: torch.Tensor, decoding: Decoding, generated: list[int], suppress: torch.Tensor | None,
               generator: torch.Generator | None) -> int:
    """``logits`` [V] of the last position -> the chosen token id."""
    scores = logits.float().clone()
    if decoding.repetition_penalty != 1.0 and generated:
        seen = torch.tensor(sorted(set(generated)), dtype=torch.long, device=scores.device)
        picked = scores[seen]
        scores[seen] = torch.where(picked < 0, picked * decoding.repetition_penalty,
                                   picked / decoding.repetition_penalty)
    if (decoding.presence_penalty or decoding.frequency_penalty) and generated:
        ids, counts = torch.tensor(generated, dtype=torch.long).unique(return_counts=True)
        ids = ids.to(scores.device)
        scores[ids] -= decoding.presence_penalty + decoding.frequency_penalty * counts.to(scores.device).float()
    if suppress is not None:
        scores[suppress.to(scores.device)] = float("-inf")
    if decoding.temperature <= 0:
        return int(scores.argmax())
    scores = scores / decoding.temperature
    if decoding.top_k > 0:
        kth = torch.topk(scores, min(decoding.top_k, scores.numel())).values[-1]
        scores[scores < kth] = float("-inf")
    if decoding.top_p < 1.0:
        ordered, order = scores.sort(descending=True)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative - ordered.softmax(-1) > decoding.top_p
        scores[order[drop]] = float("-inf")
    probs = scores.softmax(-1).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))
