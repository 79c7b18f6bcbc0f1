"""Choosing a stage's next token from the last position's logits, for every autoregressive runner: the repetition,
presence and frequency penalties, ids a model must not produce, then greedy (temperature 0) or temperature / top-k /
top-p sampling with the request's own seeded generator.

Scores are float64 and stay finite whatever the (valid) settings, so a sampled step never meets a NaN."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

_MAX_SEED = 2**64 - 1
_MAX_SCORE = torch.finfo(torch.float64).max


@dataclass(frozen=True)
class TokenSamplingParams:
    """Per-request sampling settings; ``temperature == 0`` means greedy.

    Penalties follow the usual conventions: ``repetition_penalty`` divides positive
    (multiplies negative) logits of already generated tokens; ``presence_penalty`` and
    ``frequency_penalty`` subtract a constant, and a constant per occurrence.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_float("temperature", self.temperature, low=0.0)
        _check_float("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {self.top_k!r}")
        _check_float("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        _check_float("presence_penalty", self.presence_penalty, low=-2.0, high=2.0)
        _check_float("frequency_penalty", self.frequency_penalty, low=-2.0, high=2.0)
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= _MAX_SEED
        ):
            raise ValueError(f"seed must be None or an int in [0, 2**64), got {self.seed!r}")

    @classmethod
    def from_params(cls, params: Mapping[str, Any], defaults: TokenSamplingParams | None = None) -> TokenSamplingParams:
        """The settings of a request's SamplingParams (as the engine hands them to a stage: a dict), each field the
        caller left out (``given_params``) or gave as None taken from ``defaults`` (a model's own decoding; greedy
        when None). Raises ``ValueError`` naming the field for a value out of range."""
        base, given = defaults or cls(), given_params(params)
        return cls(**{f.name: given[f.name] if given.get(f.name) is not None else getattr(base, f.name)
                      for f in fields(cls)})

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def make_generator(self, salt: int = 0) -> torch.Generator | None:
        """A generator seeded with ``seed`` (plus ``salt``, so two stages of one request given the same seed draw
        differently), or None to use torch's global RNG."""
        if self.seed is None:
            return None
        generator = torch.Generator()
        generator.manual_seed((self.seed + salt) % (_MAX_SEED + 1))
        return generator


def given_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The SamplingParams fields a request's caller set, from the dict a stage receives (``SamplingParams.to_dict``,
    whose ``given`` names them); a dict without ``given`` (built by hand) counts every field that is not None."""
    if "given" in params:
        return {name: params[name] for name in params["given"] if name in params}
    return {name: value for name, value in params.items() if value is not None}


def _check_float(name: str, value: object, low: float | None = None, high: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value!r}")


def apply_penalties(logits: torch.Tensor, params: TokenSamplingParams, generated_ids: Sequence[int],
                    prompt_ids: Sequence[int] = ()) -> torch.Tensor:
    """Return a float64 copy of ``logits`` [vocab] with repetition/presence/frequency penalties applied.

    The repetition penalty covers ``generated_ids`` and ``prompt_ids`` (transformers' ``generate`` applies it to
    the prompt's tokens too; a runner that wants to match it passes them); presence and frequency count only the
    generated tokens. Every score stays finite whatever the (valid) parameters: a repetition penalty near 0 divides
    a positive logit past the largest double, which is clamped to it rather than left infinite (``inf - inf`` later
    is NaN).
    """
    logits = logits.detach().to(torch.float64).clone()
    if not generated_ids and not prompt_ids:
        return logits
    counts = Counter(generated_ids)
    if params.repetition_penalty != 1.0:
        repeated = torch.tensor(sorted(set(prompt_ids).union(counts)), dtype=torch.long, device=logits.device)
        seen = logits[repeated]
        logits[repeated] = torch.where(seen > 0, seen / params.repetition_penalty, seen * params.repetition_penalty)
    if counts and (params.presence_penalty != 0.0 or params.frequency_penalty != 0.0):
        ids = torch.tensor(list(counts), dtype=torch.long, device=logits.device)
        occurrences = torch.tensor(list(counts.values()), dtype=torch.float64, device=logits.device)
        logits[ids] -= params.presence_penalty + params.frequency_penalty * occurrences
    return torch.nan_to_num(logits, posinf=_MAX_SCORE, neginf=-_MAX_SCORE)


def sample_next_token(
    logits: torch.Tensor,
    params: TokenSamplingParams,
    generated_ids: Sequence[int],
    generator: torch.Generator | None = None,
    *,
    prompt_ids: Sequence[int] = (),
    suppress: torch.Tensor | Sequence[int] = (),
    constraint: Any = None,
) -> int:
    """Choose the next token id from ``logits`` [vocab].

    ``generated_ids`` are the tokens the penalties apply to (usually this request's output so far; ``prompt_ids``
    are penalised for repetition too, see ``apply_penalties``); ``suppress`` are ids never chosen. With
    ``generator`` from ``params.make_generator()`` the result is reproducible for a given seed. ``constraint`` (a
    request's ``TokenConstraint``, ``structured_output.py``) leaves only the tokens its grammar allows.
    """
    if logits.dim() != 1:
        raise ValueError(f"logits must have shape [vocab], got {tuple(logits.shape)}")
    if constraint is not None:
        logits = constraint.mask_(logits.detach().clone())
    scores = apply_penalties(logits, params, generated_ids, prompt_ids)
    if len(suppress):
        scores[torch.as_tensor(suppress, dtype=torch.long).to(scores.device)] = float("-inf")
    if params.greedy:
        return int(torch.argmax(scores))
    # in float64, shifted first: the best score becomes exactly 0 and stays 0 for any temperature > 0 (a tiny one
    # only sends the others to -inf, which is greedy), so the softmax below never sees NaN
    scores = (scores - scores.max()) / params.temperature
    if 0 < params.top_k < scores.numel():
        kth_best = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth_best, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        # drop a token once the tokens ranked above it already cover top_p; the best token always stays
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    probs = torch.softmax(scores, dim=-1).cpu()
    return int(torch.multinomial(probs, num_samples=1, generator=generator))


@dataclass
class SamplingRow:
    """One request's row of a batched step: its settings, generator, and the ids its penalties read."""

    params: TokenSamplingParams
    generator: torch.Generator | None = None
    generated_ids: Sequence[int] = ()
    prompt_ids: Sequence[int] = ()
    constraint: Any = None  # a TokenConstraint (``structured_output.py``): the row's grammar masks its scores


def sample_next_tokens(logits: torch.Tensor, rows: Sequence[SamplingRow],
                       suppress: torch.Tensor | Sequence[int] = ()) -> list[int]:
    """The next token of every row of ``logits`` [rows, vocab], each as ``sample_next_token`` would choose it alone
    (the same scores, the same draw from the row's own generator): a request gives the same tokens whatever it is
    batched with. Rows that are greedy without penalties take one argmax on the device together; the others have
    their penalties applied row by row and are filtered (temperature, top-k, top-p) together in float64."""
    if logits.dim() != 2 or logits.shape[0] != len(rows):
        raise ValueError(f"logits must have shape [{len(rows)}, vocab], got {tuple(logits.shape)}")
    constrained = [i for i, row in enumerate(rows) if row.constraint is not None]
    if constrained:  # a copy: the caller's logits stay the model's (their logprobs read them); one device copy
        blocked = torch.stack([rows[i].constraint.disallowed(logits.shape[-1]) for i in constrained])
        logits = logits.detach().clone()
        index = torch.tensor(constrained, device=logits.device)
        logits[index] = logits[index].masked_fill(blocked.to(logits.device, non_blocking=True), float("-inf"))
    chosen: list[int | None] = [None] * len(rows)
    plain = [i for i, row in enumerate(rows) if row.params.greedy and not _penalised(row)]
    if plain:
        scores = logits[plain]
        if len(suppress):
            scores = scores.index_fill(1, torch.as_tensor(suppress, dtype=torch.long).to(scores.device),
                                       float("-inf"))
        for i, token in zip(plain, scores.argmax(dim=-1).tolist(), strict=True):
            chosen[i] = int(token)
    rest = [i for i in range(len(rows)) if chosen[i] is None]
    if rest:
        scores = torch.stack([apply_penalties(logits[i], rows[i].params, rows[i].generated_ids, rows[i].prompt_ids)
                              for i in rest])
        if len(suppress):
            scores[:, torch.as_tensor(suppress, dtype=torch.long).to(scores.device)] = float("-inf")
        for i, token in zip(rest, _filtered_choice(scores, [rows[i] for i in rest]), strict=True):
            chosen[i] = token
    return [int(token) for token in chosen if token is not None]


def token_logprobs(logits: torch.Tensor, token: int, top: int, spell: Any) -> dict[str, Any]:
    """OpenAI's logprob entry of ``token`` from the model's scores ``logits`` [vocab] (before penalties and any
    grammar): its log probability and, with ``top`` > 0, the ``top`` likeliest tokens'. ``spell(id) -> bytes``
    gives a token's bytes (a token may hold part of a character: ``token`` is then its bytes decoded with
    replacement)."""
    logprobs = torch.log_softmax(logits.detach().to(torch.float32), dim=-1)

    def entry(token_id: int, value: float) -> dict[str, Any]:
        data = spell(token_id)
        return {"token": data.decode("utf-8", errors="replace"), "logprob": max(value, -9999.0),
                "bytes": list(data)}

    out = entry(token, float(logprobs[token]))
    if top > 0:
        values, ids = torch.topk(logprobs, top)
        out["top_logprobs"] = [entry(int(i), float(v)) for v, i in zip(values.tolist(), ids.tolist(), strict=True)]
    else:
        out["top_logprobs"] = []
    return out


def _penalised(row: SamplingRow) -> bool:
    params = row.params
    return bool((params.repetition_penalty != 1.0 and (row.generated_ids or row.prompt_ids))
                or ((params.presence_penalty or params.frequency_penalty) and row.generated_ids))


def _filtered_choice(scores: torch.Tensor, rows: Sequence[SamplingRow]) -> list[int]:
    """Greedy rows take their argmax; sampled rows are filtered as ``sample_next_token`` does, all at once."""
    tokens = scores.argmax(dim=-1).tolist()
    sampled = [i for i, row in enumerate(rows) if not row.params.greedy]
    if not sampled:
        return tokens
    scores = scores[sampled]
    temperature = torch.tensor([rows[i].params.temperature for i in sampled], dtype=scores.dtype,
                               device=scores.device)
    scores = (scores - scores.max(dim=-1, keepdim=True).values) / temperature[:, None]
    vocab = scores.shape[-1]
    top_k = [rows[i].params.top_k for i in sampled]
    if any(0 < k < vocab for k in top_k):
        ranked = torch.sort(scores, dim=-1, descending=True).values
        index = torch.tensor([k - 1 if 0 < k < vocab else vocab - 1 for k in top_k], device=scores.device)
        kth_best = ranked.gather(1, index[:, None])
        scores = scores.masked_fill(scores < kth_best, float("-inf"))
    top_p = torch.tensor([rows[i].params.top_p for i in sampled], dtype=scores.dtype, device=scores.device)
    if bool((top_p < 1.0).any()):
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        drop_sorted = ((sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p[:, None]) & (top_p[:, None] < 1.0)
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    probs = torch.softmax(scores, dim=-1).cpu()
    for row, i in enumerate(sampled):
        tokens[i] = int(torch.multinomial(probs[row], num_samples=1, generator=rows[i].generator))
    return tokens
