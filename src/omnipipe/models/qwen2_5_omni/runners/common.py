"""What the Qwen2.5-Omni stage runners share: sampling one token from logits per a request's SamplingParams
(repetition, presence and frequency penalties, suppressed ids, greedy or temperature / top-k / top-p), and cutting
generated text at a request's stop strings."""

from __future__ import annotations

from collections import Counter
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
               generator: torch.Generator | None, suppress: list[int] = (), generated: list[int] = ()) -> int:
    """One token from the last position's logits [1, V]: the repetition penalty over ``history`` [1, T] (prompt and
    generated tokens, as transformers' generate applies it), the presence and frequency penalties over the
    ``generated`` tokens (subtracted from the logits: presence once per token seen, frequency once per time seen),
    ``suppress`` set to -inf, then greedy (temperature 0) or sampled with temperature / top-k / top-p."""
    processors = LogitsProcessorList()
    penalty = float(params.get("repetition_penalty", 1.0))
    if penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(penalty))
    scores = processors(history, logits.float().clone())
    presence = float(params.get("presence_penalty", 0.0))
    frequency = float(params.get("frequency_penalty", 0.0))
    if (presence or frequency) and generated:
        counts = Counter(generated)
        ids = torch.tensor(list(counts), dtype=torch.long, device=scores.device)
        times = torch.tensor(list(counts.values()), dtype=scores.dtype, device=scores.device)
        scores[:, ids] -= presence + frequency * times
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


def cut_at_stop(text: str, stops: list[str], final: bool) -> tuple[str, bool]:
    """The part of ``text`` that may go out now, and whether a stop string ended it. With a stop string in
    ``text``: the text before the earliest one (the stop string is not part of it), and True. Otherwise (not
    ``final``) the text less its longest tail that begins some stop string (held back until the next tokens show
    whether the stop string follows); ``final``: all of it."""
    found = [text.find(stop) for stop in stops if stop in text]
    if found:
        return text[:min(found)], True
    if final:
        return text, False
    held = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:size]):
                held = size
                break
    return text[:len(text) - held], False
