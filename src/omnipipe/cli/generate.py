"""``omnipipe generate``: answer one question (text and/or spoken) and write the spoken answer or the image.

    omnipipe generate "What is the capital of France?" --output answer.wav [--stats]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omnipipe.cli.errors import CLIError
from omnipipe.cli.pipeline_flags import add_pipeline_flags, deploy_source

_PROMPT_FLAGS = {"prompt.multi_modal_data.image": "--image", "prompt.multi_modal_data.audio": "--audio-in",
                 "prompt.multi_modal_data.video": "--video"}


def add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="answer one question (text and/or spoken) and write the spoken answer")
    p.add_argument("prompt", nargs="?", default="", help="the question as text")
    p.add_argument("--audio-in", type=Path, help="a spoken question (wav/flac/ogg/mp3)")
    p.add_argument("--image", type=Path, action="append", default=[], metavar="FILE",
                   help="an image attached to the question (png/jpeg/webp; repeat for several)")
    p.add_argument("--video", type=Path, action="append", default=[], metavar="FILE",
                   help="a video attached to the question (mp4/webm/...; sampled at the thinker's video_fps; "
                        "repeat for several; pipelines that take video: qwen3_omni, qwen2_5_omni)")
    p.add_argument("--output", "-o", type=Path, help="where to write the spoken answer (WAV) or the image (PNG, "
                   "WebP, JPEG); without it the answer is text only")
    add_pipeline_flags(p)
    p.add_argument("--no-async-chunk", action="store_true", help="hand whole outputs between stages")
    p.add_argument("--text-only", action="store_true", help="produce text only (even with --output)")
    p.add_argument("--max-tokens", type=int, default=None, help="most tokens the thinker writes")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (0: greedy)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed, for a repeatable answer")
    p.add_argument("--stats", action="store_true", help="print the request's metrics table")
    p.add_argument("--verbose", "-v", action="store_true")


def run_generate(args: argparse.Namespace) -> int:
    return asyncio.run(_generate(args))


def _prompt(args: argparse.Namespace, pipeline: Any) -> Any:
    """The prompt the flags make: the text alone, or with the media attached (each file checked)."""
    from omnipipe.util.audio import load_audio

    takes = pipeline.input_modalities
    media: dict[str, Any] = {}
    if args.audio_in is not None:
        if "audio" not in takes:
            raise CLIError(f"--audio-in: pipeline {pipeline.name!r} takes {' and '.join(takes)}, not audio")
        if not args.audio_in.is_file():
            raise CLIError(f"--audio-in: file not found: {args.audio_in}")
        media["audio"] = load_audio(args.audio_in)
    for flag, key, paths in (("--image", "image", args.image), ("--video", "video", args.video)):
        if not paths:
            continue
        if key not in takes:
            raise CLIError(f"{flag}: pipeline {pipeline.name!r} takes {' and '.join(takes)}, not {key}s")
        missing = [str(path) for path in paths if not path.is_file()]
        if missing:
            raise CLIError(f"{flag}: file not found: {missing[0]}")
        media[key] = [str(path) for path in paths]
    if media:  # which combinations a pipeline takes is its prompt processor's rule (a one-line error otherwise)
        return {"prompt": args.prompt, "multi_modal_data": media}
    if "text" not in takes:
        raise CLIError(f"pipeline {pipeline.name!r} takes {' and '.join(takes)}, not a text prompt: "
                       "use --audio-in FILE")
    if not args.prompt.strip():
        raise CLIError("give a question as text, or --audio-in FILE")
    return args.prompt


def _check_prompt(pipeline: Any, prompt: Any) -> None:
    """The pipeline's own rules for a prompt, before any model loads: a mistake is one line naming the flag."""
    from omnipipe.api.prompt import normalize_prompt
    from omnipipe.util.dotted import resolve
    from omnipipe.util.field_error import FieldError

    try:
        resolve(pipeline.prompt_processor)(normalize_prompt(prompt, pipeline.input_modalities,
                                                            pipeline.takes_history))
    except FieldError as exc:
        flag = next((f for key, f in _PROMPT_FLAGS.items() if exc.field.startswith(key)), "prompt")
        raise CLIError(f"{flag}: {exc.rule}") from None


def _sampling_params(args: argparse.Namespace) -> Any:
    """``SamplingParams`` with what the flags set, or None (the pipeline's defaults)."""
    from omnipipe import SamplingParams

    overrides = {k: v for k, v in (("max_tokens", args.max_tokens), ("temperature", args.temperature),
                                   ("seed", args.seed)) if v is not None}
    return SamplingParams(**overrides) if overrides else None


def _check_output(args: argparse.Namespace, pipeline: Any) -> None:
    """``--output`` fits what the pipeline makes (and the answer goes somewhere)."""
    from omnipipe.util.image import format_for_path

    if args.output is not None and args.output.parent and not args.output.parent.exists():
        raise CLIError(f"--output: directory does not exist: {args.output.parent}")
    draws = "image" in pipeline.output_modalities
    if draws and args.output is not None and format_for_path(args.output) is None:
        raise CLIError(f"--output: pipeline {pipeline.name!r} draws images: give a .png, .webp or .jpg file")
    if "text" not in pipeline.output_modalities and (args.output is None or args.text_only):
        what = "draws: give --output FILE.png" if draws else "only speaks: give --output FILE.wav"
        raise CLIError(f"pipeline {pipeline.name!r} {what}")


async def _generate(args: argparse.Namespace) -> int:
    from omnipipe import AsyncOmni

    pipeline, deploy = deploy_source(args)
    prompt = _prompt(args, pipeline)
    _check_prompt(pipeline, prompt)
    params = _sampling_params(args)
    _check_output(args, pipeline)
    # speech and images are made only where they go somewhere: without --output the answer is text only
    modalities = ["text"] if args.text_only or args.output is None else None
    final = None
    async with AsyncOmni(pipeline, deploy, log_level="INFO" if args.verbose else "WARNING",
                         progress=_progress_printer()) as engine:
        async for out in engine.generate(prompt, sampling_params=params, output_modalities=modalities):
            if out.modality == "text":
                print(out.text_delta, end="", flush=True)
            if out.finished:
                final = out
    if final is not None and final.text:
        print()
    assert final is not None
    _write_answer(args, final, modalities == ["text"], "image" in pipeline.output_modalities)
    if args.stats and final.metrics is not None:
        from omnipipe.api.metrics import format_request_metrics

        print(format_request_metrics(final.metrics))
    return 0


def _write_answer(args: argparse.Namespace, final: Any, text_only: bool, draws: bool) -> None:
    """The image or the speech of the answer to ``--output``, said on stderr (or why nothing was written)."""
    from omnipipe.util.audio import write_wav
    from omnipipe.util.image import encode_image, format_for_path

    if final.image is not None and args.output is not None:
        fmt = format_for_path(args.output)
        assert fmt is not None
        args.output.write_bytes(encode_image(final.image, fmt))
        height, width = final.image.shape[:2]
        print(f"wrote {args.output} ({width}x{height} image)", file=sys.stderr)
    elif final.audio is not None and final.audio.size:
        if args.output is not None:
            write_wav(args.output, final.audio, final.sample_rate_hz or 0)
            print(f"wrote {args.output} ({final.audio_duration_s:.2f} s of audio)", file=sys.stderr)
    elif args.output is not None:
        why = "text-only output" if text_only else "the answer had none"
        print(f"no {'image' if draws else 'audio'} was produced ({why}); {args.output} not written", file=sys.stderr)


def _progress_printer() -> Callable[[str], None]:
    """Start-up lines on stderr with the seconds since the command started (the answer goes to stdout)."""
    start = time.monotonic()

    def say(line: str) -> None:
        print(f"omnipipe: {line} [{time.monotonic() - start:.0f} s]", file=sys.stderr, flush=True)

    return say
