"""The sampler's choice on the device: draws follow the filtered softmax (temperature, top-k, top-p), top-p keeps
the same tokens as the sort-based definition, a seeded request draws the same tokens alone or in any batch (also
when its candidates were narrowed by top-k first), and a step reads its tokens back to the host once."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from omnipipe.stage import sampling
from omnipipe.stage.sampling import SamplingRow, TokenSamplingParams, sample_next_tokens

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0])


def _frequencies(params: TokenSamplingParams, draws: int = 6000) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    counts = torch.zeros(len(LOGITS))
    rows = [SamplingRow(params, generator)] * 100  # one generator: 100 draws a step
    for _ in range(draws // 100):
        for token in sample_next_tokens(LOGITS.expand(100, -1), rows):
            counts[token] += 1
    return counts / draws


def _expected(params: TokenSamplingParams) -> torch.Tensor:
    """The filtered softmax, by the sort-based definition (top-k, then top-p of what top-k left, as transformers'
    warpers do)."""
    scores = LOGITS.double() / params.temperature
    order = torch.argsort(scores, descending=True)
    dropped = torch.zeros(len(scores), dtype=torch.bool)
    if params.top_k:
        dropped[order[params.top_k:]] = True
    probs = torch.softmax(scores.masked_fill(dropped, float("-inf")), -1)
    mass = 0.0
    for token in order.tolist():
        if mass >= params.top_p:
            dropped[token] = True
        mass += float(probs[token])
    return torch.softmax(scores.masked_fill(dropped, float("-inf")), -1).float()


@pytest.mark.parametrize("params", [TokenSamplingParams(temperature=1.0), TokenSamplingParams(temperature=0.5),
                                    TokenSamplingParams(temperature=1.0, top_k=3),
                                    TokenSamplingParams(temperature=1.0, top_p=0.7),
                                    TokenSamplingParams(temperature=2.0, top_k=4, top_p=0.8)])
def test_draws_follow_the_filtered_softmax(params: TokenSamplingParams) -> None:
    got, want = _frequencies(params), _expected(params)
    assert torch.equal(got > 0, want > 0), (got, want)  # the same support
    sigma = (want * (1 - want) / 6000).sqrt()
    assert bool(((got - want).abs() <= 5 * sigma + 1e-9).all()), (got, want)


def test_top_p_keeps_what_the_sorted_definition_keeps_row_by_row() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 5000, dtype=torch.float64) * 3
    top_p = torch.tensor([0.1, 0.5, 0.8, 0.9, 0.99, 1.0], dtype=torch.float64)
    probs = torch.softmax(logits, -1)
    floor = sampling._top_p_floor(probs, top_p)
    for row in range(6):
        ranked, order = torch.sort(probs[row], descending=True)
        drop = (ranked.cumsum(0) - ranked) >= top_p[row]
        want = set(order[~drop].tolist())
        assert set(torch.nonzero(probs[row] >= floor[row]).view(-1).tolist()) == want, row


def test_a_seeded_request_draws_the_same_alone_and_in_any_batch() -> None:
    torch.manual_seed(1)
    vocab = 3000
    settings = [TokenSamplingParams(temperature=0.8, seed=5), TokenSamplingParams(temperature=1.0, top_k=40, seed=6),
                TokenSamplingParams(temperature=0.7, top_p=0.9, seed=7), TokenSamplingParams(),
                TokenSamplingParams(temperature=1.2, top_k=20, top_p=0.8, seed=8)]
    steps = [torch.randn(len(settings), vocab) * 2 for _ in range(12)]

    def run(members: list[int]) -> dict[int, list[int]]:
        generators = {i: settings[i].make_generator() for i in members}
        tokens: dict[int, list[int]] = {i: [] for i in members}
        for logits in steps:
            rows = [SamplingRow(settings[i], generators[i]) for i in members]
            for i, token in zip(members, sample_next_tokens(logits[members], rows), strict=True):
                tokens[i].append(token)
        return tokens

    together = run(list(range(len(settings))))
    for i in range(len(settings)):
        assert run([i])[i] == together[i], i  # alone: no other row, and (row 1, 4) every row narrowed by top-k
    assert run([1, 0])[1] == together[1]  # with a row that keeps its whole vocabulary


class _HostReads(TorchFunctionMode):
    """Counts the reads of tensor values into Python (each one a device -> host copy and a sync on a GPU)."""

    READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy"}

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", "") in self.READS:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("params", [TokenSamplingParams(), TokenSamplingParams(temperature=0.7, top_k=50, top_p=0.8),
                                    TokenSamplingParams(temperature=1.0, top_p=0.9, repetition_penalty=1.2,
                                                        presence_penalty=0.5)])
def test_a_step_reads_its_tokens_back_once(params: TokenSamplingParams, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = iter(range(1, 1000))
    monkeypatch.setattr(sampling, "_draw_key", lambda generator: next(keys))  # the host generator's draw apart
    logits = torch.randn(8, 2000)
    rows = [SamplingRow(params, None, [1, 2, 3], [4, 5]) for _ in range(8)]
    with _HostReads() as counted:
        tokens = sample_next_tokens(logits, rows)
    assert len(tokens) == 8 and counted.reads == ["tolist"]
