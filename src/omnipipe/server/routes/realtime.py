"""``WS /v1/realtime``: OpenAI's Realtime API (GA, or beta for a client that asks for it) over one WebSocket, one
response at a time.

Dialect: GA unless the handshake carries ``OpenAI-Beta: realtime=v1`` (``client.beta.realtime.connect`` sends it)
or offers the ``openai-beta.realtime-v1`` subprotocol; ``omnipipe.protocol.realtime`` holds both schemas and the
names that differ. Authentication: with ``--api-key`` the handshake must carry ``Authorization: Bearer KEY`` (a query
parameter is not accepted); otherwise the handshake is refused (HTTP 403). The session uses the server's main
pipeline; if it has not loaded yet the server sends an ``error`` (code ``engine_loading``) and closes with 1013. A
WebSocket counts as one session of the server from accept to close; a server already holding ``capacity`` sessions
sends an ``error`` (code ``worker_at_capacity``) and closes with 1013.

Every client event is validated with the dialect's schema first (an unknown field is refused by name), then with
what depends on the pipeline. A bad client event (invalid JSON, unknown type, missing, unknown or invalid field, bad
base64) gets an ``error`` event naming the field and the connection stays open; so does a binary frame, and an event
the server fails on (type ``server_error``, code ``internal_error``, logged).

- ``session.update``: GA ``{type: "realtime", output_modalities, instructions, audio: {input: {format,
  transcription, noise_reduction, turn_detection}, output: {format, voice, speed}}, max_output_tokens, tool_choice,
  truncation, ...}``; beta ``{modalities, voice, speed, instructions, input_audio_format, output_audio_format,
  turn_detection, input_audio_transcription, max_response_output_tokens, temperature}``. Only the fields given
  change. Audio is pcm16 at 24 kHz only; ``output_modalities`` is ``["audio"]`` (speech and its transcript) or
  ``["text"]``; ``speed`` goes to the family's speed stage; ``instructions`` are the conversation's system
  message for a pipeline that takes history (the default family's), refused by one that answers one question at a
  time; ``voice`` (a name, an OpenAI alias or ``{id}``) is validated like ``/v1/audio/speech``'s. What omnipipe does
  not do is refused by name rather than dropped: tools, tracing, noise reduction, ``semantic_vad``,
  ``idle_timeout_ms``, transcription prompts, languages other than English, audio formats other than pcm16.
- Turn detection: ``null`` (the client commits) or ``server_vad`` on Silero VAD (``server.vad``): ``threshold`` is
  OpenAI's speech probability (0..1, default 0.5), ``silence_duration_ms``, ``prefix_padding_ms``,
  ``create_response`` (speech that stops commits the buffer and starts a response) and ``interrupt_response``
  (speech that starts while a response runs cancels it: a barge-in, ``response.done`` status ``cancelled``, reason
  ``turn_detected``).
- ``input_audio_buffer.append`` ``{audio}``, ``.commit``, ``.clear``. A committed buffer becomes a user item with
  ``input_audio`` content; the server transcribes it beside the response (its transcription pipeline, started on
  first use) so its words join the conversation, and sends
  ``conversation.item.input_audio_transcription.completed`` (or ``.failed``) when the session asked for
  transcription.
- Conversation: ``conversation.item.create`` adds a user message (``input_text`` and/or ``input_audio`` parts), a
  system message or an assistant message (their text, for a pipeline that takes history), appended at the end;
  ``conversation.item.truncate`` cuts an assistant audio item's transcript to what was heard by ``audio_end_ms``
  (the words in proportion to the audio: the talker speaks at an even pace), ``conversation.item.delete`` removes
  an item, ``conversation.item.retrieve`` returns one. A response answers the user items added since the last
  response (texts joined; with audio, the text goes along as the instruction) and, for a pipeline that takes
  history, is given every earlier item: instructions, messages, transcripts of spoken items (a transcript not ready
  when the response starts is left out) and the words of earlier answers (of a cancelled answer, those sent before
  the cancel, unless the client truncated it).
- ``response.create`` (``{response: {output_modalities | modalities, max_output_tokens |
  max_response_output_tokens, conversation: "auto"}}``) and ``response.cancel``. A response sends
  ``response.created``, ``response.output_item.added``, the item's ``conversation.item.added`` (beta:
  ``.created``), ``response.content_part.added``, the deltas (``response.output_audio_transcript.delta`` and
  ``response.output_audio.delta``, base64 pcm16 at 24 kHz resampled without seams, or
  ``response.output_text.delta``; beta names ``response.audio_transcript.delta`` ...), their ``.done`` events,
  ``response.content_part.done``, ``response.output_item.done``, ``conversation.item.done`` (GA) and
  ``response.done`` ``{response: {id, status: completed|cancelled|failed, status_details, output, usage}}``. A
  cancelled response closes its part and item too (status ``incomplete``). A disconnect aborts it.
- Extensions (not in the OpenAI API): ``session.pause`` and ``session.resume``, answered with ``session.paused``
  ``{pause_timeout_s}`` and ``session.resumed`` (both idempotent). Pausing cancels a response in progress and
  clears the uncommitted input audio buffer. While paused, appended audio is dropped unread (so the VAD hears
  nothing), ``response.create`` is refused (``error`` code ``session_paused``), and other events work as usual. A
  session paused longer than the server's pause timeout (``--pause-timeout-s``, default 300 s) gets an ``error``
  (code ``pause_timeout``) and is closed (1000). A server whose open realtime sessions are all paused reports the
  state ``DUPLEX_PAUSED`` on ``/health``.
- Idle timeout (extension; a worker's ``--idle-timeout-s``, default 120 s there, off for ``serve``): a session that is
  not paused and in which for that long nobody spoke (the VAD heard no speech), nothing was committed or typed, and
  no answer ran, is sent ``session.idle_warning`` ``{closes_in_s}`` 15 s before the end, then an ``error`` (code
  ``idle_timeout``) and is closed (1000): an open page nobody uses gives its worker slot back. Any activity
  restarts the count.

Not supported: function calls and tools, out-of-band responses (``conversation: "none"``), inserting items
anywhere but at the end, ``output_audio_buffer.clear`` (WebRTC only), transcription sessions.
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
    BETA,
    BETA_CLIENT_EVENT,
    BETA_NAMES,
    CLIENT_EVENT,
    COMMIT_EMPTY,
    GA,
    IDLE_TIMEOUT,
    IDLE_WARNING_S,
    PAUSE_TIMEOUT,
    BetaResponseOptions,
    ClientEvent,
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    InputAudioBufferAppend,
    ResponseCancel,
    ResponseCreate,
    ResponseOptions,
    ServerEvent,
    negotiate_dialect,
)
from omnipipe.protocol.worker import CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TRY_AGAIN, REALTIME_PATH
from omnipipe.server.audio_stream import Pcm16Stream
from omnipipe.server.capacity import Session, SessionTracker, at_capacity_error
from omnipipe.server.engines import EnginePool, with_voice
from omnipipe.server.errors import APIError, from_engine_error, from_validation_errors
from omnipipe.server.prometheus import ServerMetrics
from omnipipe.server.realtime_settings import (
    Change,
    Settings,
    changes,
    output_modalities_field,
    part_type,
    response_object,
    session_object,
)
from omnipipe.server.vad import SileroVAD
from omnipipe.util.field_error import FieldError

logger = logging.getLogger(__name__)

ENDPOINT = REALTIME_PATH
IDLE_POLL_S = 0.5  # how often the idle watch looks
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


def parse_event(raw: Any, dialect: str = GA) -> Any:
    """A decoded client frame -> its event model (the dialect's schema in ``protocol.realtime``), or the
    EventError naming the field the schema refuses."""
    if not isinstance(raw, dict):
        raise EventError("the event must be a JSON object", code="invalid_event")
    try:
        return (CLIENT_EVENT if dialect == GA else BETA_CLIENT_EVENT).validate_python(raw)
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
    code = "unknown_parameter" if any(e["type"] == "extra_forbidden" for e in errors) else error.code
    raise EventError(error.message, error.param, code=code or "invalid_value")


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
class ConversationItem:
    """One item of the conversation: its words (what the history gives the thinker) and how the client sees it."""

    id: str
    role: str  # user | assistant | system
    words: str = ""  # text, or the transcript of spoken audio (empty until transcribed)
    audio: np.ndarray | None = None  # a user item's spoken part (24 kHz)
    audio_ms: float = 0.0  # an assistant item's audio sent
    spoken: bool = False  # the item's content is audio (a transcript beside it)
    text_part: str | None = None  # a user item's typed part, beside its audio
    status: str = "completed"
    pending: bool = False  # a user item no response has answered yet

    def wire(self, dialect: str) -> dict[str, Any]:
        if self.role == "assistant":
            kind = part_type(dialect, self.spoken)
            content = [{"type": kind, "transcript": self.words} if self.spoken else {"type": kind, "text": self.words}]
        elif self.spoken:
            content = [{"type": "input_audio", "transcript": self.words or None}]
            if self.text_part:
                content.insert(0, {"type": "input_text", "text": self.text_part})
        else:
            content = [{"type": "input_text", "text": self.words}]
        return {"id": self.id, "object": "realtime.item", "type": "message", "status": self.status,
                "role": self.role, "content": content}


@dataclass
class Turn:
    """What the next response answers: texts and spoken audio (24 kHz float32) of the pending user items."""

    texts: list[str] = field(default_factory=list)
    audio: np.ndarray | None = None


class RealtimeSession:
    def __init__(self, websocket: WebSocket, engine: AsyncOmni, pipeline: PipelineSpec, pool: EnginePool,
                 metrics: ServerMetrics, handle: Session | None = None, dialect: str = GA) -> None:
        self.ws = websocket
        self.engine = engine
        self.pipeline = pipeline
        self.pool = pool
        self.metrics = metrics
        self.dialect = dialect
        self.closed = False
        self.send_lock = asyncio.Lock()
        self.session_id = f"sess_{uuid.uuid4().hex[:24]}"
        modalities = ["text", "audio"] if "audio" in pipeline.output_modalities else ["text"]
        self.settings = Settings(modalities=modalities)
        self.buffer: list[np.ndarray] = []
        self.buffer_bytes = 0
        self.max_buffer_bytes = pool.config.max_body_bytes
        self.vad = self._make_vad()
        self.items: list[ConversationItem] = []
        self.response_task: asyncio.Task[None] | None = None
        self.response_id: str | None = None
        self.response_item: ConversationItem | None = None
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

    # ------------------------------------------------------------------ sending
    async def send(self, type_: str, **fields: Any) -> None:
        if self.closed:
            return
        if self.dialect == BETA and type_ in BETA_NAMES:
            renamed = BETA_NAMES[type_]
            if renamed is None:
                return
            type_ = renamed
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

    def session_object(self) -> dict[str, Any]:
        return session_object(self.settings, self.dialect, self.session_id, self.pool.model_name)

    # ------------------------------------------------------------------ loop
    async def run(self) -> None:
        await self.send(ServerEvent.SESSION_CREATED, session=self.session_object())
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
            event = parse_event(raw, self.dialect)
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
    def _make_vad(self) -> SileroVAD | None:
        detection = self.settings.turn_detection
        if detection is None:
            return None
        return SileroVAD(detection["threshold"], detection["silence_duration_ms"], detection["prefix_padding_ms"],
                         PCM16_RATE_HZ)

    def _check_modalities(self, value: list[str], param: str) -> list[str]:
        try:  # audio brings the transcript of the spoken answer
            return self.pipeline.check_output_modalities(value, param, with_transcript=True)
        except FieldError as exc:
            raise EventError(str(exc), param, code="unsupported_modality") from None

    def _check_change(self, change: Change) -> Any:
        """The value a session change sets, checked against the pipeline (an EventError naming its field)."""
        key, value, param = change.key, change.value, change.param
        if key == "modalities":
            return self._check_modalities(value, param)
        if key == "voice":
            self.pool.check_voice(value, self.pipeline, param)
            return value
        if key == "speed":
            if value != 1.0 and self.pipeline.serving.speed_stage is None:
                raise EventError(f"{param}: pipeline {self.pipeline.name!r} cannot change the speaking rate", param,
                                 code="unsupported_parameter")
            return float(value)
        if key == "instructions":
            if value.strip() and not self.pipeline.takes_history:
                raise EventError(f"{param}: pipeline {self.pipeline.name!r} answers one question at a time and "
                                 "takes no instructions", param, code="unsupported_parameter")
            return value
        if key == "max_output_tokens":
            if value != "inf":
                _sampling_check({"max_tokens": value}, param)
            return value
        if key == "temperature":
            if value is not None:
                _sampling_check({"temperature": value}, param)
            return value
        if key == "transcription":
            if value is not None and self.pool.endpoint_pipelines.get("transcription") is None:
                raise EventError(f"{param}: pipeline {self.pipeline.name!r} has no transcription pipeline", param,
                                 code="unsupported_feature")
            return value
        return value

    async def on_session_update(self, event: Any) -> None:
        update = event.session
        if update.model is not None:
            self.pool.check_model(update.model, "chat")
        new = {change.key: self._check_change(change) for change in changes(update, self.settings)}
        detection_changed = "turn_detection" in new and new["turn_detection"] != self.settings.turn_detection
        for key, value in new.items():
            setattr(self.settings, key, value)
        if detection_changed:
            self.vad = self._make_vad()
        await self.send(ServerEvent.SESSION_UPDATED, session=self.session_object())

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
        for vad_event in await asyncio.to_thread(self.vad.feed, samples):
            detection = self.settings.turn_detection or {}
            if vad_event.kind == "speech_started":
                self.touch()
                await self.send(ServerEvent.INPUT_AUDIO_BUFFER_SPEECH_STARTED, audio_start_ms=vad_event.audio_ms,
                                item_id=self._next_item_id())
                if detection.get("interrupt_response", True):
                    await self.cancel_response("turn_detected")  # barge-in
            else:
                await self.send(ServerEvent.INPUT_AUDIO_BUFFER_SPEECH_STOPPED, audio_end_ms=vad_event.audio_ms,
                                item_id=self._next_item_id())
                try:
                    await self.commit(None)
                    if detection.get("create_response", True) and not self.responding:
                        await self.start_response(None)
                except (EventError, APIError) as exc:
                    await self.send_error(exc.message, param=exc.param, code=exc.code)

    def _next_item_id(self) -> str:
        if self._pending_item_id is None:
            self._pending_item_id = _item_id()
        return self._pending_item_id

    def _check_takes_audio(self, param: str | None) -> None:
        if "audio" not in self.pipeline.input_modalities:
            raise EventError(f"pipeline {self.pipeline.name!r} does not take audio input (it takes "
                             f"{', '.join(self.pipeline.input_modalities)})", param, code="unsupported_modality")

    async def commit(self, _: Any) -> None:
        if not self.buffer:
            raise EventError("the input audio buffer is empty", None, code=COMMIT_EMPTY)
        self._check_takes_audio(None)
        audio = np.concatenate(self.buffer)
        self._reset_buffer()
        item_id = self._next_item_id()
        self._pending_item_id = None
        await self.send(ServerEvent.INPUT_AUDIO_BUFFER_COMMITTED, previous_item_id=self._last_item_id(),
                        item_id=item_id)
        await self._add_item(ConversationItem(item_id, "user", audio=audio, spoken=True, pending=True))

    def _transcribe_later(self, item: ConversationItem) -> None:
        announce = self.settings.transcription is not None
        remember = self.pipeline.takes_history and self.pool.endpoint_pipelines.get("transcription") is not None
        if announce or remember:
            task = asyncio.create_task(self._transcribe(item, announce), name=f"omnipipe-transcribe-{item.id}")
            self._transcriptions.add(task)
            task.add_done_callback(self._transcriptions.discard)

    async def _transcribe(self, item: ConversationItem, announce: bool) -> None:
        """Transcribe a spoken user item (the transcription pipeline, beside the response): its words join the
        conversation, and the client is sent them if it asked for transcription."""
        assert item.audio is not None
        content_index = 1 if item.text_part else 0
        base = {"item_id": item.id, "content_index": content_index}
        try:
            engine, _ = await self.pool.engine_for("transcription")
            final = None
            async for out in engine.generate({"prompt": "",
                                              "multi_modal_data": {"audio": (item.audio, PCM16_RATE_HZ)}},
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
        item.words = transcript
        if announce:
            await self.send(ServerEvent.INPUT_AUDIO_TRANSCRIPTION_COMPLETED, **base, transcript=transcript,
                            usage={"type": "duration", "seconds": round(len(item.audio) / PCM16_RATE_HZ, 3)})

    def _reset_buffer(self) -> None:
        self.buffer, self.buffer_bytes = [], 0
        if self.vad is not None:
            self.vad.reset()

    async def on_clear(self, _: Any) -> None:
        self._reset_buffer()
        await self.send(ServerEvent.INPUT_AUDIO_BUFFER_CLEARED)

    # ------------------------------------------------------------------ items
    def _last_item_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def _find(self, item_id: str, param: str = "item_id") -> ConversationItem:
        for item in self.items:
            if item.id == item_id:
                return item
        raise EventError(f"{param}: no item {item_id!r} in the conversation", param, code="item_not_found")

    async def _add_item(self, item: ConversationItem) -> None:
        """Append an item and announce it (``conversation.item.added`` and ``.done``; beta ``.created``)."""
        self.touch()
        previous = self._last_item_id()
        self.items.append(item)
        await self.send(ServerEvent.CONVERSATION_ITEM_ADDED, previous_item_id=previous, item=item.wire(self.dialect))
        if item.status == "completed":
            await self.send(ServerEvent.CONVERSATION_ITEM_DONE, previous_item_id=previous,
                            item=item.wire(self.dialect))
        if item.role == "user" and item.spoken:
            self._transcribe_later(item)

    async def on_item_create(self, event: ConversationItemCreate) -> None:
        item = event.item
        if event.previous_item_id is not None and event.previous_item_id != self._last_item_id():
            raise EventError("previous_item_id: items can only be added at the end of the conversation (leave it "
                             "out, or give the last item's id)", "previous_item_id", code="unsupported_parameter")
        if item.id is not None and any(existing.id == item.id for existing in self.items):
            raise EventError(f"item.id: an item {item.id!r} already exists", "item.id", code="duplicate_item_id")
        if item.role != "user" and not self.pipeline.takes_history:
            raise EventError(f"item.role: pipeline {self.pipeline.name!r} answers one question at a time; only "
                             "'user' items are supported", "item.role", code="unsupported_item")
        allowed = {"user": ("input_text", "input_audio"), "system": ("input_text",),
                   "assistant": ("output_text", "output_audio", "text", "audio")}[item.role]
        texts: list[str] = []
        audio: np.ndarray | None = None
        for i, part in enumerate(item.content):
            param = f"item.content[{i}]"
            if part.type not in allowed:
                raise EventError(f"{param}.type: a {item.role} item takes {', '.join(allowed)} content, got "
                                 f"{part.type!r}", f"{param}.type", code="unsupported_content")
            if part.type == "input_audio":
                if part.audio is None:
                    raise EventError(f"{param}.audio: required for input_audio content", f"{param}.audio",
                                     code="missing_field")
                self._check_takes_audio(f"{param}.audio")
                samples = _decode_pcm16(part.audio, f"{param}.audio")
                if samples.size == 0:
                    raise EventError(f"{param}.audio: the audio is empty", f"{param}.audio")
                audio = samples if audio is None else np.concatenate([audio, samples])
            else:
                value = part.text if part.type in ("input_text", "output_text", "text") else part.transcript
                if value is not None and value.strip():
                    texts.append(value.strip())
        text = " ".join(texts)
        if not text and audio is None:
            raise EventError("item.content: the message has no text", "item.content")
        if item.role == "user" and text and "text" not in self.pipeline.input_modalities:
            raise EventError(f"item.content: pipeline {self.pipeline.name!r} does not take text input",
                             "item.content", code="unsupported_modality")
        spoken = audio is not None or (item.role == "assistant" and
                                       any(p.type in ("output_audio", "audio") for p in item.content))
        new = ConversationItem(item.id or _item_id(), item.role, spoken=spoken, pending=item.role == "user",
                               audio=audio)
        if audio is not None:
            new.text_part = text or None
        else:
            new.words = text
        await self._add_item(new)

    async def on_item_truncate(self, event: ConversationItemTruncate) -> None:
        item = self._find(event.item_id)
        if item.role != "assistant" or not item.spoken:
            raise EventError("item_id: only an assistant item with audio can be truncated", "item_id",
                             code="invalid_item")
        if item is self.response_item and self.responding:
            raise EventError("item_id: the item's response is still running; cancel it first", "item_id",
                             code="invalid_item")
        if event.audio_end_ms > item.audio_ms + 1:
            raise EventError(f"audio_end_ms: the item has {item.audio_ms:.0f} ms of audio, got {event.audio_end_ms}",
                             "audio_end_ms")
        words = item.words.split()
        keep = round(len(words) * event.audio_end_ms / item.audio_ms) if item.audio_ms else 0
        item.words = " ".join(words[:keep])
        item.audio_ms = float(event.audio_end_ms)
        await self.send(ServerEvent.CONVERSATION_ITEM_TRUNCATED, item_id=item.id, content_index=event.content_index,
                        audio_end_ms=event.audio_end_ms)

    async def on_item_delete(self, event: ConversationItemDelete) -> None:
        item = self._find(event.item_id)
        if item is self.response_item and self.responding:
            raise EventError("item_id: the item's response is still running; cancel it first", "item_id",
                             code="invalid_item")
        self.items.remove(item)
        await self.send(ServerEvent.CONVERSATION_ITEM_DELETED, item_id=item.id)

    async def on_item_retrieve(self, event: ConversationItemRetrieve) -> None:
        item = self._find(event.item_id)
        await self.send(ServerEvent.CONVERSATION_ITEM_RETRIEVED, item=item.wire(self.dialect))

    # ------------------------------------------------------------------ responses
    @property
    def responding(self) -> bool:
        return self.response_task is not None and not self.response_task.done()

    async def on_response_create(self, event: ResponseCreate) -> None:
        await self.start_response(event.response)

    def _take_turn(self) -> tuple[Turn, list[dict[str, str]]]:
        """The pending user items as the turn, and every other item before them as the history."""
        turn = Turn()
        history: list[dict[str, str]] = []
        instructions = self.settings.instructions.strip()
        if instructions:
            history.append({"role": "system", "content": instructions})
        for item in self.items:
            if item.pending:
                if item.text_part or (item.words and not item.spoken):
                    turn.texts.append(item.text_part or item.words)
                if item.audio is not None:
                    turn.audio = item.audio if turn.audio is None else np.concatenate([turn.audio, item.audio])
                item.pending = False
            elif item.words:
                history.append({"role": item.role, "content": item.words})
        return turn, history

    async def start_response(self, options: ResponseOptions | BetaResponseOptions | None) -> None:
        if self.paused:
            raise EventError("the session is paused; send session.resume first", None, code="session_paused")
        if self.responding:
            raise EventError("a response is already in progress; cancel it or wait for response.done", None,
                             code="conversation_already_has_active_response")
        if not any(item.pending for item in self.items):
            raise EventError("there is nothing to respond to: create a user message item or commit audio first",
                             None, code="no_input")
        modalities = self.settings.modalities
        limit = self.settings.max_output_tokens
        if options is not None:
            asked = options.output_modalities if isinstance(options, ResponseOptions) else options.modalities
            if asked is not None:
                field_name = output_modalities_field(self.dialect)
                modalities = self._check_modalities(["text", "audio"] if "audio" in asked else ["text"],
                                                    f"response.{field_name}")
            asked_limit = options.max_output_tokens if isinstance(options, ResponseOptions) \
                else options.max_response_output_tokens
            if asked_limit is not None:
                name = "max_output_tokens" if isinstance(options, ResponseOptions) else "max_response_output_tokens"
                if asked_limit != "inf":
                    _sampling_check({"max_tokens": asked_limit}, f"response.{name}")
                limit = asked_limit
        params: dict[str, Any] = {}
        if limit != "inf":
            params["max_tokens"] = limit
        if self.settings.temperature is not None:
            params["temperature"] = self.settings.temperature
        stage = self.pipeline.comprehension_stage or self.pipeline.stages[0].name
        sampling = {stage: SamplingParams.from_dict(params)} if params else {}
        speed_stage = self.pipeline.serving.speed_stage
        if speed_stage is not None and "audio" in modalities and self.settings.speed != 1.0:
            sampling[speed_stage] = SamplingParams(extra={"speed": self.settings.speed})
        if "audio" in modalities:  # the session's voice, checked when it was set
            voice = self.pool.check_voice(self.settings.voice, self.pipeline, "session.voice")
            sampling = with_voice(sampling, voice, self.pipeline, "session.voice")
        turn, history = self._take_turn()
        prompt: dict[str, Any] = {"prompt": " ".join(turn.texts)}
        if self.pipeline.takes_history:
            prompt["history"] = history
        if turn.audio is not None:
            prompt["multi_modal_data"] = {"audio": (turn.audio, PCM16_RATE_HZ)}
        # what a stage finds wrong with the question is in the committed audio when the turn has no text
        fields = {"prompt.multi_modal_data.audio": "input_audio_buffer",
                  "prompt": "item.content" if turn.texts else "input_audio_buffer"}
        response_id = f"resp_{uuid.uuid4().hex[:24]}"
        self.response_id = response_id
        self.response_task = asyncio.create_task(
            self._respond(response_id, prompt, modalities, sampling or None, fields, limit),
            name=f"omnipipe-realtime-{response_id}")

    async def on_response_cancel(self, event: ResponseCancel) -> None:
        if not self.responding:
            raise EventError("there is no response in progress to cancel", None, code="response_cancel_not_active")
        if event.response_id is not None and event.response_id != self.response_id:
            raise EventError(f"response_id: {event.response_id!r} is not the response in progress", "response_id",
                             code="response_cancel_not_active")
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
                       sampling: dict[str, SamplingParams] | None, fields: dict[str, str],
                       max_output_tokens: int | str) -> None:
        spoken = "audio" in modalities
        item = ConversationItem(_item_id(), "assistant", spoken=spoken, status="in_progress")
        self.response_item = item
        base = {"response_id": response_id, "item_id": item.id, "output_index": 0, "content_index": 0}

        def part(words: str) -> dict[str, str]:  # the content part in response.content_part.added / .done
            return {"type": "audio", "transcript": words} if spoken else {"type": "text", "text": words}
        status, details, final = "failed", None, None
        text_parts: list[str] = []
        audio_samples = 0
        pcm: Pcm16Stream | None = None

        def response(state: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                     details: dict[str, Any] | None = None) -> dict[str, Any]:
            return response_object(self.dialect, response_id, state, modalities, output, details, usage,
                                   self.settings.voice, max_output_tokens)

        async def audio_delta(data: bytes) -> None:
            nonlocal audio_samples
            audio_samples += len(data) // 2
            await self.send(ServerEvent.RESPONSE_OUTPUT_AUDIO_DELTA, delta=base64.b64encode(data).decode(), **base)

        outputs = self.engine.generate(prompt, request_id=response_id, sampling_params=sampling,
                                       output_modalities=modalities)
        try:
            await self.send(ServerEvent.RESPONSE_CREATED, response=response("in_progress", []))
            await self.send(ServerEvent.RESPONSE_OUTPUT_ITEM_ADDED, response_id=response_id, output_index=0,
                            item=item.wire(self.dialect))
            await self._add_item(item)
            await self.send(ServerEvent.RESPONSE_CONTENT_PART_ADDED, **base,
                            part=part(""))
            async for out in outputs:
                if out.modality == "text" and out.text_delta:
                    text_parts.append(out.text_delta)
                    kind = ServerEvent.RESPONSE_OUTPUT_AUDIO_TRANSCRIPT_DELTA if spoken \
                        else ServerEvent.RESPONSE_OUTPUT_TEXT_DELTA
                    await self.send(kind, delta=out.text_delta, **base)
                elif out.modality == "audio" and spoken and out.audio is not None and out.sample_rate_hz:
                    pcm = pcm or Pcm16Stream(out.sample_rate_hz)
                    data = pcm.feed(out.audio)
                    if data:
                        await audio_delta(data)
                elif out.finished:
                    final = out
            if final is not None and final.finish_reason == "abort":  # cancel_response's abort got here first
                raise asyncio.CancelledError
            if pcm is not None:
                tail = pcm.flush()
                if tail:
                    await audio_delta(tail)
            status = "completed"
        except asyncio.CancelledError:
            status, details = "cancelled", {"type": "cancelled", "reason": self._cancel_reason}
        except Exception as exc:  # noqa: BLE001 - reported as an error event and a failed response
            error = from_engine_error(exc, fields)
            details = {"type": "failed", "error": {"type": error.type, "code": error.code, "message": error.message}}
            await self.send_error(error.message, param=error.param, code=error.code, type_=error.type)
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]
        text = "".join(text_parts)
        item.words = text.strip()  # of a cancelled answer: the words sent before the cancel
        item.audio_ms = audio_samples * 1000 / PCM16_RATE_HZ
        item.status = "completed" if status == "completed" else "incomplete"
        if item in self.items:
            if spoken:
                await self.send(ServerEvent.RESPONSE_OUTPUT_AUDIO_DONE, **base)
                await self.send(ServerEvent.RESPONSE_OUTPUT_AUDIO_TRANSCRIPT_DONE, transcript=text, **base)
            else:
                await self.send(ServerEvent.RESPONSE_OUTPUT_TEXT_DONE, text=text, **base)
            await self.send(ServerEvent.RESPONSE_CONTENT_PART_DONE, **base,
                            part=part(text))
            await self.send(ServerEvent.RESPONSE_OUTPUT_ITEM_DONE, response_id=response_id, output_index=0,
                            item=item.wire(self.dialect))
            index = self.items.index(item)
            previous = self.items[index - 1].id if index else None
            await self.send(ServerEvent.CONVERSATION_ITEM_DONE, previous_item_id=previous, item=item.wire(self.dialect))
        if final is not None:
            self.metrics.observe(ENDPOINT, final.metrics)
        metrics = final.metrics if final is not None else None
        out_tokens = metrics.num_output_tokens if metrics is not None else 0
        in_tokens = metrics.num_prompt_tokens if metrics is not None else 0
        usage = {"total_tokens": in_tokens + out_tokens, "input_tokens": in_tokens, "output_tokens": out_tokens}
        self.touch()  # the idle count starts when the answer ends
        await self.send(ServerEvent.RESPONSE_DONE, response=response(
            status, [item.wire(self.dialect)] if item in self.items else [], usage, details))

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
        ClientEvent.CONVERSATION_ITEM_TRUNCATE: on_item_truncate,
        ClientEvent.CONVERSATION_ITEM_DELETE: on_item_delete,
        ClientEvent.CONVERSATION_ITEM_RETRIEVE: on_item_retrieve,
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
    dialect, subprotocol = negotiate_dialect(websocket.headers)
    await websocket.accept(subprotocol=subprotocol)
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
        session = RealtimeSession(websocket, engine, pipeline, pool, metrics, handle, dialect)
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
