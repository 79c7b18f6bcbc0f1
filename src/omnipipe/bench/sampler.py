"""``omnipipe bench sampler``: the sampler's step beside the sort-based one it replaced, in one run.

    omnipipe bench sampler [--vocab 151936] [--batches 1,8] [--repeats 20] [--device cpu] [--json FILE]

For each batch size and each setting (greedy; temperature 0.7; top-k 50 with top-p 0.8, the Qwen3 talker's and
code predictor's; top-p 0.95 alone) it times ``sample_next_tokens`` (``stage/sampling.py``: the choice where the
logits are, top-k by ``topk``, top-p's floor by bisection, Gumbel-max draws hashed from a per-draw key, one copy
of the step's tokens to the host) and the sort-based reference: each row's scores sorted in full for top-k and
top-p, ``torch.multinomial`` row by row on the host with the request's generator (the sampler before). Logits are
random normal x 3 (a peaked distribution like a language model's), float32, on ``--device``. The table gives the
median ms of a step and sort-based / device.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import torch

from omnipipe.bench.report import format_table, machine_info, median, write_json
from omnipipe.stage.sampling import SamplingRow, TokenSamplingParams, sample_next_tokens

SETTINGS = {
    "greedy": TokenSamplingParams(),
    "t0.7": TokenSamplingParams(temperature=0.7),
    "t1 k50 p0.8": TokenSamplingParams(temperature=1.0, top_k=50, top_p=0.8),
    "t1 p0.95": TokenSamplingParams(temperature=1.0, top_p=0.95),
}
HEADERS = ["batch", "setting", "sort-based ms", "device ms", "sort / device"]


def sort_based(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> list[int]:
    """The sampler before: float64 scores, a full sort per filter, a multinomial draw per row on the host."""
    scores = logits.double()
    params = rows[0].params
    if params.greedy:
        return [int(token) for token in scores.argmax(dim=-1).tolist()]
    scores = (scores - scores.max(dim=-1, keepdim=True).values) / params.temperature
    if params.top_k:
        ranked = torch.sort(scores, dim=-1, descending=True).values
        scores = scores.masked_fill(scores < ranked[:, params.top_k - 1:params.top_k], float("-inf"))
    if params.top_p < 1.0:
        ranked, order = torch.sort(scores, dim=-1, descending=True)
        probs = torch.softmax(ranked, dim=-1)
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(1, order, (probs.cumsum(-1) - probs) >= params.top_p)
        scores = scores.masked_fill(drop, float("-inf"))
    probs = torch.softmax(scores, dim=-1).cpu()
    return [int(torch.multinomial(probs[i], 1, generator=row.generator)) for i, row in enumerate(rows)]


def _time(step: object, logits: torch.Tensor, rows: list[SamplingRow], repeats: int, device: str) -> float:
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        started = time.perf_counter()
        step(logits, rows)  # type: ignore[operator]
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return median(times[1:]) * 1000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnipipe bench sampler", description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151_936, help="logits per row (default: the Qwen vocabulary)")
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--repeats", type=int, default=20, help="timed steps per cell (their median is shown)")
    parser.add_argument("--device", default="cpu", help="where the logits are, e.g. cuda")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--batches: comma-separated integers, got {args.batches!r}")
    if not batches or min(batches) < 1:
        parser.error("--batches: batch sizes of at least 1")
    if args.vocab < 64 or args.repeats < 1:
        parser.error("--vocab must be >= 64 and --repeats >= 1")
    try:
        device = torch.device(args.device)
        torch.zeros(1, device=device)
    except (RuntimeError, AssertionError) as exc:
        parser.error(f"--device: {args.device!r} cannot be used here ({exc})")
    table = []
    for batch in batches:
        logits = torch.randn(batch, args.vocab, generator=torch.Generator().manual_seed(batch)).mul_(3).to(device)
        for name, params in SETTINGS.items():
            rows = [SamplingRow(params, torch.Generator().manual_seed(i)) for i in range(batch)]
            old = _time(sort_based, logits, rows, args.repeats, args.device)
            new = _time(sample_next_tokens, logits, rows, args.repeats, args.device)
            table.append([batch, name, old, new, old / new])
            print(f"batch {batch} {name}: done", file=sys.stderr, flush=True)
    print(format_table(HEADERS, table, title=f"sampling step, vocab {args.vocab}, {args.device} "
                                             f"(median of {args.repeats})"))
    if args.json:
        write_json(args.json, {"machine": machine_info(), "vocab": args.vocab, "device": args.device,
                               "rows": [dict(zip(HEADERS, row, strict=True)) for row in table]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
