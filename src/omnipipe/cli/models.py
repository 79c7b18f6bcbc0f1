"""``omnipipe models`` (the pipelines and whether their weights are ready) and ``omnipipe download`` (prepare the
weights in the cache)."""

from __future__ import annotations

import argparse

from omnipipe.models.registry import PIPELINES, get_pipeline


def add_models(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("models", help="list pipelines and whether their weights are ready")


def run_models(args: argparse.Namespace) -> int:
    from omnipipe.models.preparation import pipeline_status

    width = max(len(name) for name in PIPELINES)
    for name in sorted(PIPELINES):
        pipeline = get_pipeline(name)
        ready, detail = pipeline_status(name)
        print(f"{name:<{width}} {'ready' if ready else 'not ready':<10} {pipeline.description}")
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
