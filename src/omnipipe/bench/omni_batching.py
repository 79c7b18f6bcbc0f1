"""``omnipipe bench offline --pipeline qwen3_omni|qwen2_5_omni --model DIR``: a Qwen-Omni pipeline's aggregate
throughput with its stages batched (one forward per step for every running request) beside the same stages stepped
one request at a time (every stage's ``step_per_request: true``), at each concurrency, in one run.

    omnipipe bench offline --pipeline qwen3_omni --model DIR --concurrency 1,8,32
    omnipipe bench offline --pipeline qwen2_5_omni --model DIR --device cuda --dtype bfloat16 --concurrency 1,8,32,64

Per row: thinker tokens/s and talker frames/s (all requests' over the wall time), streams kept in real time
(``bench/omni_load.py``), TTFP p50/p99; then the batched/per-request ratio of each. ``omnipipe tiny-checkpoint
FAMILY DIR --size released`` writes a checkpoint of the released sizes to measure on a GPU without a download."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any

from omnipipe import AsyncOmni
from omnipipe.bench.omni_load import (
    OMNI_PIPELINES,
    LoadResult,
    omni_deploy,
    run_load,
    stage_params,
    warm_up,
)
from omnipipe.bench.report import format_table, machine_info, write_json

SETTINGS = {"on": False, "off": True}  # batching -> step_per_request
AUDIO = ["text", "audio"]


def _row(setting: str, concurrency: int, result: LoadResult) -> dict[str, Any]:
    kept, with_audio = result.real_time_streams()
    return {"batching": setting, "concurrency": concurrency, "requests": len(result.streams),
            "wall_s": result.wall_s, "thinker_tok_s": result.thinker_tokens_per_s(),
            "talker_frames_s": result.talker_frames_per_s(), "audio_s_per_s": result.audio_s_per_s(),
            "real_time": kept, "with_audio": with_audio,
            "ttfp_p50_ms": result.ttfp_ms(50), "ttfp_p99_ms": result.ttfp_ms(99)}


async def setting_rows(args: argparse.Namespace, setting: str, concurrencies: list[int]) -> list[dict[str, Any]]:
    """One engine with batching ``setting`` (on/off), a load per concurrency."""
    deploy = omni_deploy(args.pipeline, args.model, max_num_seqs=max(concurrencies),
                         step_per_request=SETTINGS[setting], device=args.device, dtype=args.dtype)
    params = stage_params(args.max_tokens, args.talker_frames)
    rows = []
    async with AsyncOmni(args.pipeline, deploy) as engine:
        await warm_up(engine, params, AUDIO)
        for concurrency in concurrencies:
            result = await run_load(engine, concurrency * args.rounds, concurrency, params, AUDIO)
            rows.append(_row(setting, concurrency, result))
    return rows


def _ratio(on: float | None, off: float | None) -> float | None:
    return on / off if on is not None and off else None


def format_report(rows: list[dict[str, Any]]) -> str:
    """The rows, then per concurrency the batched/per-request ratios."""
    main = format_table(
        ["Batching", "Conc.", "Requests", "Thinker tok/s", "Talker frames/s", "Audio s/s", "Real-time streams",
         "TTFP p50 (ms)", "TTFP p99 (ms)", "Wall (s)"],
        [[r["batching"], r["concurrency"], r["requests"], r["thinker_tok_s"], r["talker_frames_s"],
          r["audio_s_per_s"], f"{r['real_time']}/{r['with_audio']}", r["ttfp_p50_ms"], r["ttfp_p99_ms"],
          r["wall_s"]] for r in rows])
    pairs = []
    for on in (r for r in rows if r["batching"] == "on"):
        off = next((r for r in rows if r["batching"] == "off" and r["concurrency"] == on["concurrency"]), None)
        if off is not None:
            pairs.append([on["concurrency"], on["thinker_tok_s"], off["thinker_tok_s"],
                          _ratio(on["thinker_tok_s"], off["thinker_tok_s"]), on["talker_frames_s"],
                          off["talker_frames_s"], _ratio(on["talker_frames_s"], off["talker_frames_s"]),
                          f"{on['real_time']} / {off['real_time']}", _ratio(on["ttfp_p50_ms"], off["ttfp_p50_ms"])])
    if not pairs:
        return main
    side = format_table(["Conc.", "Thinker tok/s on", "off", "on/off", "Talker frames/s on", "off", "on/off",
                         "Real-time on / off", "TTFP p50 on/off"], pairs,
                        title="Batched (on) beside one request per runner call (off)")
    return main + "\n\n" + side


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pipeline", choices=OMNI_PIPELINES, required=True)
    parser.add_argument("--model", required=True, help="the checkpoint directory (`omnipipe tiny-checkpoint FAMILY "
                        "DIR [--size released]` writes a random one)")
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated requests in flight (default 1,8,32)")
    parser.add_argument("--rounds", type=int, default=2, help="requests per load: concurrency x rounds (default 2)")
    parser.add_argument("--max-tokens", type=int, default=64, help="thinker tokens per answer (default 64)")
    parser.add_argument("--talker-frames", type=int, default=None, help="the talker's cap in codec frames per "
                        "answer (default: the talker's own)")
    parser.add_argument("--settings", default="on,off", help="batching on, off or on,off (default on,off)")
    parser.add_argument("--device", default=None, help="every stage's device, e.g. cuda (default: the deploy's)")
    parser.add_argument("--dtype", default=None, help="every stage's dtype: auto, float32, bfloat16, float16")
    parser.add_argument("--json", help="also write the raw figures here")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnipipe bench offline", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error("--concurrency: comma-separated integers, e.g. 1,8,32")
    if not concurrencies or min(concurrencies) < 1 or args.rounds < 1 or args.max_tokens < 1:
        parser.error("--concurrency, --rounds and --max-tokens must be >= 1")
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if not settings or any(s not in SETTINGS for s in settings):
        parser.error("--settings: on, off or on,off")
    rows = []
    for setting in settings:
        rows += asyncio.run(setting_rows(args, setting, concurrencies))
    print(format_report(rows))
    if args.json:
        write_json(args.json, {"machine": machine_info(), "pipeline": args.pipeline, "rows": rows})
    return 0
