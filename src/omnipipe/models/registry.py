"""Model families by name: each is a PipelineSpec built in code."""

from __future__ import annotations

import importlib

from omnipipe.config.pipeline_spec import PipelineSpec

# name -> module with a module-level ``PIPELINE``
PIPELINES: dict[str, str] = {
    "toy": "omnipipe.models.toy.pipeline",
    "toy_tts": "omnipipe.models.toy.tts_pipeline",
}


class UnknownPipelineError(ValueError):
    pass


def get_pipeline(name: str) -> PipelineSpec:
    module_name = PIPELINES.get(name)
    if module_name is None:
        raise UnknownPipelineError(f"unknown pipeline {name!r}; available: {', '.join(sorted(PIPELINES))}")
    return importlib.import_module(module_name).PIPELINE


def register_pipeline(name: str, module_name: str) -> None:
    PIPELINES[name] = module_name
