"""``omnipipe models`` (the pipelines: whether their weights are ready, what each takes and gives and which pipelines
serve its audio endpoints, what it needs) and ``omnipipe download`` (prepare the weights in the cache)."""

from __future__ import annotations

import argparse

from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.models.registry import PIPELINES, get_pipeline


def add_models(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("models", help="list pipelines, their modalities, what they need and whether their weights are "
                   "ready")


def serves(pipeline: PipelineSpec) -> str:
    """What a pipeline takes and gives, the pipelines a server running it starts for its speech and transcription
    endpoints, and a transcription pipeline's languages, read from its spec (``serving``: ``ServingTraits``)."""
    parts = [f"{', '.join(pipeline.input_modalities)} in -> {', '.join(pipeline.output_modalities) or 'nothing'} out"]
    traits = pipeline.serving
    for endpoint, companion in (("speech", traits.speech_pipeline), ("transcriptions", traits.transcription_pipeline)):
        if companion is not None:
            parts.append(f"/v1/audio/{endpoint}: {companion}")
    if pipeline.input_modalities == ("audio",) and pipeline.output_modalities == ["text"]:
        parts.append(f"languages: {', '.join(traits.transcription_languages)}")
    return "; ".join(parts)


def run_models(args: argparse.Namespace) -> int:
    from omnipipe.models.preparation import pipeline_status

    width = max(len(name) for name in PIPELINES)
    for name in sorted(PIPELINES):
        pipeline = get_pipeline(name)
        ready, detail = pipeline_status(name)
        print(f"{name:<{width}} {'ready' if ready else 'not ready':<10} {pipeline.description}")
        print(f"{'':<{width}} {serves(pipeline)}")
        if detail:
            print(f"{'':<{width}} {detail}")
    return 0


def add_download(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("download", help="prepare model weights in the cache (with progress bars)")
    d.add_argument("--pipeline", default=None)


def run_download(args: argparse.Namespace) -> int:
    from omnipipe.models.preparation import prepare_pipeline

    names = [args.pipeline] if args.pipeline else sorted(PIPELINES)
    for name in names:
        get_pipeline(name)
        prepare_pipeline(name, progress=True)
        print(f"{name}: ready")
    if args.pipeline is None:  # the server's own model: semantic_vad's end of turn
        from omnipipe.server.end_of_turn import prepare_end_of_turn_model

        prepare_end_of_turn_model(progress=True)
        print("end-of-turn model (semantic_vad): ready")
    return 0
