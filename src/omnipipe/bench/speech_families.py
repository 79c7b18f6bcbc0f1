"""``omnipipe bench speech-families``: what batching buys the speech families. ``--requests`` requests at once
through ``AsyncOmni`` (``--rounds`` such loads one after another) with every stage's ``max_num_seqs`` 8 beside 1,
per family: CSM's frames/s and seconds of speech per second, Voxtral's answer tokens/s about a clip, Voxtral
Realtime's transcript tokens/s, Moshi's frames/s and real-time factor for sessions fed whole clips; the ratio 8 over
1 beside them. Then each family's parameter
count at ``--size released``, counted on the meta device (nothing written, nothing allocated).

    omnipipe bench speech-families                                    # tiny checkpoints, written to a temporary folder
    omnipipe bench speech-families --families csm,moshi --csm DIR --moshi DIR --device cuda --dtype bfloat16

Every request is greedy. A family's figures count what its requests produced (the stage's units: tokens or frames),
so an answer a tiny checkpoint ends early is counted as it was, not as asked."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from omnipipe import AsyncOmni, SamplingParams
from omnipipe.bench.omni_load import omni_deploy
from omnipipe.bench.report import format_table, machine_info, write_json

FAMILIES = ("csm", "voxtral", "voxtral_realtime", "moshi")
BATCH_SIZES = (8, 1)
FRAME_RATE_HZ = 12.5  # Mimi frames a second: CSM's and Moshi's (one duplex step per 80 ms heard)
CLIP_RATE_HZ = 16000
TEXTS = ("hello from sesame.", "the quick brown fox", "one two three four", "a short sentence to say",
         "good morning to you", "what a lovely day", "speak slowly please", "this is the last one")
QUESTION = "What do you hear in this clip?"
# per family: (measure key, the table's label), the first the family's throughput
MEASURES: dict[str, tuple[tuple[str, str], ...]] = {
    "csm": (("frames_s", "frames/s"), ("audio_s_per_s", "audio s/s")),
    "voxtral": (("tokens_s", "answer tokens/s"),),
    "voxtral_realtime": (("tokens_s", "transcript tokens/s"),),
    "moshi": (("frames_s", "frames/s"), ("rtf", "user audio s/s (real-time factor)")),
}


@dataclass
class Done:
    """One request as it finished: the units its main stage produced, the seconds of audio it gave back and each
    stage's compute seconds for it (where the time went)."""

    units: int
    audio_s: float
    compute_s: dict[str, float] = field(default_factory=dict)


def clip(seconds: float, seed: int) -> np.ndarray:
    """A tone with a little noise at 16 kHz (the seed picks the pitch and the noise): audio the encoders hear."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * CLIP_RATE_HZ)) / CLIP_RATE_HZ
    tone = 0.3 * np.sin(2 * np.pi * (150 + 40 * seed) * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return (tone + 0.02 * rng.standard_normal(t.size)).astype(np.float32)


def requests_for(family: str, index: int, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Request ``index`` of ``family``: its prompt, its per-stage sampling params and its output modalities."""
    audio = {"audio": (clip(args.clip_seconds, index % 8), CLIP_RATE_HZ)}
    if family == "csm":  # /v1/audio/speech-like: a text, N frames
        return ({"prompt": TEXTS[index % len(TEXTS)]},
                {"backbone": SamplingParams(temperature=0, max_tokens=args.frames)}, ["audio"])
    if family == "voxtral":  # a chat about a clip
        return ({"prompt": QUESTION, "multi_modal_data": audio},
                {"thinker": SamplingParams(temperature=0, max_tokens=args.max_tokens)}, ["text"])
    if family == "voxtral_realtime":  # the clip's transcript, as long as the clip makes it
        return {"multi_modal_data": audio}, {"transcriber": SamplingParams(temperature=0)}, ["text"]
    # moshi: a session fed a whole clip, heard as if it streamed in; it ends with the clip
    return {"multi_modal_data": audio}, {"duplex": SamplingParams(temperature=0)}, ["text", "audio"]


MAIN_STAGE = {"csm": "backbone", "voxtral": "thinker", "voxtral_realtime": "transcriber", "moshi": "duplex"}


async def _one(engine: AsyncOmni, family: str, index: int, args: argparse.Namespace) -> Done:
    prompt, params, modalities = requests_for(family, index, args)
    done = Done(0, 0.0)
    async for out in engine.generate(prompt, sampling_params=params, output_modalities=modalities):
        if out.finished and out.metrics is not None:
            stages = out.metrics.stages
            done = Done(int(stages.get(MAIN_STAGE[family], {}).get("units", 0)), out.metrics.audio_duration_s,
                        {stage: float(stats.get("compute_s") or 0.0) for stage, stats in stages.items()})
    return done


async def _load(engine: AsyncOmni, family: str, count: int, args: argparse.Namespace) -> tuple[list[Done], float]:
    """``count`` requests sent at once; their outcomes and the wall time until the last finished."""
    start = time.perf_counter()
    done = await asyncio.gather(*(_one(engine, family, i, args) for i in range(count)))
    return list(done), time.perf_counter() - start


def figures(family: str, done: list[Done], wall_s: float) -> dict[str, float]:
    """The family's measures of one load: its units (tokens or frames) over the wall time, and for CSM the seconds
    of speech, for Moshi the seconds of user audio handled (a frame per 80 ms heard), over the wall time."""
    units = sum(d.units for d in done)
    result = {"wall_s": wall_s, "units": float(units)}
    for stage in sorted({stage for d in done for stage in d.compute_s}):  # summed over requests: overlapping
        result[f"compute_s.{stage}"] = sum(d.compute_s.get(stage, 0.0) for d in done)
    if family in ("csm", "moshi"):
        result["frames_s"] = units / wall_s
    else:
        result["tokens_s"] = units / wall_s
    if family == "csm":
        result["audio_s_per_s"] = sum(d.audio_s for d in done) / wall_s
    if family == "moshi":
        result["rtf"] = units / FRAME_RATE_HZ / wall_s
    return result


async def measure(family: str, model: str, max_num_seqs: int, args: argparse.Namespace) -> dict[str, float]:
    """``args.requests`` requests at once, ``args.rounds`` times one after another, through an engine whose stages
    take ``max_num_seqs`` each, after one warm-up request (so no start-up is timed); the figures over all rounds."""
    deploy = omni_deploy(family, model, max_num_seqs=max_num_seqs, device=args.device, dtype=args.dtype)
    done: list[Done] = []
    wall_s = 0.0
    async with AsyncOmni(family, deploy) as engine:
        await _load(engine, family, 1, args)
        for _ in range(args.rounds):
            finished, seconds = await _load(engine, family, args.requests, args)
            done += finished
            wall_s += seconds
    return figures(family, done, wall_s)


def _count(build: Callable[[], Any]) -> int:
    import torch

    with torch.device("meta"):
        model = build()
    return sum(param.numel() for param in model.parameters())


def released_parameters(family: str) -> int:
    """The parameters of ``family``'s model at ``--size released``, built on the meta device from the config the
    family's own writer uses (``weights/tiny.py``); nothing is written or allocated."""
    if family == "csm":
        from transformers import CsmForConditionalGeneration

        from omnipipe.models.csm.weights.tiny import released_config, tokenizer

        return _count(lambda: CsmForConditionalGeneration(released_config(tokenizer())))
    if family == "voxtral":
        from transformers import VoxtralForConditionalGeneration

        from omnipipe.models.voxtral.weights.tiny import RELEASED
        from omnipipe.models.voxtral.weights.tiny import _config as voxtral_config

        # the released vocabulary replaces the tokenizer's
        return _count(lambda: VoxtralForConditionalGeneration(
            voxtral_config(RELEASED["text"]["vocab_size"], "released", None)))
    if family == "voxtral_realtime":
        from transformers import VoxtralRealtimeForConditionalGeneration

        from omnipipe.models.voxtral_realtime.weights.tiny import RELEASED as REALTIME
        from omnipipe.models.voxtral_realtime.weights.tiny import _config as realtime_config

        return _count(lambda: VoxtralRealtimeForConditionalGeneration(
            realtime_config(REALTIME["text"]["vocab_size"], "released", None)))
    if family == "moshi":
        from transformers import MoshiForConditionalGeneration

        from omnipipe.models.moshi.weights.tiny import RELEASED_VOCAB
        from omnipipe.models.moshi.weights.tiny import _config as moshi_config

        return _count(lambda: MoshiForConditionalGeneration(moshi_config(RELEASED_VOCAB, "released", None)))
    raise ValueError(f"family: one of {', '.join(FAMILIES)}, got {family!r}")


def format_report(rows: list[dict[str, Any]], requests: int) -> str:
    """One line per family and measure: max_num_seqs 8, 1 and their ratio; then the released parameter counts."""
    lines = []
    for row in rows:
        by_size = row["by_max_num_seqs"]
        for key, label in MEASURES[row["family"]]:
            eight, one = by_size[8][key], by_size[1][key]
            lines.append([row["family"], label, eight, one, eight / one if one else None])
    batching = format_table(["Family", "Measure", "max_num_seqs 8", "max_num_seqs 1", "8 / 1"], lines,
                            title=f"{requests} requests at once through AsyncOmni")
    sizes = format_table(["Family", "Parameters at --size released"],
                         [[row["family"], f"{row['released_parameters']:,}"] for row in rows],
                         title="Counted on the meta device")
    return f"{batching}\n\n{sizes}"


def _checkpoints(args: argparse.Namespace, families: list[str], scratch: Path) -> dict[str, str]:
    """Each family's checkpoint: the one given, else a tiny one written into ``scratch``."""
    from omnipipe.models.registry import TINY_CHECKPOINTS
    from omnipipe.util.dotted import resolve

    return {family: getattr(args, family) or str(resolve(TINY_CHECKPOINTS[family])(scratch / family, seed=0))
            for family in families}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnipipe bench speech-families", description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help="which families, comma-separated")
    for family in FAMILIES:
        parser.add_argument(f"--{family.replace('_', '-')}", dest=family, default=None,
                            help=f"a {family} checkpoint (default: a tiny one)")
    parser.add_argument("--requests", type=int, default=8, help="requests at once (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="loads of --requests, one after another (default 3)")
    parser.add_argument("--frames", type=int, default=25, help="csm: frames a reply (12.5 a second; default 25)")
    parser.add_argument("--max-tokens", type=int, default=32, help="voxtral: answer tokens at most (default 32)")
    parser.add_argument("--clip-seconds", type=float, default=2.0,
                        help="voxtral, voxtral_realtime, moshi: each request's clip (default 2.0)")
    parser.add_argument("--device", default=None, help="every stage's device, e.g. cuda")
    parser.add_argument("--dtype", default=None, help="every stage's dtype: auto, float32, bfloat16, float16")
    parser.add_argument("--json", help="also write the raw figures here")
    args = parser.parse_args(argv)
    families = args.families.split(",")
    if not families or any(f not in FAMILIES for f in families) or len(set(families)) != len(families):
        parser.error(f"--families: comma-separated, each once, of {', '.join(FAMILIES)}")
    if min(args.requests, args.rounds, args.frames, args.max_tokens) < 1:
        parser.error("--requests, --rounds, --frames and --max-tokens must be >= 1")
    if not 0.1 <= args.clip_seconds <= 30:
        parser.error("--clip-seconds must be in [0.1, 30]")
    rows = []
    with tempfile.TemporaryDirectory(prefix="omnipipe-bench-") as scratch:
        for family, model in _checkpoints(args, families, Path(scratch)).items():
            sizes = {size: asyncio.run(measure(family, model, size, args)) for size in BATCH_SIZES}
            rows.append({"family": family, "model": model, "by_max_num_seqs": sizes,
                         "released_parameters": released_parameters(family)})
    print(format_report(rows, args.requests))
    if args.json:
        settings = {"requests": args.requests, "rounds": args.rounds, "frames": args.frames,
                    "max_tokens": args.max_tokens, "clip_seconds": args.clip_seconds, "device": args.device,
                    "dtype": args.dtype}
        write_json(args.json, {"machine": machine_info(), **settings, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
