"""``omnipipe bench images``: the image pipeline's throughput and latency under the diffusion stage's three
batching policies, side by side in one run.

Each policy (``step``: step-level continuous batching; ``request``: a batch forms when the previous one has wholly
finished; ``none``: one request at a time) gets its own engine; at each concurrency ``c``, ``c`` clients each send
requests back to back (a closed loop) until ``--requests`` have finished. Requests ask for different step counts
(cycling through ``--steps``, as clients with different quality settings would), which is where step-level
batching differs most from request-level. Images/s is finished requests over the wall time of the level;
latency is each request's end to end.

    omnipipe bench images [--concurrency 1,4,16] [--requests 32] [--steps 10,25,50] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from omnipipe.bench.report import format_table, machine_info, percentile, write_json

PIPELINE = "image"
POLICIES = ("step", "request", "none")
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


@dataclass
class Level:
    policy: str
    concurrency: int
    wall_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    max_batch: int = 0

    @property
    def images_per_s(self) -> float:
        return len(self.latencies_s) / self.wall_s if self.wall_s else 0.0


async def _run_policy(policy: str, concurrency: Sequence[int], requests: int, steps: Sequence[int],
                      max_num_seqs: int, say: Any) -> list[Level]:
    from omnipipe import AsyncOmni, SamplingParams

    deploy = {"stages": {"diffusion": {"max_num_seqs": max_num_seqs, "options": {"batching": policy}}}}
    levels = []
    async with AsyncOmni(PIPELINE, deploy) as engine:
        async def draw(index: int) -> tuple[float, int]:
            params = SamplingParams(seed=index, extra={"steps": steps[index % len(steps)]})
            start = time.perf_counter()
            final = None
            async for out in engine.generate(f"draw a {DIGITS[index % 10]}", sampling_params=params):
                final = out
            assert final is not None and final.image is not None and final.metrics is not None
            batch = final.metrics.stages.get("diffusion", {}).get("max_batch_size", 0)
            return time.perf_counter() - start, batch

        await draw(0)  # first-use costs out of the figures
        for c in concurrency:
            level = Level(policy, c)
            counter = iter(range(requests))

            async def client(level: Level, counter: Iterator[int]) -> None:
                for index in counter:
                    latency, batch = await draw(index)
                    level.latencies_s.append(latency)
                    level.max_batch = max(level.max_batch, batch)

            start = time.perf_counter()
            await asyncio.gather(*(client(level, counter) for _ in range(c)))
            level.wall_s = time.perf_counter() - start
            levels.append(level)
            say(f"{policy:>7} c={c:<3} {level.images_per_s:6.2f} images/s")
    return levels


def format_report(levels: list[Level], steps: Sequence[int]) -> str:
    base = {(lv.concurrency): lv.images_per_s for lv in levels if lv.policy == "request"}
    rows = []
    for lv in sorted(levels, key=lambda x: (x.concurrency, POLICIES.index(x.policy))):
        ratio = lv.images_per_s / base[lv.concurrency] if base.get(lv.concurrency) else None
        rows.append((lv.concurrency, lv.policy, lv.images_per_s, ratio, percentile(lv.latencies_s, 50) * 1e3,
                     percentile(lv.latencies_s, 99) * 1e3, lv.max_batch))
    table = format_table(["c", "batching", "images/s", "x request-level", "p50 ms", "p99 ms", "max batch"], rows,
                         title=f"image pipeline (digits, steps cycling {'/'.join(map(str, steps))}), closed loop")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnipipe bench images", description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts")
    parser.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    parser.add_argument("--steps", default="10,25,50", help="the step counts requests cycle through")
    parser.add_argument("--policies", default=",".join(POLICIES), help="batching policies to compare")
    parser.add_argument("--max-num-seqs", type=int, default=16, help="the diffusion stage's batch limit")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args(argv)
    try:
        concurrency = [int(c) for c in args.concurrency.split(",")]
        steps = [int(s) for s in args.steps.split(",")]
    except ValueError:
        parser.error("--concurrency and --steps take comma-separated integers")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies or any(p not in POLICIES for p in policies):
        parser.error(f"--policies: choose from {', '.join(POLICIES)}")
    if any(c < 1 for c in concurrency) or any(not 1 <= s <= 1000 for s in steps) or args.requests < 1:
        parser.error("--concurrency and --requests must be >= 1, --steps in [1, 1000]")

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    levels: list[Level] = []
    for policy in policies:
        levels += asyncio.run(_run_policy(policy, concurrency, args.requests, steps, args.max_num_seqs, say))
    print(format_report(levels, steps))
    if args.json:
        write_json(args.json, {"machine": machine_info(), "steps": steps, "levels": [
            {"policy": lv.policy, "concurrency": lv.concurrency, "wall_s": lv.wall_s, "latencies_s": lv.latencies_s,
             "images_per_s": lv.images_per_s, "max_batch": lv.max_batch} for lv in levels]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
