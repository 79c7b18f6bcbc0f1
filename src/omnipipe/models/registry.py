"""Pipelines by name: each is a PipelineSpec built in code by a family under ``models/``. Adding a family is its
folder plus one line here per pipeline (and one for its tiny checkpoint writer, if it has one)."""

from __future__ import annotations

from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.util.dotted import resolve

# name -> dotted path of a PipelineSpec
PIPELINES: dict[str, str] = {
    "default": "omnipipe.models.default.pipeline:DEFAULT",
    "tts": "omnipipe.models.default.pipeline:TTS",
    "asr": "omnipipe.models.default.pipeline:ASR",
    "image": "omnipipe.models.image.pipeline:IMAGE",
    "think-and-draw": "omnipipe.models.image.pipeline:THINK_AND_DRAW",
    "qwen3_omni": "omnipipe.models.qwen3_omni.pipeline:PIPELINE",
    "toy": "omnipipe.models.toy.pipeline:PIPELINE",
    "toy_tts": "omnipipe.models.toy.pipeline:TTS_PIPELINE",
    "qwen2_5_omni": "omnipipe.models.qwen2_5_omni.pipeline:PIPELINE",
    "voxtral": "omnipipe.models.voxtral.pipeline:PIPELINE",
    "voxtral_transcribe": "omnipipe.models.voxtral.pipeline:TRANSCRIBE_PIPELINE",
    "voxtral_realtime": "omnipipe.models.voxtral_realtime.pipeline:PIPELINE",
    "moshi": "omnipipe.models.moshi.pipeline:PIPELINE",
    "csm": "omnipipe.models.csm.pipeline:PIPELINE",
}

# pipeline -> dotted path of its family's ``write_tiny_checkpoint(directory, seed) -> Path``: a tiny random
# checkpoint written offline, to run the pipeline on a CPU without a download (``omnipipe tiny-checkpoint``)
TINY_CHECKPOINTS: dict[str, str] = {
    "qwen2_5_omni": "omnipipe.models.qwen2_5_omni.weights.tiny:write_tiny_checkpoint",
    "qwen3_omni": "omnipipe.models.qwen3_omni.weights.tiny:write_tiny_checkpoint",
    "voxtral": "omnipipe.models.voxtral.weights.tiny:write_tiny_checkpoint",
    "voxtral_realtime": "omnipipe.models.voxtral_realtime.weights.tiny:write_tiny_checkpoint",
    "moshi": "omnipipe.models.moshi.weights.tiny:write_tiny_checkpoint",
    "csm": "omnipipe.models.csm.weights.tiny:write_tiny_checkpoint",
}


class UnknownPipelineError(ValueError):
    """No pipeline of that name; the message lists the available ones."""


def get_pipeline(name: str) -> PipelineSpec:
    dotted = PIPELINES.get(name) if isinstance(name, str) else None
    if dotted is None:
        raise UnknownPipelineError(f"unknown pipeline {name!r}; available: {', '.join(sorted(PIPELINES))}")
    pipeline = resolve(dotted)
    assert isinstance(pipeline, PipelineSpec)
    return pipeline
