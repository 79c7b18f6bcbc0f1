"""What the Qwen2.5-Omni stage runners share: the checkpoint and device from stage options, and sampling one token
from logits per a request's SamplingParams."""

from __future__ import annotations

from typing import Any

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


def request_generator(params: dict[str, Any], salt: int = 0) -> torch.Generator | None:
    """A per-request generator when the request gives a seed (sampling is then reproducible)."""
    seed = params.get("seed")
    return None if seed is None else torch.Generator().manual_seed(int(seed) + salt)


def next_token(logits: torch.Tensor, history: torch.Tensor, params: dict[str, Any],
               generator: torch.Generator | None, suppress: list[int] = ()) -> int:
    """One token from the last position's logits [1, V]: repetition penalty over ``history`` [1, T], ``suppress``
    set to -inf, then greedy (temperature 0) or sampled with temperature / top-k / top-p."""
    processors = LogitsProcessorList()
    penalty = float(params.get("repetition_penalty", 1.0))
    if penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(penalty))
    scores = processors(history, logits.float())
    if suppress:
        scores[:, list(suppress)] = -float("inf")
    temperature = float(params.get("temperature", 0.0))
    if temperature <= 0:
        return int(scores.argmax(-1).item())
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if int(params.get("top_k", 0)) > 0:
        warpers.append(TopKLogitsWarper(int(params["top_k"])))
    if float(params.get("top_p", 1.0)) < 1.0:
        warpers.append(TopPLogitsWarper(float(params["top_p"])))
    probs = torch.softmax(warpers(history, scores), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())
