"""``POST /v1/images/generations``: draw with the pipeline's diffusion stage, in OpenAI's shape.

Answers ``data[i].b64_json`` (PNG, WebP or JPEG), or with ``stream: true`` server-sent events as OpenAI's image
models send them: ``image_generation.partial_image`` (``partial_images`` previews, 0-3, taken from the denoising
loop as it goes) then ``image_generation.completed``. ``size`` is ``auto`` (the model's own size) or WIDTHxHEIGHT
(a size the model draws, or a whole multiple of its own size, enlarged with crisp pixels). ``n`` images are ``n``
requests of consecutive seeds, drawn side by side (the diffusion stage batches them step by step).

What is not built is refused by name: ``response_format: url`` (this server keeps no images to link to), gif and
svg, a transparent background, ``quality``/``style`` other than their defaults. ``seed``, ``num_inference_steps``
and ``guidance_scale`` are vLLM-Omni's extensions.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import APIRouter, Request

from omnipipe.api.async_omni import AsyncOmni
from omnipipe.api.outputs import OmniRequestOutput
from omnipipe.api.sampling_params import SEED_LIMIT, SamplingParams
from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.protocol.openai import ErrorResponse, ImageData, ImageGenerationRequest, ImagesResponse
from omnipipe.protocol.worker import IMAGES_PATH
from omnipipe.server.disconnect import while_connected
from omnipipe.server.engines import EnginePool
from omnipipe.server.errors import from_engine_error, invalid
from omnipipe.server.prometheus import ServerMetrics
from omnipipe.server.streaming import SSE_HEADERS, ClosingStreamingResponse, first_output, sse, with_first
from omnipipe.util.image import encode_image

logger = logging.getLogger(__name__)
ENDPOINT = IMAGES_PATH
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 415, 429,
                                                                                          503)}
_SIZE = re.compile(r"(\d{1,5})x(\d{1,5})")
router = APIRouter()


def _refuse_unsupported(body: ImageGenerationRequest) -> None:
    def refuse(param: str, why: str) -> None:
        raise invalid(f"{param}: {why}", param, code="unsupported_parameter")

    if body.response_format == "url":
        refuse("response_format", "only b64_json: this server keeps no images to link to")
    if body.output_format in ("gif", "svg"):
        refuse("output_format", f"{body.output_format} is not drawn here (png, webp or jpeg)")
    if body.quality not in (None, "auto"):
        refuse("quality", f"only 'auto' (set num_inference_steps to trade quality for time), got {body.quality!r}")
    if body.background not in (None, "auto", "opaque"):
        refuse("background", f"images here are opaque ('auto' or 'opaque'), got {body.background!r}")
    if body.style is not None:
        refuse("style", "no styles here (a dall-e-3 option)")
    if body.output_compression is not None and body.output_format in (None, "png"):
        raise invalid("output_compression: only for webp or jpeg", "output_compression")
    if body.stream and body.n > 1:
        raise invalid("n: a stream carries one image; set n to 1 or stream false", "n")
    if body.partial_images and not body.stream:
        raise invalid("partial_images: previews come only with stream: true", "partial_images")


def _size(value: str) -> tuple[int, int] | None:
    if value == "auto":
        return None
    match = _SIZE.fullmatch(value)
    if match is None:
        raise invalid(f"size: must be 'auto' or WIDTHxHEIGHT such as '256x256', got {value!r}", "size")
    return int(match.group(1)), int(match.group(2))


def _diffusion_stage(pipeline: PipelineSpec) -> str:
    return next(s.name for s in pipeline.stages if s.kind == "diffusion")


def _preview_every(partial_images: int | None, steps: int) -> int:
    """Every how many steps a preview comes so that ``partial_images`` of them fall inside the loop."""
    if not partial_images:
        return 0
    return max(1, steps // (partial_images + 1))


def _sampling_params(body: ImageGenerationRequest, engine: AsyncOmni, stage: str, size: tuple[int, int] | None,
                     index: int, base_seed: int) -> dict[str, SamplingParams]:
    steps = body.num_inference_steps or engine.deploy.stage(stage).options.get("steps") or 50
    extra: dict[str, Any] = {"preview_every": _preview_every(body.partial_images, int(steps))}
    if body.num_inference_steps is not None:
        extra["steps"] = body.num_inference_steps
    if body.guidance_scale is not None:
        extra["guidance_scale"] = float(body.guidance_scale)
    if size is not None:
        extra["width"], extra["height"] = size
    return {stage: SamplingParams(seed=(base_seed + index) % SEED_LIMIT, extra=extra)}


_FIELDS = {"prompt": "prompt", "sampling_params.extra.steps": "num_inference_steps",
           "sampling_params.extra.guidance_scale": "guidance_scale", "sampling_params.extra.width": "size",
           "sampling_params.extra.height": "size", "size": "size", "sampling_params.seed": "seed"}


def _encoded(image: np.ndarray, body: ImageGenerationRequest) -> str:
    data = encode_image(image, body.output_format or "png", body.output_compression)
    return base64.b64encode(data).decode()


def _size_of(image: np.ndarray) -> str:
    return f"{image.shape[1]}x{image.shape[0]}"


async def _draw(engine: AsyncOmni, pipeline: PipelineSpec, body: ImageGenerationRequest, request: Request,
                stage: str, size: tuple[int, int] | None, index: int,
                base_seed: int) -> tuple[AsyncIterator[OmniRequestOutput], OmniRequestOutput | None]:
    modalities = ["text", "image"] if "text" in pipeline.output_modalities else ["image"]
    outputs = engine.generate(body.prompt, request_id=f"img-{uuid.uuid4().hex}",
                              sampling_params=_sampling_params(body, engine, stage, size, index, base_seed),
                              output_modalities=modalities)
    return outputs, await first_output(request, outputs, _FIELDS)


async def _final(outputs: AsyncIterator[OmniRequestOutput], first: OmniRequestOutput | None) -> OmniRequestOutput:
    final = first
    try:
        while final is None or not final.finished:
            final = await outputs.__anext__()
    except Exception as exc:  # noqa: BLE001 - mapped to an API error
        raise from_engine_error(exc, _FIELDS) from None
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]
    if final.image is None:
        raise from_engine_error(RuntimeError(f"request ended ({final.finish_reason}) without an image"), _FIELDS)
    return final


async def _stream(outputs: AsyncIterator[OmniRequestOutput], first: OmniRequestOutput | None,
                  body: ImageGenerationRequest, metrics: ServerMetrics) -> AsyncIterator[bytes]:
    fmt = body.output_format or "png"
    sent = 0
    try:
        async for out in with_first(first, outputs):
            if out.modality == "image" and out.is_preview and out.image is not None:
                if sent < (body.partial_images or 0):
                    yield sse({"type": "image_generation.partial_image", "b64_json": _encoded(out.image, body),
                               "created_at": int(time.time()), "size": _size_of(out.image), "quality": "auto",
                               "background": "opaque", "output_format": fmt, "partial_image_index": sent})
                    sent += 1
            elif out.finished:
                metrics.observe(ENDPOINT, out.metrics)
                if out.image is None:
                    raise RuntimeError(f"request ended ({out.finish_reason}) without an image")
                tokens = out.metrics.num_prompt_tokens if out.metrics is not None else 0
                yield sse({"type": "image_generation.completed", "b64_json": _encoded(out.image, body),
                           "created_at": int(time.time()), "size": _size_of(out.image), "quality": "auto",
                           "background": "opaque", "output_format": fmt,
                           "usage": {"input_tokens": tokens, "output_tokens": 0, "total_tokens": tokens,
                                     "input_tokens_details": {"text_tokens": tokens, "image_tokens": 0}}})
    except Exception as exc:  # noqa: BLE001 - the response has started: an error event ends the stream
        yield sse(from_engine_error(exc, _FIELDS).body())
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]


@router.post(ENDPOINT, response_model=ImagesResponse, responses=_ERRORS)
async def create_image(body: ImageGenerationRequest, request: Request) -> Any:
    pool: EnginePool = request.app.state.pool
    metrics: ServerMetrics = request.app.state.metrics
    pool.check_model(body.model or pool.model_name, "images")
    _refuse_unsupported(body)
    size = _size(body.size)
    engine, pipeline = await pool.engine_for("images")
    stage = _diffusion_stage(pipeline)
    base_seed = body.seed if body.seed is not None else secrets.randbelow(2**62)
    if body.stream:
        outputs, first = await _draw(engine, pipeline, body, request, stage, size, 0, base_seed)
        return ClosingStreamingResponse(_stream(outputs, first, body, metrics), media_type="text/event-stream",
                                        headers=SSE_HEADERS)
    started = [await _draw(engine, pipeline, body, request, stage, size, 0, base_seed)]
    try:  # the first surfaced a bad request as a 4xx before the others start
        for index in range(1, body.n):
            started.append(await _draw(engine, pipeline, body, request, stage, size, index, base_seed))
        finals = await while_connected(request, asyncio.gather(*(_final(o, f) for o, f in started)))
    finally:
        for outputs, _ in started:
            await outputs.aclose()  # type: ignore[attr-defined]
    for final in finals:
        metrics.observe(ENDPOINT, final.metrics)
    data = [ImageData(b64_json=_encoded(final.image, body), revised_prompt=final.text.strip() or None)
            for final in finals if final.image is not None]
    return ImagesResponse(created=int(time.time()), data=data, output_format=body.output_format or "png",
                          size=_size_of(finals[0].image))
