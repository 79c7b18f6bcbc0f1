"""``omnipipe bench max-num-seqs``: what a Python user gets from batching. 8 requests at once through ``AsyncOmni``
with every stage's ``max_num_seqs`` 8 beside 1, for each Qwen-Omni family: text-only tokens/s, and seconds of audio
per second of wall time with text and audio out; the ratio 8 over 1 beside them.

    omnipipe bench max-num-seqs                                   # tiny checkpoints, written to a temporary folder
    omnipipe bench max-num-seqs --qwen3-omni DIR --qwen2-5-omni DIR --device cuda --dtype bfloat16

It is the user's view of ``bench offline --pipeline qwen3_omni|qwen2_5_omni`` (``bench/omni_batching.py``): the same
engine, configured only through the deploy's ``max_num_seqs``."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omnipipe import AsyncOmni
from omnipipe.bench.omni_load import OMNI_PIPELINES, omni_deploy, run_load, stage_params, warm_up
from omnipipe.bench.report import format_table, machine_info, write_json

BATCH_SIZES = (8, 1)
TEXT, AUDIO = ["text"], ["text", "audio"]


async def measure(pipeline: str, model: str, max_num_seqs: int, args: argparse.Namespace) -> dict[str, float]:
    """Text-only tokens/s and text+audio audio s/s of ``args.requests`` requests at once."""
    deploy = omni_deploy(pipeline, model, max_num_seqs=max_num_seqs, device=args.device, dtype=args.dtype)
    params = stage_params(args.max_tokens, args.talker_frames)
    async with AsyncOmni(pipeline, deploy) as engine:
        await warm_up(engine, params, AUDIO)
        text = await run_load(engine, args.requests, args.requests, params, TEXT)
        audio = await run_load(engine, args.requests, args.requests, params, AUDIO)
    return {"text_tok_s": text.thinker_tokens_per_s(), "audio_s_per_s": audio.audio_s_per_s()}


def format_report(rows: list[dict[str, Any]], requests: int) -> str:
    """One line per family and measure: max_num_seqs 8, 1, and their ratio."""
    lines = []
    for row in rows:
        by_size = row["by_max_num_seqs"]
        for key, label in (("text_tok_s", "text only, tokens/s"), ("audio_s_per_s", "text+audio, audio s/s")):
            eight, one = by_size[8][key], by_size[1][key]
            lines.append([row["pipeline"], label, eight, one, eight / one if one else None])
    return format_table(["Pipeline", "Measure", "max_num_seqs 8", "max_num_seqs 1", "8 / 1"], lines,
                        title=f"{requests} requests at once through AsyncOmni")


def _checkpoints(args: argparse.Namespace, scratch: Path) -> dict[str, str]:
    """Each family's checkpoint: the one given, else a tiny one written into ``scratch``."""
    from omnipipe.models.registry import TINY_CHECKPOINTS
    from omnipipe.util.dotted import resolve

    given = {"qwen3_omni": args.qwen3_omni, "qwen2_5_omni": args.qwen2_5_omni}
    chosen = {}
    for pipeline in args.pipelines.split(","):
        directory = given[pipeline] or str(resolve(TINY_CHECKPOINTS[pipeline])(scratch / pipeline))
        chosen[pipeline] = directory
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnipipe bench max-num-seqs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--qwen3-omni", help="a Qwen3-Omni checkpoint (default: a tiny one)")
    parser.add_argument("--qwen2-5-omni", help="a Qwen2.5-Omni checkpoint (default: a tiny one)")
    parser.add_argument("--pipelines", default=",".join(OMNI_PIPELINES), help="which families, comma-separated")
    parser.add_argument("--requests", type=int, default=8, help="requests at once (default 8)")
    parser.add_argument("--max-tokens", type=int, default=64, help="thinker tokens per answer (default 64)")
    parser.add_argument("--talker-frames", type=int, default=None, help="the talker's cap in codec frames")
    parser.add_argument("--device", default=None, help="every stage's device, e.g. cuda")
    parser.add_argument("--dtype", default=None, help="every stage's dtype: auto, float32, bfloat16, float16")
    parser.add_argument("--json", help="also write the raw figures here")
    args = parser.parse_args(argv)
    if any(p not in OMNI_PIPELINES for p in args.pipelines.split(",")):
        parser.error(f"--pipelines: comma-separated, of {', '.join(OMNI_PIPELINES)}")
    if args.requests < 1 or args.max_tokens < 1:
        parser.error("--requests and --max-tokens must be >= 1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="omnipipe-bench-") as scratch:
        for pipeline, model in _checkpoints(args, Path(scratch)).items():
            sizes = {size: asyncio.run(measure(pipeline, model, size, args)) for size in BATCH_SIZES}
            rows.append({"pipeline": pipeline, "model": model, "by_max_num_seqs": sizes})
    print(format_report(rows, args.requests))
    if args.json:
        write_json(args.json, {"machine": machine_info(), "requests": args.requests, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
