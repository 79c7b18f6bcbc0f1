"""The flags that choose a pipeline and how it is deployed (``--pipeline``, ``--deploy``, ``--model``,
``--ray-address``), shared by ``generate``, ``serve`` and ``worker``, and the deploy config they make."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from omnipipe.cli.errors import CLIError
from omnipipe.models.registry import PIPELINES, get_pipeline

MODEL_HELP = ("the model of the pipeline's main stage (its deploy option 'model'): default, a thinker name "
              "(qwen2.5-coder-0.5b-instruct, gemma3-270m); image, think-and-draw: digits or a diffusers checkpoint "
              "directory")

RAY_HELP = ("run the stages as Ray actors on this cluster (auto, HOST:PORT or ray://HOST:PORT): the deploy file's "
            "placement.backend ray with this address; stages.<name>.node pins a stage to a node")


def add_pipeline_flags(p: argparse.ArgumentParser) -> None:
    """``--pipeline``, ``--deploy``, ``--model`` and ``--ray-address``."""
    p.add_argument("--pipeline", default="default", help=f"one of: {', '.join(sorted(PIPELINES))}")
    p.add_argument("--deploy", type=Path, help="deploy YAML (threads, batch sizes, chunk sizes, relays)")
    p.add_argument("--model", help=MODEL_HELP)
    p.add_argument("--ray-address", metavar="ADDRESS", help=RAY_HELP)


def _ray_address(args: argparse.Namespace) -> str | None:
    address = getattr(args, "ray_address", None)
    if address is not None and not address.strip():
        raise CLIError("--ray-address: give auto, HOST:PORT or ray://HOST:PORT")
    return address


def deploy_source(args: argparse.Namespace) -> Any:
    """The pipeline the flags name and its deploy config (the deploy file with the flags' changes), both checked:
    a mistake is a ``CLIError`` naming the flag."""
    from omnipipe.config.deploy_config import DeployConfigError, load_deploy

    pipeline = get_pipeline(args.pipeline)
    if args.deploy is not None and not args.deploy.is_file():
        raise CLIError(f"--deploy: file not found: {args.deploy}")
    address = _ray_address(args)
    overrides = {"placement": {"backend": "ray", "address": address}} if address is not None else None
    try:
        config = load_deploy(args.deploy, pipeline, overrides)
    except DeployConfigError as exc:
        raise CLIError(str(exc)) from exc
    if getattr(args, "no_async_chunk", False):
        config.async_chunk = False
    if getattr(args, "model", None) is not None:
        if not pipeline.model_stages:
            raise CLIError(f"--model: pipeline {pipeline.name!r} has no stage whose model can be chosen")
        for stage in pipeline.model_stages:
            config.stage(stage).options["model"] = args.model
    return pipeline, config
