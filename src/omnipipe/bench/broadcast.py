"""``omnipipe bench broadcast``: a tensor-parallel thinker (two rank processes, gloo over loopback) serving
questions with an attached 1280x720 image, under the three input-broadcast modes side by side in one run.

Each mode (``blocking``: rank 0 decodes the image and broadcasts the decoded pixels inside its stage loop;
``async``: the same on a background thread; ``async_raw``: the encoded bytes go out on a background thread and
every rank decodes them) gets its own engine of the default pipeline with ``tensor_parallel_size: 2`` (text out
only). At each concurrency ``c``, ``c`` clients send requests back to back (a closed loop) until ``c *
--requests-per-client`` have finished. Reported per level: requests/s and its ratio to ``blocking``, p50/p99
latency, CPU use (CPU seconds of the engine and both rank processes over the wall time, in cores), and per request
(medians, on rank 0) how long decoding the image took, how long moving it to the other rank took, and how long the
prefill waited for it.

    omnipipe bench broadcast [--concurrency 1,8,32] [--requests-per-client 2] [--max-tokens 8]
                             [--modes blocking,async,async_raw] [--format jpeg|png] [--images-per-request 1-4]
                             [--model qwen2.5-coder-0.5b-instruct|gemma3-270m] [--json FILE]

``python -m omnipipe.bench.mm_broadcast`` measures the same wire forms without the engine (two bare ranks).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from omnipipe.bench.mm_broadcast import photo_like
from omnipipe.bench.report import format_table, machine_info, median, percentile, write_json
from omnipipe.stage.broadcast import MODES

QUESTIONS = ("What is in this picture?", "Describe the image in a few words.", "What colour is this image mostly?",
             "Is this picture bright or dark?")


@dataclass
class Level:
    mode: str
    concurrency: int
    wall_s: float = 0.0
    cpu_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    materialize_s: list[float] = field(default_factory=list)
    broadcast_s: list[float] = field(default_factory=list)
    wait_s: list[float] = field(default_factory=list)

    @property
    def qps(self) -> float:
        return len(self.latencies_s) / self.wall_s if self.wall_s else 0.0

    @property
    def cores(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s else 0.0


def _cpu_seconds(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


async def _run_mode(mode: str, concurrency: Sequence[int], per_client: int, max_tokens: int, images: list[bytes],
                    per_request: int, model: str, say: Any) -> list[Level]:
    from omnipipe import AsyncOmni, SamplingParams

    deploy = {"stages": {"thinker": {"tensor_parallel_size": 2, "input_broadcast": mode, "options": {"model": model}}}}
    params = SamplingParams(max_tokens=max_tokens)
    levels = []
    async with AsyncOmni("default", deploy) as engine:
        state = await engine.debug_state()
        pids = [psutil.Process().pid, *state["rank_pids"]["thinker"]]

        async def ask(index: int, level: Level | None) -> None:
            prompt = {"prompt": QUESTIONS[index % len(QUESTIONS)],
                      "multi_modal_data": {"image": [images[(index + k) % len(images)] for k in range(per_request)]}}
            start = time.perf_counter()
            final = None
            async for out in engine.generate(prompt, sampling_params=params, output_modalities=["text"]):
                final = out
            assert final is not None and final.finished and final.metrics is not None
            if level is not None:
                level.latencies_s.append(time.perf_counter() - start)
                thinker = final.metrics.stages.get("thinker", {})
                level.materialize_s.append(thinker.get("attachments_materialize_s", 0.0))
                level.broadcast_s.append(thinker.get("attachments_broadcast_s", 0.0))
                level.wait_s.append(thinker.get("attachments_wait_s", 0.0))

        await ask(0, None)  # first-use costs out of the figures
        for c in concurrency:
            level = Level(mode, c)
            counter = iter(range(c * per_client))

            async def client(level: Level = level, counter: Any = counter) -> None:
                for index in counter:
                    await ask(index, level)

            cpu_before, start = _cpu_seconds(pids), time.perf_counter()
            await asyncio.gather(*(client() for _ in range(c)))
            level.wall_s = time.perf_counter() - start
            level.cpu_s = _cpu_seconds(pids) - cpu_before
            levels.append(level)
            say(f"{mode:>9} c={c:<3} {level.qps:6.2f} req/s, p50 {percentile(level.latencies_s, 50) * 1e3:.0f} ms")
    return levels


def format_report(levels: list[Level], image_bytes: int, image_format: str, max_tokens: int, per_request: int,
                  model: str) -> str:
    base = {lv.concurrency: lv for lv in levels if lv.mode == "blocking"}
    rows = []
    for lv in sorted(levels, key=lambda x: (x.concurrency, MODES.index(x.mode))):
        ref = base.get(lv.concurrency)
        ratio = lv.qps / ref.qps if ref is not None and ref.qps else None
        p50 = percentile(lv.latencies_s, 50)
        p50_ratio = p50 / percentile(ref.latencies_s, 50) if ref is not None and ref.latencies_s else None
        rows.append((lv.concurrency, lv.mode, lv.qps, ratio, p50 * 1e3, p50_ratio, percentile(lv.latencies_s, 99) * 1e3,
                     lv.cores, median(lv.materialize_s) * 1e3, median(lv.broadcast_s) * 1e3, median(lv.wait_s) * 1e3))
    return format_table(
        ["c", "mode", "req/s", "x blocking", "p50 ms", "p50 x blocking", "p99 ms", "CPU cores", "decode ms",
         "broadcast ms", "prefill waited ms"], rows,
        title=f"TP=2 {model} thinker (gloo, 1 thread a rank), {per_request} x 1280x720 {image_format.upper()} "
              f"({image_bytes / 1024:.0f} kB each) with each question, {max_tokens} tokens out, closed loop; "
              "per-request columns are medians on rank 0 (all of a request's images)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnipipe bench broadcast", description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts")
    parser.add_argument("--requests-per-client", type=int, default=2, help="requests each client sends per level")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens each answer may have")
    parser.add_argument("--modes", default=",".join(MODES), help="input-broadcast modes to compare")
    parser.add_argument("--format", choices=("jpeg", "png"), default="jpeg", help="how the images are encoded")
    parser.add_argument("--images-per-request", type=int, default=1, choices=range(1, 5), metavar="1-4",
                        help="images attached to each question")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct",
                        help="the thinker (qwen2.5-coder-0.5b-instruct or gemma3-270m)")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args(argv)
    try:
        concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        parser.error("--concurrency takes comma-separated integers")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    if any(c < 1 for c in concurrency) or args.requests_per_client < 1 or args.max_tokens < 1:
        parser.error("--concurrency, --requests-per-client and --max-tokens must be >= 1")

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    images = [photo_like(args.format, seed) for seed in range(8)]
    levels: list[Level] = []
    for mode in modes:
        levels += asyncio.run(_run_mode(mode, concurrency, args.requests_per_client, args.max_tokens, images,
                                        args.images_per_request, args.model, say))
    print(format_report(levels, len(images[0]), args.format, args.max_tokens, args.images_per_request, args.model))
    if args.json:
        write_json(args.json, {"machine": machine_info(), "image_bytes": len(images[0]), "model": args.model,
                               "images_per_request": args.images_per_request, "levels": [
            {"mode": lv.mode, "concurrency": lv.concurrency, "wall_s": lv.wall_s, "cpu_s": lv.cpu_s,
             "latencies_s": lv.latencies_s, "materialize_s": lv.materialize_s, "broadcast_s": lv.broadcast_s,
             "wait_s": lv.wait_s} for lv in levels]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
