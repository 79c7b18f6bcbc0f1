"""What several realtime client events check alike: base64 pcm16 audio, image data URLs, sampling values (as the
stage will), the output modalities and audio input the pipeline takes. Each refusal is an ``EventError`` naming the
field."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from omnipipe.api.sampling_params import SamplingParams
from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.protocol.audio import PCM16_DTYPE
from omnipipe.server.routes.realtime.events import EventError
from omnipipe.util.data_url import DataUrlError, parse_data_url
from omnipipe.util.field_error import FieldError


def check_sampling(fields: dict[str, Any], param: str) -> None:
    """A session value checked as the stage's SamplingParams will be (the same schema)."""
    try:
        SamplingParams.from_dict(fields)
    except ValueError as exc:
        rule = exc.rule if isinstance(exc, FieldError) else str(exc)
        raise EventError(f"{param}: {rule}", param) from None


def decode_pcm16(data: str, param: str) -> np.ndarray:
    """Base64 pcm16 -> float32 samples in [-1, 1)."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise EventError(f"{param}: not valid base64", param, code="invalid_base64") from None
    if len(raw) % 2:
        raise EventError(f"{param}: pcm16 audio must have an even number of bytes, got {len(raw)}", param,
                         code="invalid_audio")
    return np.frombuffer(raw, dtype=PCM16_DTYPE).astype(np.float32) / 32768.0


def check_modalities(pipeline: PipelineSpec, value: list[str], param: str) -> list[str]:
    try:  # audio brings the transcript of the spoken answer
        return pipeline.check_output_modalities(value, param, with_transcript=True)
    except FieldError as exc:
        raise EventError(str(exc), param, code="unsupported_modality") from None


def check_takes_audio(pipeline: PipelineSpec, param: str | None) -> None:
    if "audio" not in pipeline.input_modalities:
        raise EventError(f"pipeline {pipeline.name!r} does not take audio input (it takes "
                         f"{', '.join(pipeline.input_modalities)})", param, code="unsupported_modality")


MAX_IMAGE_BYTES = 10 * 1024 * 1024  # an input_image's encoded file
MAX_ITEM_IMAGES = 8
IMAGE_TYPES = ("image/png", "image/jpeg")


def check_image_part(pipeline: PipelineSpec, url: str | None, param: str, earlier: int) -> str:
    """An ``input_image`` part's ``image_url``: a PNG or JPEG data URL of at most ``MAX_IMAGE_BYTES``, the item's
    ``earlier + 1``-th image (at most ``MAX_ITEM_IMAGES``), for a pipeline that takes images. The URL as given."""
    if "image" not in pipeline.input_modalities:
        raise EventError(f"{param}: pipeline {pipeline.name!r} does not take images (it takes "
                         f"{', '.join(pipeline.input_modalities)})", param, code="unsupported_modality")
    if url is None:
        raise EventError(f"{param}: required for input_image content", param, code="missing_field")
    if earlier >= MAX_ITEM_IMAGES:
        raise EventError(f"{param}: an item takes at most {MAX_ITEM_IMAGES} images", param, code="too_many_images")
    check_image_url(url, param, MAX_IMAGE_BYTES)
    return url


def check_image_url(url: str, param: str, max_bytes: int) -> tuple[str, bytes]:
    """A PNG or JPEG data URL of at most ``max_bytes`` (decoded), not empty: its media type and data."""
    try:
        media_type, data = parse_data_url(url, field=param, kind="image", max_bytes=max_bytes)
    except DataUrlError as exc:
        code = "image_too_large" if exc.problem == "size" else "invalid_image"
        raise EventError(str(exc), param, code=code) from None
    if media_type not in IMAGE_TYPES:
        raise EventError(f"{param}: {media_type} is not taken; send {' or '.join(IMAGE_TYPES)}", param,
                         code="invalid_image")
    if not data:
        raise EventError(f"{param}: the image is empty", param, code="invalid_image")
    return media_type, data
