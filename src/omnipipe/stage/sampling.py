"""Choosing a stage's next token from the last position's logits, for every autoregressive runner: the repetition,
presence and frequency penalties, ids a model must not produce, then greedy (temperature 0) or temperature / top-k /
top-p sampling with the request's own seeded generator.

The choice runs where the logits are, for every row of a step at once, and comes back to the host as one copy of
the step's tokens: top-k takes each row's k best (``topk``, no sort of the vocabulary), top-p finds each row's
probability floor by bisection (the smallest set of likeliest tokens whose mass reaches ``top_p``; tokens tied at
the floor all stay), and a sampled row draws by the Gumbel-max trick with noise counted from a key: each draw takes
one 62-bit key from the request's generator on the host, and the noise of token i is a hash of (key, i) computed on
the device. So a request draws the same tokens whatever it is batched with, and a seeded one the same on any device.

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
_KEY_BOUND = 2**62  # a draw's key, from the request's generator
_BISECTIONS = 40  # of top-p's probability floor: within 2**-40 of the likeliest token's probability
# splitmix64's constants as signed int64 (torch has no uint64 arithmetic; int64 products wrap the same way)
_GOLDEN = 0x9E3779B97F4A7C15 - 2**64
_MIX1 = 0xBF58476D1CE4E5B9 - 2**64
_MIX2 = 0x94D049BB133111EB - 2**64


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
    row = SamplingRow(params, generator, generated_ids, prompt_ids, constraint)
    return sample_next_tokens(logits[None], [row], suppress)[0]


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
    batched with. The step's one copy to the host (``choose_next_tokens`` leaves them on the device)."""
    return [int(token) for token in choose_next_tokens(logits, rows, suppress).tolist()]


def choose_next_tokens(logits: torch.Tensor, rows: Sequence[SamplingRow],
                       suppress: torch.Tensor | Sequence[int] = ()) -> torch.Tensor:
    """``sample_next_tokens``'s tokens [rows], left on the logits' device (a step that feeds them straight back,
    like the code predictor's residuals, never waits for the host). Rows that are greedy without penalties take
    one argmax together; the others have their penalties applied row by row and are filtered (temperature, top-k,
    top-p) and drawn together in float64."""
    if logits.dim() != 2 or logits.shape[0] != len(rows):
        raise ValueError(f"logits must have shape [{len(rows)}, vocab], got {tuple(logits.shape)}")
    constrained = [i for i, row in enumerate(rows) if row.constraint is not None]
    if constrained:  # a copy: the caller's logits stay the model's (their logprobs read them); one device copy
        blocked = torch.stack([rows[i].constraint.disallowed(logits.shape[-1]) for i in constrained])
        logits = logits.detach().clone()
        index = torch.tensor(constrained, device=logits.device)
        logits[index] = logits[index].masked_fill(blocked.to(logits.device, non_blocking=True), float("-inf"))
    suppressed = torch.as_tensor(suppress, dtype=torch.long).to(logits.device) if len(suppress) else None
    if all(row.params.greedy and not _penalised(row) for row in rows):  # one argmax
        scores = logits if suppressed is None else logits.index_fill(1, suppressed, float("-inf"))
        return scores.argmax(dim=-1)
    scores = torch.stack([apply_penalties(logits[i], row.params, row.generated_ids, row.prompt_ids)
                          if _penalised(row) else logits[i].detach().to(torch.float64) for i, row in enumerate(rows)])
    if suppressed is not None:
        scores = scores.index_fill(1, suppressed, float("-inf"))
    return _choose(scores, rows)


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


def _choose(scores: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Each row's token [rows] (left on the scores' device): greedy rows their argmax, sampled rows filtered by
    temperature, top-k and top-p and drawn with their generator's key (``_gumbel``)."""
    sampled = [i for i, row in enumerate(rows) if not row.params.greedy]
    if not sampled:
        return scores.argmax(dim=-1)
    device, vocab = scores.device, scores.shape[-1]
    params = [row.params for row in rows]
    temperature = torch.tensor([p.temperature or 1.0 for p in params], dtype=scores.dtype).to(device)
    scores = (scores - scores.max(dim=-1, keepdim=True).values) / temperature[:, None]
    top_k = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    ids = None  # the vocabulary: every row keeps all its tokens until top-k
    if any(top_k):
        # each row's k best (``topk``, not a sort of the vocabulary); when every row has a k, only the largest k
        # candidates go on
        best, best_ids = torch.topk(scores, max(top_k), dim=-1)
        kth = best.gather(1, torch.tensor([max(k, 1) - 1 for k in top_k]).to(device)[:, None])
        kth = kth.masked_fill(torch.tensor([k == 0 for k in top_k]).to(device)[:, None], float("-inf"))
        if all(top_k):
            scores, ids = best.masked_fill(best < kth, float("-inf")), best_ids
        else:
            scores = scores.masked_fill(scores < kth, float("-inf"))
    top_p = [p.top_p for p in params]
    if any(p < 1.0 for p in top_p):
        probs = torch.softmax(scores, dim=-1)
        floor = _top_p_floor(probs, torch.tensor(top_p, dtype=probs.dtype).to(device))
        scores = scores.masked_fill(probs < floor, float("-inf"))
    keys = torch.tensor([_draw_key(rows[i].generator) if i in sampled else 0 for i in range(len(rows))])
    noisy = scores + _gumbel(keys.to(device), vocab, ids)
    greedy = torch.tensor([p.greedy for p in params]).to(device)
    chosen = torch.where(greedy, scores.argmax(dim=-1), noisy.argmax(dim=-1))
    return chosen if ids is None else ids.gather(1, chosen[:, None])[:, 0]


def _top_p_floor(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Each row's probability floor [rows, 1]: the highest ``f`` whose tokens of probability >= f hold ``top_p``
    of the mass (0 where ``top_p`` is 1), found by bisection in a fixed number of steps (no sort, no host sync)."""
    top_p = top_p[:, None]
    best = probs.max(dim=-1, keepdim=True).values
    low, high = torch.zeros_like(best), best
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2
        enough = torch.where(probs >= middle, probs, 0.0).sum(dim=-1, keepdim=True) >= top_p
        low, high = torch.where(enough, middle, low), torch.where(enough, high, middle)
    alone = best >= top_p  # the likeliest token holds top_p by itself
    floor = torch.where(alone, best, low)
    return torch.where(top_p >= 1.0, torch.zeros_like(floor), floor)


def _draw_key(generator: torch.Generator | None) -> int:
    """One draw's key from a request's generator (torch's global one when it has none)."""
    return int(torch.randint(_KEY_BOUND, (1,), generator=generator))


def _gumbel(keys: torch.Tensor, vocab: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Gumbel noise [rows, vocab] (float32; [rows, candidates] for the token ids ``ids``) counted from each row's
    key: token i's is a splitmix64 hash of (key, i), so it is the same on every device, whatever the other rows and
    whether the row's candidates were narrowed first."""
    tokens = torch.arange(vocab, device=keys.device)[None, :] if ids is None else ids
    x = keys[:, None] * _MIX1 + tokens * _GOLDEN
    for shift, multiplier in ((30, _MIX1), (27, _MIX2)):
        x = (x ^ _shift_right(x, shift)) * multiplier
    x = x ^ _shift_right(x, 31)
    # 24 bits in (0, 1), float32: the noise only orders tokens, and a float32 Gumbel tail reaches 17, far past any
    # gap a temperature leaves between a kept token and the best
    uniform = (_shift_right(x, 40).to(torch.float32) + 0.5) * 2.0**-24
    return uniform.log_().neg_().log_().neg_()


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """The logical right shift of int64 ``x`` (as if unsigned)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)
