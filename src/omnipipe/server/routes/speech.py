"""``POST /v1/audio/speech``: read text aloud with the pipeline's talker -> vocoder part, streaming audio bytes as
they are decoded (``pcm``: raw 24 kHz int16; ``wav``: a header of unknown length, then PCM at the native rate;
``mp3`` (the default, as OpenAI's), ``opus``, ``aac``, ``flac``: encoded as the audio arrives), or as server-sent
events (the voices a request can name are listed by ``GET /v1/audio/voices``, ``voices.py``).

``voice`` is a voice of the pipeline, an OpenAI voice name mapped to one (``EnginePool.voice_aliases``) or
``{"id": ...}``; ``instructions`` are refused unless the family can follow them (``ServingTraits.takes_instructions``).
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request

from omnipipe.api.outputs import OmniRequestOutput
from omnipipe.api.sampling_params import SamplingParams
from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.protocol.openai import ErrorResponse, SpeechRequest
from omnipipe.protocol.worker import SPEECH_PATH
from omnipipe.server.audio_stream import (
    MEDIA_TYPES,
    EncodedStream,
    Pcm16Stream,
    streaming_wav_header,
)
from omnipipe.server.engines import EnginePool, with_voice
from omnipipe.server.errors import from_engine_error, invalid
from omnipipe.server.prometheus import ServerMetrics
from omnipipe.server.streaming import (
    SSE_HEADERS,
    ClosingStreamingResponse,
    StreamCut,
    first_output,
    sse,
    with_first,
)

logger = logging.getLogger(__name__)
ENDPOINT = SPEECH_PATH
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 415, 429,
                                                                                          503)}
router = APIRouter()


def _native_rate(pipeline: PipelineSpec) -> int:
    rate = next((s.sample_rate_hz for s in pipeline.stages if s.final_output == "audio" and s.sample_rate_hz), None)
    if rate is None:
        raise invalid(f"model: pipeline {pipeline.name!r} produces no audio", "model")
    return rate


def _check_instructions(body: SpeechRequest, pipeline: PipelineSpec) -> None:
    if body.instructions is not None and body.instructions.strip() and not pipeline.serving.takes_instructions:
        raise invalid(f"instructions: pipeline {pipeline.name!r} cannot follow instructions (tone, accent, pace); "
                      "leave them out", "instructions")


def _sampling_params(body: SpeechRequest, pipeline: PipelineSpec) -> dict[str, SamplingParams] | None:
    stage = pipeline.serving.speed_stage
    if stage is not None:
        return {stage: SamplingParams(extra={"speed": float(body.speed)})}
    if body.speed != 1.0:
        raise invalid(f"speed: pipeline {pipeline.name!r} cannot change the speaking rate", "speed")
    return None


async def _audio_bytes(outputs: AsyncIterator[OmniRequestOutput], first: OmniRequestOutput | None, fmt: str,
                       native_rate: int, metrics: ServerMetrics) -> AsyncIterator[bytes]:
    """The response body in ``fmt``, piece by piece, each as soon as the encoder has it."""

    # pcm: resampled to 24 kHz; wav: int16 at the native rate behind a streaming header; others: PyAV encoders
    encoder: Pcm16Stream | EncodedStream
    if fmt == "pcm":
        encoder = Pcm16Stream(native_rate)
    elif fmt == "wav":
        encoder = Pcm16Stream(native_rate, native_rate)
        yield streaming_wav_header(native_rate)
    else:
        encoder = EncodedStream(fmt, native_rate)
    try:
        async for out in with_first(first, outputs):
            if out.modality == "audio" and out.audio is not None and out.audio.size:
                data = encoder.feed(out.audio)
                if data:
                    yield data
            elif out.finished:
                metrics.observe(ENDPOINT, out.metrics)
                tail = encoder.flush()
                if tail:
                    yield tail
    finally:
        if isinstance(encoder, EncodedStream):
            encoder.close()


async def _body(outputs: AsyncIterator[OmniRequestOutput], first: OmniRequestOutput | None, body: SpeechRequest,
                native_rate: int, metrics: ServerMetrics) -> AsyncIterator[bytes]:
    pieces = _audio_bytes(outputs, first, body.response_format, native_rate, metrics)
    try:
        if body.stream_format == "audio":
            async for piece in pieces:
                yield piece
            return
        async for piece in pieces:
            yield sse({"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode()})
        yield sse({"type": "speech.audio.done", "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}})
    except Exception as exc:  # noqa: BLE001 - the response has started: an error event for SSE, else cut it
        error = from_engine_error(exc, {"prompt": "input"})
        logger.warning("speech request failed mid-stream: %s", error.message)
        if body.stream_format == "sse":
            yield sse(error.body())
        else:
            raise StreamCut(error.message) from exc
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]
        await outputs.aclose()  # type: ignore[attr-defined]


@router.post(ENDPOINT, responses={200: {"content": {t: {} for t in set(MEDIA_TYPES.values())}}, **_ERRORS})
async def create_speech(body: SpeechRequest, request: Request) -> ClosingStreamingResponse:
    pool: EnginePool = request.app.state.pool
    metrics: ServerMetrics = request.app.state.metrics
    pool.check_model(body.model, "speech")
    if not body.input.strip():
        raise invalid("input: is empty", "input")
    engine, pipeline = await pool.engine_for("speech")
    voice = pool.check_voice(body.voice, pipeline, "voice")
    _check_instructions(body, pipeline)
    native_rate = _native_rate(pipeline)
    params = with_voice(_sampling_params(body, pipeline) or {}, voice, pipeline, "voice") or None
    outputs = engine.generate(body.input, request_id=f"speech-{uuid.uuid4().hex}", sampling_params=params,
                              output_modalities=["audio"])
    first = await first_output(request, outputs, {"prompt": "input", "sampling_params.extra.speed": "speed"})
    if first is not None and first.finished and (first.audio is None or not first.audio.size):
        await outputs.aclose()  # type: ignore[attr-defined]
        raise invalid(f"input: has nothing the voice can say (no words in {body.input[:40]!r})", "input",
                      code="nothing_to_speak")
    stream = _body(outputs, first, body, native_rate, metrics)
    if body.stream_format == "sse":
        return ClosingStreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)
    return ClosingStreamingResponse(stream, media_type=MEDIA_TYPES[body.response_format])
