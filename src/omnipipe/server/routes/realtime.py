"""``WS /v1/realtime``: a subset of the OpenAI Realtime API over one WebSocket, one conversation turn at a time.

Authentication: with ``--api-key`` the handshake must carry ``Authorization: Bearer KEY`` (a query parameter is not
accepted); otherwise the handshake is refused (HTTP 403). The session uses the server's main pipeline; if it has not
loaded yet the server sends an ``error`` (code ``engine_loading``) and closes with 1013. A WebSocket counts as one
session of the server from accept to close; a server already holding ``capacity`` sessions sends an ``error``
(code ``worker_at_capacity``) and closes with 1013.

Client events (JSON text frames, each with ``type`` and an optional ``event_id``):

Every client event is validated with the schema in ``omnipipe.protocol.realtime`` (``CLIENT_EVENT``) first, then
with what depends on the pipeline.

- ``session.update`` ``{session: {modalities, voice, instructions, input_audio_format, output_audio_format,
  turn_detection, max_response_output_tokens, temperature}}``: every field is optional; unknown fields are
  ignored; an invalid field rejects the whole update. ``max_response_output_tokens`` and ``temperature`` are
  checked as the stage's ``SamplingParams`` would be. Audio formats are ``pcm16`` only (24 kHz mono int16
  little-endian, base64). ``turn_detection`` is ``null`` (the client commits) or ``{type: "server_vad",
  threshold, silence_duration_ms, prefix_padding_ms, create_response}``. ``threshold`` is the RMS of a 20 ms
  frame of full-scale float audio (0..1) above which it counts as speech (an energy VAD, not a model; default
  0.02). ``instructions`` are the conversation's system message for a pipeline that takes history (the default
  family's); a pipeline that answers one question at a time refuses non-empty ones.
  ``voice`` is validated like ``/v1/audio/speech``'s. ``input_audio_transcription`` is ``null`` (default) or
  ``{model}``: each committed audio item is then also transcribed by the server's transcription pipeline (started on
  first use), beside the response, and the transcript arrives as
  ``conversation.item.input_audio_transcription.completed`` ``{item_id, content_index, transcript}`` (or
  ``.failed`` ``{item_id, content_index, error}``). ``model`` is echoed; the pipeline is the server's.
- ``input_audio_buffer.append`` ``{audio}``, ``input_audio_buffer.commit``, ``input_audio_buffer.clear``.
- Conversation: for a pipeline that takes history, each response is given the turns before it: the text of the
  user's items, the transcript of their spoken items (transcribed beside the response, whether or not the client
  asked for ``input_audio_transcription``; a transcript not ready when the next response starts is left out), and
  the words of each earlier answer (of a cancelled answer, those sent before the cancel).
- ``conversation.item.create`` ``{item: {type: "message", role: "user", content: [{type: "input_text", text}]}}``.
- ``response.create`` (optionally ``{response: {modalities}}``) and ``response.cancel``.
- Extensions (not in the OpenAI API): ``session.pause`` and ``session.resume``, answered with ``session.paused``
  ``{pause_timeout_s}`` and ``session.resumed`` (both idempotent). Pausing cancels a response in progress (it ends
  with ``response.done`` status ``cancelled``) and clears the uncommitted input audio buffer. While paused,
  appended audio is dropped unread (so the VAD hears nothing), ``response.create`` is refused (``error`` code
  ``session_paused``), and other events work as usual. A session paused longer than the server's pause timeout
  (``--pause-timeout-s``, default 300 s) gets an ``error`` (code ``pause_timeout``) and is closed (1000). A
  server whose open realtime sessions are all paused reports the state ``DUPLEX_PAUSED`` on ``/health``.
- Idle timeout (extension; a worker's ``--idle-timeout-s``, default 120 s there, off for ``serve``): a session that is
  not paused and in which for that long nobody spoke (the VAD heard no speech), nothing was committed or typed, and
  no answer ran, is sent ``session.idle_warning`` ``{closes_in_s}`` 15 s before the end, then an ``error`` (code
  ``idle_timeout``) and is closed (1000): an open page nobody uses gives its worker slot back. Any activity
  restarts the count.

Server events (each with ``type`` and ``event_id``): ``session.created``, ``session.updated``,
``session.paused``, ``session.resumed``, ``input_audio_buffer.committed`` / ``cleared`` / ``speech_started`` /
``speech_stopped``, ``conversation.item.created``, ``response.created``, ``response.text.delta`` /
``response.text.done`` (text-only responses), ``response.audio_transcript.delta`` / ``.done`` (the text of a spoken
response),
``response.audio.delta`` / ``.done`` (base64 pcm16 at 24 kHz, resampled from the pipeline's rate without seams),
``response.done`` ``{response: {id, status: completed|cancelled|failed, status_details, usage}}`` and ``error``
``{error: {type, code, message, param, event_id}}``. A bad client event (invalid JSON, unknown type, missing or
invalid field, bad base64) gets an ``error`` event and the connection stays open; so does a binary frame, and an
event the server fails on (type ``server_error``, code ``internal_error``, logged).

A turn: committed audio becomes a spoken question (24 kHz samples handed to the pipeline's prompt processor, which
resamples them); text items become a written question (texts since the last response joined; with audio, the text
goes along as the instruction). With ``server_vad``, speech that stops commits the buffer and (``create_response``)
starts a response; speech that starts while a response runs is a barge-in: the response is aborted at once and ends
with ``response.done`` status ``cancelled``, reason ``turn_detected`` (``client_cancelled`` for ``response.cancel``,
a pause or a disconnect). One response runs at a time per connection; a disconnect aborts it.
Not supported: assistant/system items, function calls, ``item.truncate`` / ``delete``, out-of-band responses,
formats other than pcm16, the GA event names.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pydantic_core
from fastapi import APIRouter, WebSocket
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from omnipipe.api.async_omni import AsyncOmni
from omnipipe.api.sampling_params import SamplingParams
from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.protocol.audio import PCM16_DTYPE, PCM16_RATE_HZ
from omnipipe.protocol.realtime import (
    CLIENT_EVENT,
    COMMIT_EMPTY,
    IDLE_TIMEOUT,
    IDLE_WARNING_S,
    PAUSE_TIMEOUT,
    ClientEvent,
    ConversationItemCreate,
    InputAudioBufferAppend,
    InputAudioTranscription,
    ResponseCreate,
    ResponseOptions,
    ServerEvent,
    SessionUpdate,
    TurnDetection,
)
from omnipipe.protocol.worker import CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TRY_AGAIN, REALTIME_PATH
from omnipipe.server.audio_stream import Pcm16Stream
from omnipipe.server.capacity import Session, SessionTracker, at_capacity_error
from omnipipe.server.engines import EnginePool
from omnipipe.server.errors import APIError, from_engine_error, from_validation_errors
from omnipipe.server.prometheus import ServerMetrics
from omnipipe.server.vad import EnergyVAD
from omnipipe.util.field_error import FieldError

logger = logging.getLogger(__name__)

ENDPOINT = REALTIME_PATH
IDLE_POLL_S = 0.5  # how often the idle watch looks
DEFAULT_TURN_DETECTION: dict[str, Any] = TurnDetection().model_dump()
router = APIRouter()


class EventError(Exception):
    """A client event the server refuses: answered with an ``error`` event, the connection stays open."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value",
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.type = message, param, code, type


def _event_id() -> str:
    return f"event_{uuid.uuid4().hex[:24]}"


def _item_id() -> str:
    return f"item_{uuid.uuid4().hex[:24]}"


def parse_event(raw: Any) -> Any:
    """A decoded client frame -> its event model (``protocol.realtime.CLIENT_EVENT``), or the EventError naming
    the field the schema refuses."""
    if not isinstance(raw, dict):
        raise EventError("the event must be a JSON object", code="invalid_event")
    try:
        return CLIENT_EVENT.validate_python(raw)
    except ValidationError as exc:
        errors = exc.errors()
    kinds = {error["type"] for error in errors}
    if "union_tag_not_found" in kinds:
        raise EventError("type: required field is missing", "type", code="missing_field")
    if "union_tag_invalid" in kinds:
        raise EventError(f"type: unknown or unsupported event type {raw.get('type')!r} (supported: "
                         f"{', '.join(sorted(RealtimeSession.HANDLERS))})", "type", code="invalid_event_type")
    # every location starts with the event's type (the union's tag)
    error = from_validation_errors([{**e, "loc": tuple(e["loc"][1:])} for e in errors])
    raise EventError(error.message, error.param, code=error.code or "invalid_value")


def _sampling_check(fields: dict[str, Any], param: str) -> None:
    """A session value checked as the stage's SamplingParams will be (the same schema)."""
    try:
        SamplingParams.from_dict(fields)
    except ValueError as exc:
        rule = exc.rule if isinstance(exc, FieldError) else str(exc)
        raise EventError(f"{param}: {rule}", param) from None


def _decode_pcm16(data: str, param: str) -> np.ndarray:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise EventError(f"{param}: not valid base64", param, code="invalid_base64") from None
    if len(raw) % 2:
        raise EventError(f"{param}: pcm16 audio must have an even number of bytes, got {len(raw)}", param,
                         code="invalid_audio")
    return np.frombuffer(raw, dtype=PCM16_DTYPE).astype(np.float32) / 32768.0


@dataclass
class Turn:
    """What the next response answers: texts from items, and committed audio (24 kHz float32)."""

    texts: list[str] = field(default_factory=list)
    audio: np.ndarray | None = None

    def empty(self) -> bool:
        return not self.texts and self.audio is None


class RealtimeSession:
    def __init__(self, websocket: WebSocket, engine: AsyncOmni, pipeline: PipelineSpec, pool: EnginePool,
                 metrics: ServerMetrics, handle: Session | None = None) -> None:
        self.ws = websocket
        self.engine = engine
        self.pipeline = pipeline
        self.pool = pool
        self.metrics = metrics
        self.closed = False
        self.send_lock = asyncio.Lock()
        modalities = list(pipeline.output_modalities)
        self.session: dict[str, Any] = {
            "id": f"sess_{uuid.uuid4().hex[:24]}", "object": "realtime.session", "model": pool.model_name,
            "modalities": modalities, "voice": "default", "instructions": "", "input_audio_format": "pcm16",
            "output_audio_format": "pcm16", "turn_detection": dict(DEFAULT_TURN_DETECTION),
            "max_response_output_tokens": "inf", "temperature": None, "input_audio_transcription": None,
        }
        self.buffer: list[np.ndarray] = []
        self.buffer_bytes = 0
        self.max_buffer_bytes = pool.config.max_body_bytes
        self.vad = self._make_vad()
        self.turn = Turn()
        self.response_task: asyncio.Task[None] | None = None
        self.response_id: str | None = None
        self.last_item_id: str | None = None
        self._pending_item_id: str | None = None  # the item the audio being appended will become
        self.handle = handle  # this connection's slot in the server's session count
        self.paused = False
        self.pause_timeout_s = pool.config.pause_timeout_s
        self._pause_timer: asyncio.Task[None] | None = None
        self.idle_timeout_s = pool.config.idle_timeout_s
        self._last_activity = time.monotonic()
        self._idle_watch: asyncio.Task[None] | None = None
        self._cancel_reason = "client_cancelled"  # why the running response is being cancelled
        self._idle_closing = False  # the idle watch is closing the session (it must not be cancelled mid-close)
        self._timing_out = False
        self._transcriptions: set[asyncio.Task[None]] = set()
        # the turns so far, as the prompt's history; a spoken item's entry gets its words when transcribed
        self.conversation: list[dict[str, str]] = []
        self._turn_entries: list[dict[str, str]] = []  # the entries of the turn being gathered

    # ------------------------------------------------------------------ sending
    async def send(self, type_: str, **fields: Any) -> None:
        if self.closed:
            return
        payload = json.dumps({"type": type_, "event_id": _event_id(), **fields}, separators=(",", ":"))
        async with self.send_lock:
            try:
                await self.ws.send_text(payload)
            except Exception:  # noqa: BLE001 - the client went away; the receive loop notices
                self.closed = True

    async def send_error(self, message: str, *, param: str | None = None, code: str | None = None,
                         type_: str = "invalid_request_error", client_event_id: str | None = None) -> None:
        await self.send(ServerEvent.ERROR, error={"type": type_, "code": code, "message": message, "param": param,
                                        "event_id": client_event_id})

    # ------------------------------------------------------------------ loop
    async def run(self) -> None:
        await self.send(ServerEvent.SESSION_CREATED, session=self.session)
        if self.idle_timeout_s is not None:
            self._idle_watch = asyncio.create_task(self._watch_idle(), name="omnipipe-realtime-idle")
        try:
            while not self.closed:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:
                    await self.send_error("binary frames are not supported; send JSON text frames",
                                          code="invalid_event")
                    continue
                await self.handle_text(text)
        except WebSocketDisconnect:
            pass
        finally:
            self.closed = True
            if self._idle_watch is not None:
                if not self._idle_closing:
                    self._idle_watch.cancel()
                await asyncio.gather(self._idle_watch, return_exceptions=True)
            await self._stop_pause_timer()
            await self.cancel_response()
            for task in list(self._transcriptions):
                task.cancel()
            await asyncio.gather(*self._transcriptions, return_exceptions=True)

    async def handle_text(self, text: str) -> None:
        try:  # pydantic's parser: a nesting too deep for json's recursion is an error, not a RecursionError
            raw = pydantic_core.from_json(text)
        except ValueError as exc:
            await self.send_error(f"the event is not valid JSON: {exc}", code="invalid_json")
            return
        client_event_id = raw.get("event_id") if isinstance(raw, dict) and isinstance(raw.get("event_id"), str) \
            else None
        try:
            event = parse_event(raw)
            await self.HANDLERS[event.type](self, event)
        except EventError as exc:
            await self.send_error(exc.message, param=exc.param, code=exc.code, type_=exc.type,
                                  client_event_id=client_event_id)
        except APIError as exc:
            await self.send_error(exc.message, param=exc.param, code=exc.code, type_=exc.type,
                                  client_event_id=client_event_id)
        except (ValueError, TypeError) as exc:
            await self.send_error(str(exc), code="invalid_value", client_event_id=client_event_id)
        except Exception as exc:  # noqa: BLE001 - a server fault on one event: reported, the session goes on
            logger.exception("realtime event %r failed", raw.get("type") if isinstance(raw, dict) else None)
            await self.send_error(f"internal error: {type(exc).__name__}", code="internal_error", type_="server_error",
                                  client_event_id=client_event_id)

    # ------------------------------------------------------------------ session
    def _make_vad(self) -> EnergyVAD | None:
        detection = self.session["turn_detection"]
        if detection is None:
            return None
        return EnergyVAD(detection["threshold"], detection["silence_duration_ms"], detection["prefix_padding_ms"],
                         PCM16_RATE_HZ)

    def _check_modalities(self, value: list[str], param: str) -> list[str]:
        try:  # audio brings the transcript of the spoken answer
            return self.pipeline.check_output_modalities(value, param, with_transcript=True)
        except FieldError as exc:
            raise EventError(str(exc), param, code="unsupported_modality") from None

    def _turn_detection(self, value: TurnDetection | None) -> dict[str, Any] | None:
        if value is None:
            return None
        current = self.session["turn_detection"] or DEFAULT_TURN_DETECTION
        return {**current, **value.model_dump(include=value.model_fields_set), "type": "server_vad"}

    def _input_transcription(self, value: InputAudioTranscription | None) -> dict[str, Any] | None:
        param = "session.input_audio_transcription"
        if value is None:
            return None
        if self.pool.endpoint_pipelines.get("transcription") is None:
            raise EventError(f"{param}: pipeline {self.pipeline.name!r} has no transcription pipeline",
                             param, code="unsupported_feature")
        return {"model": value.model}

    async def on_session_update(self, event: SessionUpdate) -> None:
        update = event.session
        given = update.model_fields_set
        new = dict(self.session)
        if "modalities" in given:
            new["modalities"] = self._check_modalities(update.modalities, "session.modalities")
        if "voice" in given:
            self.pool.check_voice(update.voice, self.pipeline, "session.voice")
            new["voice"] = update.voice
        if "instructions" in given:
            if update.instructions and update.instructions.strip() and not self.pipeline.takes_history:
                raise EventError(f"session.instructions: pipeline {self.pipeline.name!r} answers one question at a "
                                 "time and takes no instructions", "session.instructions",
                                 code="unsupported_parameter")
            new["instructions"] = update.instructions
        for key in ("input_audio_format", "output_audio_format"):
            if key in given and getattr(update, key) != "pcm16":
                raise EventError(f"session.{key}: only 'pcm16' (24 kHz mono int16) is supported, got "
                                 f"{getattr(update, key)!r}", f"session.{key}", code="unsupported_format")
        if "turn_detection" in given:
            new["turn_detection"] = self._turn_detection(update.turn_detection)
        if "max_response_output_tokens" in given:
            limit = update.max_response_output_tokens
            if limit != "inf":
                _sampling_check({"max_tokens": limit}, "session.max_response_output_tokens")
            new["max_response_output_tokens"] = limit
        if "temperature" in given:
            if update.temperature is not None:
                _sampling_check({"temperature": update.temperature}, "session.temperature")
            new["temperature"] = update.temperature
        if "input_audio_transcription" in given:
            new["input_audio_transcription"] = self._input_transcription(update.input_audio_transcription)
        detection_changed = new["turn_detection"] != self.session["turn_detection"]
        self.session = new
        if detection_changed:
            self.vad = self._make_vad()
        await self.send(ServerEvent.SESSION_UPDATED, session=self.session)

    # ------------------------------------------------------------------ audio buffer
    async def on_append(self, event: InputAudioBufferAppend) -> None:
        if self.paused:
            return  # dropped unread
        samples = _decode_pcm16(event.audio, "audio")
        if self.buffer_bytes + samples.size * 2 > self.max_buffer_bytes:
            raise EventError(f"audio: the input audio buffer would exceed {self.max_buffer_bytes} bytes; commit or "
                             "clear it", "audio", code="buffer_too_large")
        if samples.size == 0:
            return
        self.buffer.append(samples)
        self.buffer_bytes += samples.size * 2
        if self.vad is None:
            return
        for vad_event in self.vad.feed(samples):
            if vad_event.kind == "speech_started":
                self.touch()
                await self.send(ServerEvent.INPUT_AUDIO_BUFFER_SPEECH_STARTED, audio_start_ms=vad_event.audio_ms,
                                item_id=self._next_item_id())
                await self.cancel_response("turn_detected")  # barge-in
            else:
                await self.send(ServerEvent.INPUT_AUDIO_BUFFER_SPEECH_STOPPED, audio_end_ms=vad_event.audio_ms,
                                item_id=self._next_item_id())
                detection = self.session["turn_detection"]
                try:
                    await self.commit(None)
                    if detection is not None and detection["create_response"]:
                        await self.start_response(None)
                except (EventError, APIError) as exc:
                    await self.send_error(exc.message, param=exc.param, code=exc.code)

    def _next_item_id(self) -> str:
        if self._pending_item_id is None:
            self._pending_item_id = _item_id()
        return self._pending_item_id

    async def commit(self, _: Any) -> None:
        if not self.buffer:
            raise EventError("the input audio buffer is empty", None, code=COMMIT_EMPTY)
        if "audio" not in self.pipeline.input_modalities:
            raise EventError(f"pipeline {self.pipeline.name!r} does not take audio input (it takes "
                             f"{', '.join(self.pipeline.input_modalities)})", None, code="unsupported_modality")
        audio = np.concatenate(self.buffer)
        self.turn.audio = audio if self.turn.audio is None else np.concatenate([self.turn.audio, audio])
        self._reset_buffer()
        item_id = self._next_item_id()
        self._pending_item_id = None
        await self.send(ServerEvent.INPUT_AUDIO_BUFFER_COMMITTED, previous_item_id=self.last_item_id, item_id=item_id)
        await self._item_created(item_id, [{"type": "input_audio", "transcript": None}])
        entry = {"role": "user", "content": ""}
        self._turn_entries.append(entry)
        announce = self.session["input_audio_transcription"] is not None
        remember = (self.pipeline.takes_history
                    and self.pool.endpoint_pipelines.get("transcription") is not None)
        if announce or remember:
            task = asyncio.create_task(self._transcribe(item_id, audio, entry, announce),
                                       name=f"omnipipe-transcribe-{item_id}")
            self._transcriptions.add(task)
            task.add_done_callback(self._transcriptions.discard)

    async def _transcribe(self, item_id: str, audio: np.ndarray, entry: dict[str, str], announce: bool) -> None:
        """Transcribe a committed audio item (the transcription pipeline, beside the response): its words join
        the conversation, and the client is sent them if it asked for ``input_audio_transcription``."""
        base = {"item_id": item_id, "content_index": 0}
        try:
            engine, _ = await self.pool.engine_for("transcription")
            final = None
            async for out in engine.generate({"prompt": "", "multi_modal_data": {"audio": (audio, PCM16_RATE_HZ)}},
                                             request_id=f"rt-transcribe-{uuid.uuid4().hex}",
                                             output_modalities=["text"]):
                final = out
            transcript = final.text.strip() if final is not None else ""
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the client, the session goes on
            if announce:
                error = from_engine_error(exc, {}).body()["error"]
                await self.send(ServerEvent.INPUT_AUDIO_TRANSCRIPTION_FAILED, **base, error=error)
            return
        entry["content"] = transcript
        if announce:
            await self.send(ServerEvent.INPUT_AUDIO_TRANSCRIPTION_COMPLETED, **base, transcript=transcript)

    def _reset_buffer(self) -> None:
        self.buffer, self.buffer_bytes = [], 0
        if self.vad is not None:
            self.vad.reset()

    async def on_clear(self, _: Any) -> None:
        self._reset_buffer()
        await self.send(ServerEvent.INPUT_AUDIO_BUFFER_CLEARED)

    # ------------------------------------------------------------------ items
    async def _item_created(self, item_id: str, content: list[dict[str, Any]]) -> None:
        self.touch()
        item = {"id": item_id, "object": "realtime.item", "type": "message", "status": "completed", "role": "user",
                "content": content}
        await self.send(ServerEvent.CONVERSATION_ITEM_CREATED, previous_item_id=self.last_item_id, item=item)
        self.last_item_id = item_id

    async def on_item_create(self, event: ConversationItemCreate) -> None:
        item = event.item
        if item.type != "message":
            raise EventError(f"item.type: only 'message' items are supported, got {item.type!r}",
                             "item.type", code="unsupported_item")
        if item.role != "user":
            raise EventError(f"item.role: only 'user' messages are supported, got {item.role!r}", "item.role",
                             code="unsupported_item")
        texts: list[str] = []
        for i, part in enumerate(item.content):
            if part.type not in ("input_text", "text"):
                raise EventError(f"item.content[{i}].type: only 'input_text' content is supported, got "
                                 f"{part.type!r}", f"item.content[{i}].type", code="unsupported_content")
            texts.append(part.text)
        text = " ".join(t.strip() for t in texts if t.strip())
        if not text:
            raise EventError("item.content: the message has no text", "item.content")
        if "text" not in self.pipeline.input_modalities:
            raise EventError(f"item.content: pipeline {self.pipeline.name!r} does not take text input",
                             "item.content", code="unsupported_modality")
        self.turn.texts.append(text)
        self._turn_entries.append({"role": "user", "content": text})
        item_id = item.id or _item_id()
        await self._item_created(item_id, [{"type": "input_text", "text": text}])

    # ------------------------------------------------------------------ responses
    @property
    def responding(self) -> bool:
        return self.response_task is not None and not self.response_task.done()

    async def on_response_create(self, event: ResponseCreate) -> None:
        await self.start_response(event.response)

    async def start_response(self, options: ResponseOptions | None) -> None:
        if self.paused:
            raise EventError("the session is paused; send session.resume first", None, code="session_paused")
        if self.responding:
            raise EventError("a response is already in progress; cancel it or wait for response.done", None,
                             code="conversation_already_has_active_response")
        if self.turn.empty():
            raise EventError("there is nothing to respond to: create a user message item or commit audio first",
                             None, code="no_input")
        modalities = self.session["modalities"]
        if options is not None and options.modalities is not None:
            modalities = self._check_modalities(options.modalities, "response.modalities")
        params: dict[str, Any] = {}
        if self.session["max_response_output_tokens"] != "inf":
            params["max_tokens"] = self.session["max_response_output_tokens"]
        if self.session["temperature"] is not None:
            params["temperature"] = self.session["temperature"]
        stage = self.pipeline.comprehension_stage or self.pipeline.stages[0].name
        sampling = {stage: SamplingParams.from_dict(params)} if params else None
        turn, self.turn = self.turn, Turn()
        prompt: dict[str, Any] = {"prompt": " ".join(turn.texts)}
        if self.pipeline.takes_history:
            instructions = self.session["instructions"].strip()
            prompt["history"] = ([{"role": "system", "content": instructions}] if instructions else []) + [
                dict(entry) for entry in self.conversation if entry["content"]]
        self.conversation.extend(self._turn_entries)
        self._turn_entries = []
        if turn.audio is not None:
            prompt["multi_modal_data"] = {"audio": (turn.audio, PCM16_RATE_HZ)}
        # what a stage finds wrong with the question is in the committed audio when the turn has no text
        fields = {"prompt.multi_modal_data.audio": "input_audio_buffer",
                  "prompt": "item.content" if turn.texts else "input_audio_buffer"}
        response_id = f"resp_{uuid.uuid4().hex[:24]}"
        self.response_id = response_id
        self.response_task = asyncio.create_task(self._respond(response_id, prompt, modalities, sampling, fields),
                                                 name=f"omnipipe-realtime-{response_id}")

    async def on_response_cancel(self, _: Any) -> None:
        if not self.responding:
            raise EventError("there is no response in progress to cancel", None, code="response_cancel_not_active")
        await self.cancel_response()

    async def cancel_response(self, reason: str = "client_cancelled") -> None:
        """Abort the running response (if any) and wait until it has sent its ``response.done`` (status
        ``cancelled`` with ``reason``: ``turn_detected`` for a barge-in, else ``client_cancelled``)."""
        task = self.response_task
        if task is None or task.done():
            return
        self._cancel_reason = reason
        if self.response_id is not None:
            await self.engine.abort(self.response_id)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _respond(self, response_id: str, prompt: dict[str, Any], modalities: list[str],
                       sampling: dict[str, SamplingParams] | None, fields: dict[str, str]) -> None:
        item_id = _item_id()
        spoken = "audio" in modalities
        base = {"response_id": response_id, "item_id": item_id, "output_index": 0, "content_index": 0}
        status, details, final = "failed", None, None
        text_parts: list[str] = []
        pcm: Pcm16Stream | None = None
        outputs = self.engine.generate(prompt, request_id=response_id, sampling_params=sampling,
                                       output_modalities=modalities)
        try:
            await self.send(ServerEvent.RESPONSE_CREATED, response={
                "id": response_id, "object": "realtime.response", "status": "in_progress", "status_details": None,
                "output": [], "modalities": modalities, "usage": None})
            async for out in outputs:
                if out.modality == "text" and out.text_delta:
                    text_parts.append(out.text_delta)
                    kind = ServerEvent.RESPONSE_AUDIO_TRANSCRIPT_DELTA if spoken else ServerEvent.RESPONSE_TEXT_DELTA
                    await self.send(kind, delta=out.text_delta, **base)
                elif out.modality == "audio" and spoken and out.audio is not None and out.sample_rate_hz:
                    pcm = pcm or Pcm16Stream(out.sample_rate_hz)
                    data = pcm.feed(out.audio)
                    if data:
                        await self.send(ServerEvent.RESPONSE_AUDIO_DELTA, delta=base64.b64encode(data).decode(), **base)
                elif out.finished:
                    final = out
            if final is not None and final.finish_reason == "abort":  # cancel_response's abort got here first
                raise asyncio.CancelledError
            if pcm is not None:
                tail = pcm.flush()
                if tail:
                    await self.send(ServerEvent.RESPONSE_AUDIO_DELTA, delta=base64.b64encode(tail).decode(), **base)
            status = "completed"
        except asyncio.CancelledError:
            status, details = "cancelled", {"type": "cancelled", "reason": self._cancel_reason}
        except Exception as exc:  # noqa: BLE001 - reported as an error event and a failed response
            error = from_engine_error(exc, fields)
            details = {"type": "failed", "error": {"type": error.type, "code": error.code}}
            await self.send_error(error.message, param=error.param, code=error.code, type_=error.type)
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]
        text = "".join(text_parts)
        if self.pipeline.takes_history and text.strip():  # a cancelled answer: the words sent before the cancel
            self.conversation.append({"role": "assistant", "content": text.strip()})
        if status == "completed":
            if spoken:
                await self.send(ServerEvent.RESPONSE_AUDIO_DONE, **base)
                await self.send(ServerEvent.RESPONSE_AUDIO_TRANSCRIPT_DONE, transcript=text, **base)
            else:
                await self.send(ServerEvent.RESPONSE_TEXT_DONE, text=text, **base)
        if final is not None:
            self.metrics.observe(ENDPOINT, final.metrics)
        tokens = final.metrics.num_output_tokens if final is not None and final.metrics is not None else 0
        content = [{"type": "audio", "transcript": text}] if spoken else [{"type": "text", "text": text}]
        self.touch()  # the idle count starts when the answer ends
        await self.send(ServerEvent.RESPONSE_DONE, response={
            "id": response_id, "object": "realtime.response", "status": status, "status_details": details,
            "modalities": modalities,
            "output": [{"id": item_id, "object": "realtime.item", "type": "message", "role": "assistant",
                        "status": "completed" if status == "completed" else "incomplete", "content": content}],
            "usage": {"total_tokens": tokens, "input_tokens": 0, "output_tokens": tokens}})

    # ------------------------------------------------------------------ pause / resume (extension)
    async def on_pause(self, _: Any) -> None:
        if not self.paused:
            self.paused = True
            if self.handle is not None:
                self.handle.pause()
            await self.cancel_response()
            self._reset_buffer()
            self._pause_timer = asyncio.create_task(self._pause_timeout(), name="omnipipe-realtime-pause")
        await self.send(ServerEvent.SESSION_PAUSED, pause_timeout_s=self.pause_timeout_s)

    async def on_resume(self, _: Any) -> None:
        if self.paused:
            await self._stop_pause_timer()
            self.paused = False
            if self.handle is not None:
                self.handle.resume()
        await self.send(ServerEvent.SESSION_RESUMED)

    def touch(self) -> None:
        """Something happened in the session (speech, a commit, an item, an answer): the idle count restarts."""
        self._last_activity = time.monotonic()

    async def _watch_idle(self) -> None:
        assert self.idle_timeout_s is not None
        warned = False
        while not self.closed:
            if self.paused or self.responding:  # a pause has its own timeout; an answer is activity
                self.touch()
            idle_s = time.monotonic() - self._last_activity
            left_s = self.idle_timeout_s - idle_s
            if left_s <= 0:
                self._idle_closing = True
                await self.send_error(f"nothing happened in the session for {self.idle_timeout_s:g} s; closing it "
                                      "to free its place", code=IDLE_TIMEOUT)
                self.closed = True
                with contextlib.suppress(Exception):  # already gone
                    await self.ws.close(code=CLOSE_NORMAL, reason=IDLE_TIMEOUT)
                return
            if left_s <= IDLE_WARNING_S and not warned:
                warned = True
                await self.send(ServerEvent.SESSION_IDLE_WARNING, closes_in_s=round(left_s, 1))
            elif left_s > IDLE_WARNING_S:
                warned = False
            await asyncio.sleep(min(IDLE_POLL_S, max(left_s, 0.01)))

    async def _pause_timeout(self) -> None:
        await asyncio.sleep(self.pause_timeout_s)
        self._timing_out = True
        await self.send_error(f"the session was paused for more than {self.pause_timeout_s:g} s; closing it",
                              code=PAUSE_TIMEOUT)
        self.closed = True
        with contextlib.suppress(Exception):  # already gone
            await self.ws.close(code=CLOSE_NORMAL, reason=PAUSE_TIMEOUT)

    async def _stop_pause_timer(self) -> None:
        timer, self._pause_timer = self._pause_timer, None
        if timer is None:
            return
        if not self._timing_out:
            timer.cancel()
        await asyncio.gather(timer, return_exceptions=True)

    HANDLERS: ClassVar[dict[str, Any]] = {
        ClientEvent.SESSION_UPDATE: on_session_update,
        ClientEvent.SESSION_PAUSE: on_pause,
        ClientEvent.SESSION_RESUME: on_resume,
        ClientEvent.INPUT_AUDIO_BUFFER_APPEND: on_append,
        ClientEvent.INPUT_AUDIO_BUFFER_COMMIT: commit,
        ClientEvent.INPUT_AUDIO_BUFFER_CLEAR: on_clear,
        ClientEvent.CONVERSATION_ITEM_CREATE: on_item_create,
        ClientEvent.RESPONSE_CREATE: on_response_create,
        ClientEvent.RESPONSE_CANCEL: on_response_cancel,
    }


def _authorized(websocket: WebSocket, api_key: str | None) -> bool:
    if api_key is None:
        return True
    scheme, _, token = (websocket.headers.get("authorization") or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


@router.websocket(ENDPOINT)
async def realtime(websocket: WebSocket) -> None:
    pool: EnginePool = websocket.app.state.pool
    metrics: ServerMetrics = websocket.app.state.metrics
    if not _authorized(websocket, pool.config.api_key):
        await websocket.close(code=CLOSE_POLICY)  # before accept: the handshake is answered 403
        metrics.count_request(ENDPOINT, 403)
        return
    await websocket.accept()
    metrics.count_request(ENDPOINT, 101)
    tracker: SessionTracker = websocket.app.state.sessions
    handle = tracker.open("realtime")
    if handle is None:
        await _refuse(websocket, at_capacity_error(tracker.capacity))
        return
    try:
        try:
            engine, pipeline = await pool.engine_for("chat")
        except APIError as exc:
            await _refuse(websocket, exc)
            return
        session = RealtimeSession(websocket, engine, pipeline, pool, metrics, handle)
        await session.run()
        if websocket.application_state != WebSocketState.DISCONNECTED and \
                websocket.client_state != WebSocketState.DISCONNECTED:
            with contextlib.suppress(Exception):  # already gone
                await websocket.close()
    finally:
        handle.close()


async def _refuse(websocket: WebSocket, exc: APIError) -> None:
    """An ``error`` event, then close: 1013 (try again later) for 429/503, else 1008."""
    with contextlib.suppress(Exception):  # already gone
        await websocket.send_text(json.dumps({"type": ServerEvent.ERROR, "event_id": _event_id(), "error": {
            "type": exc.type, "code": exc.code, "message": exc.message, "param": None, "event_id": None}}))
        await websocket.close(code=CLOSE_TRY_AGAIN if exc.status in (429, 503) else CLOSE_POLICY)
