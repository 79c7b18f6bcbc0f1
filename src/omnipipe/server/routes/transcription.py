"""``POST /v1/audio/transcriptions``: an uploaded audio file -> its transcript, with the speech-to-text pipeline
(``asr`` for the default family, started on the first request)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from omnipipe.api.outputs import OmniRequestOutput
from omnipipe.protocol.openai import ErrorResponse, TranscriptionFormat
from omnipipe.protocol.worker import TRANSCRIPTION_PATH
from omnipipe.server.disconnect import ClientGone, while_connected
from omnipipe.server.engines import EnginePool
from omnipipe.server.errors import from_engine_error, invalid
from omnipipe.server.prometheus import ServerMetrics
from omnipipe.util.audio import load_audio

ENDPOINT = TRANSCRIPTION_PATH
LANGUAGES = {"en": "english", "english": "english"}
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 415, 429,
                                                                                          503)}
_FIELDS = {"prompt.multi_modal_data.audio": "file", "prompt.multi_modal_data": "file", "prompt": "file"}
router = APIRouter()


def _duration_s(data: bytes) -> float:
    audio, rate = load_audio(data)
    return round(audio.size / rate, 3) if rate else 0.0


@router.post(ENDPOINT, responses=_ERRORS)
async def create_transcription(
    request: Request,
    file: Annotated[UploadFile, File(description="the audio file (wav, flac, ogg, mp3, ...)")],
    model: Annotated[str, Form(min_length=1)],
    response_format: Annotated[TranscriptionFormat, Form()] = "json",
    language: Annotated[str | None, Form()] = None,
    prompt: Annotated[str | None, Form(description="accepted and ignored")] = None,
    temperature: Annotated[float | None, Form(ge=0, le=1, description="accepted and ignored")] = None,
) -> Response:
    pool: EnginePool = request.app.state.pool
    metrics: ServerMetrics = request.app.state.metrics
    pool.check_model(model, "transcription")
    if language is not None and language.lower() not in LANGUAGES:
        raise invalid(f"language: only English is supported, got {language!r}", "language")
    data = await file.read()
    if not data:
        raise invalid("file: the uploaded file is empty", "file")
    engine, _ = await pool.engine_for("transcription")
    outputs = engine.generate({"prompt": "", "multi_modal_data": {"audio": data}},
                              request_id=f"transcribe-{uuid.uuid4().hex}", output_modalities=["text"])

    async def last() -> OmniRequestOutput | None:
        final = None
        async for out in outputs:
            final = out
        return final

    try:
        final = await while_connected(request, last())
    except ClientGone:
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to an API error
        raise from_engine_error(exc, _FIELDS, audio_param="file") from None
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]
    assert final is not None
    metrics.observe(ENDPOINT, final.metrics)
    text = final.text.strip()
    fmt: Literal["json", "text", "verbose_json"] = response_format
    if fmt == "text":
        return PlainTextResponse(text)
    if fmt == "json":
        return JSONResponse({"text": text})
    duration = await asyncio.to_thread(_duration_s, data)
    return JSONResponse({"task": "transcribe", "language": "english", "duration": duration, "text": text,
                         "segments": [], "usage": {"type": "duration", "seconds": duration}})
