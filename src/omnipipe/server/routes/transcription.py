"""``POST /v1/audio/transcriptions``: an uploaded audio file -> its transcript, with the speech-to-text pipeline
(``asr`` for the default family, ``voxtral_transcribe`` for Voxtral; started on the first request).

Formats: ``json``, ``text``, ``verbose_json`` (language, duration, the segments with whisper's scores, and with
``timestamp_granularities[]=word`` the words with their times), ``srt`` and ``vtt`` (subtitles built from the
segments). ``stream=true`` (json or text) answers with server-sent events: a ``transcript.text.delta`` per decoded
segment (or token, for a family that decodes its transcript a token at a time), then ``transcript.text.done`` with
the usage in tokens: the audio's at the pipeline's rate (``ServingTraits.audio_tokens_per_s``). The segment details
come from the pipeline's ``OmniRequestOutput.details``. ``language`` is one of the pipeline's
(``ServingTraits.transcription_languages``, as an ISO 639-1 code or its English name), given to the stage that takes
it (``ServingTraits.language_param``). A form field this server does not implement is refused with a 400 naming it,
never ignored.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from omnipipe.api.outputs import OmniRequestOutput
from omnipipe.api.sampling_params import SamplingParams
from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.protocol.openai import ErrorResponse, TimestampGranularity, TranscriptionFormat
from omnipipe.protocol.worker import TRANSCRIPTION_PATH
from omnipipe.server.disconnect import ClientGone, while_connected
from omnipipe.server.engines import EnginePool
from omnipipe.server.errors import from_engine_error, invalid
from omnipipe.server.prometheus import ServerMetrics
from omnipipe.server.streaming import SSE_HEADERS, ClosingStreamingResponse, first_output, sse, with_first

logger = logging.getLogger(__name__)

ENDPOINT = TRANSCRIPTION_PATH
# ISO 639-1 code -> the name verbose_json gives (a request may name the language either way)
LANGUAGE_NAMES = {"en": "english", "es": "spanish", "fr": "french", "pt": "portuguese", "hi": "hindi", "de": "german",
                  "nl": "dutch", "it": "italian"}
STREAMED_FORMATS = ("json", "text")
# the form fields this endpoint reads; any other (OpenAI's chunking_strategy, include[], known_speaker_names[], ...)
# is refused by name
FORM_FIELDS = ("file", "model", "response_format", "language", "prompt", "temperature", "stream",
               "timestamp_granularities[]")
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 415, 429,
                                                                                          503)}
_FIELDS = {"prompt.multi_modal_data.audio": "file", "prompt.multi_modal_data": "file", "prompt": "file",
           "sampling_params.extra.word_timestamps": "timestamp_granularities",
           "sampling_params.extra.prompt": "prompt", "sampling_params.extra.temperature": "temperature",
           "sampling_params.extra.language": "language"}
router = APIRouter()


@dataclass
class Transcript:
    """What a transcription request's outputs add up to (``audio_tokens_per_s``: the pipeline's, for the usage)."""

    audio_tokens_per_s: float
    text: str = ""
    language: str = "english"
    duration_s: float = 0.0
    output_tokens: int = 0
    segments: list[dict[str, Any]] = field(default_factory=list)
    words: list[dict[str, Any]] = field(default_factory=list)

    def add(self, out: OmniRequestOutput) -> None:
        self.text = out.text
        self.output_tokens += out.num_tokens if out.text_delta else 0
        details = out.details or {}
        if "language" in details:
            self.language = LANGUAGE_NAMES.get(str(details["language"]).lower(), str(details["language"]))
        if "duration" in details:
            self.duration_s = float(details["duration"])
        if details.get("segment"):
            segment = dict(details["segment"])
            self.words += segment.pop("words", None) or []
            self.segments.append(segment)

    def usage_duration(self) -> dict[str, Any]:
        return {"type": "duration", "seconds": self.duration_s}

    def usage_tokens(self) -> dict[str, Any]:
        audio_tokens = math.ceil(self.duration_s * self.audio_tokens_per_s)
        return {"type": "tokens", "input_tokens": audio_tokens, "output_tokens": self.output_tokens,
                "total_tokens": audio_tokens + self.output_tokens,
                "input_token_details": {"audio_tokens": audio_tokens, "text_tokens": 0}}

    def verbose(self, with_words: bool) -> dict[str, Any]:
        body = {"task": "transcribe", "language": self.language, "duration": self.duration_s,
                "text": self.text.strip(), "segments": self.segments, "usage": self.usage_duration()}
        if with_words:
            body["words"] = self.words
        return body


def _clock(seconds: float, decimal_mark: str) -> str:
    """``HH:MM:SS,mmm`` (SubRip) or ``HH:MM:SS.mmm`` (WebVTT)."""
    hours, rest = divmod(max(0, round(seconds * 1000)), 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{whole:02d}{decimal_mark}{millis:03d}"


def subtitles(segments: list[dict[str, Any]], fmt: str) -> str:
    """The segments as SubRip (``srt``) or WebVTT (``vtt``) cues."""
    mark = "," if fmt == "srt" else "."
    cues = []
    for number, segment in enumerate(segments, start=1):
        timing = f"{_clock(segment['start'], mark)} --> {_clock(segment['end'], mark)}"
        text = str(segment["text"]).strip()
        cues.append(f"{number}\n{timing}\n{text}\n" if fmt == "srt" else f"{timing}\n{text}\n")
    body = "\n".join(cues)
    return body if fmt == "srt" else f"WEBVTT\n\n{body}"


async def _refuse_unknown_fields(request: Request) -> None:
    form = await request.form()  # already parsed for the declared fields: this reads the cache
    for key in form:
        if key not in FORM_FIELDS:
            param = key.removesuffix("[]")
            if param == "timestamp_granularities":
                raise invalid(f"{param}: send it as timestamp_granularities[] (one value per field)", param)
            raise invalid(f"{param}: not supported by this server", param, code="unsupported_parameter")


def language_code(language: str | None, pipeline: PipelineSpec) -> str | None:
    """The ISO 639-1 code of the asked language (a code or its English name, any case), one the pipeline takes;
    else a 400 naming ``language`` and listing them."""
    if language is None:
        return None
    taken = pipeline.serving.transcription_languages
    asked = language.strip().lower()
    code = next((c for c in taken if asked in (c, LANGUAGE_NAMES.get(c))), None)
    if code is None:
        names = ", ".join(f"{c} ({LANGUAGE_NAMES[c]})" if c in LANGUAGE_NAMES else c for c in taken)
        raise invalid(f"language: pipeline {pipeline.name!r} transcribes {names}; got {language!r}", "language")
    return code


def _sampling_params(pipeline: PipelineSpec, temperature: float | None, prompt: str | None, word_timestamps: bool,
                     language: str | None) -> dict[str, SamplingParams] | None:
    """Knobs for the pipeline's speech recognition stage, only those the request sets (a family whose stage does
    not take one refuses it, named by its form field), and the language to the stage that takes it (a pipeline that
    takes none transcribes its one language untold)."""
    extra: dict[str, Any] = {}
    if word_timestamps:
        extra["word_timestamps"] = True
    if prompt:
        extra["prompt"] = prompt
    if temperature is not None:
        extra["temperature"] = float(temperature)
    extras = pipeline.transcription_extras(extra, language)
    return {stage: SamplingParams(extra=values) for stage, values in extras.items()} or None


async def _collect(outputs: AsyncIterator[OmniRequestOutput], transcript: Transcript) -> OmniRequestOutput | None:
    final = None
    async for out in outputs:
        transcript.add(out)
        final = out
    return final


async def _events(outputs: AsyncIterator[OmniRequestOutput], first: OmniRequestOutput | None,
                  transcript: Transcript, metrics: ServerMetrics) -> AsyncIterator[bytes]:
    """OpenAI's transcription stream: a delta per decoded segment (or token), then the whole text with the usage."""
    try:
        async for out in with_first(first, outputs):
            transcript.add(out)
            if out.text_delta:
                yield sse({"type": "transcript.text.delta", "delta": out.text_delta})
            if out.finished and out.metrics is not None:
                metrics.observe(ENDPOINT, out.metrics)
        yield sse({"type": "transcript.text.done", "text": transcript.text.strip(), "usage": transcript.usage_tokens()})
    except Exception as exc:  # noqa: BLE001 - the response has started: an error event
        error = from_engine_error(exc, _FIELDS, audio_param="file")
        logger.warning("transcription failed mid-stream: %s", error.message)
        yield sse(error.body())
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]


@router.post(ENDPOINT, responses={200: {"content": {"application/json": {}, "text/plain": {},
                                                    "text/event-stream": {}}}, **_ERRORS})
async def create_transcription(
    request: Request,
    file: Annotated[UploadFile, File(description="the audio file (wav, flac, ogg, mp3, ...)")],
    model: Annotated[str, Form(min_length=1)],
    response_format: Annotated[TranscriptionFormat, Form()] = "json",
    language: Annotated[str | None, Form(description="the audio's language, ISO 639-1 (the pipeline's: the default "
                                                     "family's English only)")] = None,
    prompt: Annotated[str | None, Form(description="text the transcript continues from (spellings, style)")] = None,
    temperature: Annotated[float | None, Form(ge=0, le=1, description="sampling temperature (0: greedy)")] = None,
    stream: Annotated[bool, Form(description="server-sent events (json and text only)")] = False,
    timestamp_granularities: Annotated[list[TimestampGranularity] | None, Form(
        alias="timestamp_granularities[]", description="verbose_json only: segment (always given) and/or word")] = None,
) -> Response:
    pool: EnginePool = request.app.state.pool
    metrics: ServerMetrics = request.app.state.metrics
    await _refuse_unknown_fields(request)
    if stream and response_format not in STREAMED_FORMATS:
        raise invalid(f"response_format: a stream (stream=true) is json or text, got {response_format!r}",
                      "response_format")
    granularities = set(timestamp_granularities or ())
    if granularities and response_format != "verbose_json":
        raise invalid("timestamp_granularities: needs response_format=verbose_json", "timestamp_granularities")
    pool.check_model(model, "transcription")
    name = pool.endpoint_pipelines.get("transcription")
    code = language_code(language, pool.slots[name].pipeline) if name is not None else None  # none: refused below
    data = await file.read()
    if not data:
        raise invalid("file: the uploaded file is empty", "file")
    engine, pipeline = await pool.engine_for("transcription")
    params = _sampling_params(pipeline, temperature, prompt, "word" in granularities, code)
    outputs = engine.generate({"prompt": "", "multi_modal_data": {"audio": data}},
                              request_id=f"transcribe-{uuid.uuid4().hex}", output_modalities=["text"],
                              sampling_params=params)
    transcript = Transcript(pipeline.serving.audio_tokens_per_s)
    if code is not None:
        transcript.language = LANGUAGE_NAMES.get(code, code)
    if stream:
        first = await first_output(request, outputs, _FIELDS, audio_param="file")
        return ClosingStreamingResponse(_events(outputs, first, transcript, metrics), media_type="text/event-stream",
                                        headers=SSE_HEADERS)
    try:
        final = await while_connected(request, _collect(outputs, transcript))
    except ClientGone:
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to an API error
        raise from_engine_error(exc, _FIELDS, audio_param="file") from None
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]
    assert final is not None
    metrics.observe(ENDPOINT, final.metrics)
    if response_format == "text":
        return PlainTextResponse(transcript.text.strip())
    if response_format == "json":
        return JSONResponse({"text": transcript.text.strip(), "usage": transcript.usage_duration()})
    if response_format in ("srt", "vtt"):
        return PlainTextResponse(subtitles(transcript.segments, response_format))
    return JSONResponse(transcript.verbose(with_words="word" in granularities))
