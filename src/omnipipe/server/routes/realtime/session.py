"""One realtime WebSocket's session: its settings (``session.update``, checked against the pipeline), the parts it
is split into and wires together, the loop that reads client events and hands each to the part of the session that
handles it (and tells the turn controller of those that change what a tentative answer was planned from), and the
one way events are sent (renamed for the beta dialect). A duplex family's session (``duplex.py``) and a live
transcriber's transcription session (``transcription_session.py``) take over the events they handle and refuse the
rest by name."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic_core
from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from omnipipe.api.async_omni import AsyncOmni
from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.protocol.realtime import BETA, BETA_NAMES, GA, TRANSCRIPTION_CLIENT_EVENT, ClientEvent, ServerEvent
from omnipipe.protocol.worker import CLOSE_NORMAL
from omnipipe.server.capacity import Session
from omnipipe.server.end_of_turn import model_ready as end_of_turn_model_ready
from omnipipe.server.engines import EnginePool
from omnipipe.server.errors import APIError
from omnipipe.server.prometheus import ServerMetrics
from omnipipe.server.realtime_settings import Change, Settings, changes, session_object
from omnipipe.server.routes.realtime.checks import check_modalities, check_sampling
from omnipipe.server.routes.realtime.conversation import Conversation
from omnipipe.server.routes.realtime.duplex import DuplexTalk
from omnipipe.server.routes.realtime.events import EventError, new_event_id, parse_event
from omnipipe.server.routes.realtime.frames import CameraFrames
from omnipipe.server.routes.realtime.idle import IdleWatch
from omnipipe.server.routes.realtime.pause import SessionPause
from omnipipe.server.routes.realtime.response import Responses
from omnipipe.server.routes.realtime.transcription import Transcriptions
from omnipipe.server.routes.realtime.transcription_session import TranscriptionSession
from omnipipe.server.routes.realtime.turn import InputsChanged, ResponseStarted, TurnController, TurnEvent
from omnipipe.server.routes.transcription import language_code
from omnipipe.server.tool_calls import function_tools, tool_choice

logger = logging.getLogger(__name__)

# client events after which the turn controller is told (a tentative answer planned before them no longer holds)
TURN_EVENTS: dict[str, TurnEvent] = {
    ClientEvent.SESSION_UPDATE: InputsChanged(),
    ClientEvent.CONVERSATION_ITEM_CREATE: InputsChanged(),
    ClientEvent.CONVERSATION_ITEM_TRUNCATE: InputsChanged(),
    ClientEvent.CONVERSATION_ITEM_DELETE: InputsChanged(),
    ClientEvent.RESPONSE_CREATE: ResponseStarted(),
}


class RealtimeSession:
    """A realtime connection's state, split by concept: the pause, the idle watch, the camera frames, the
    transcriptions of spoken items, the conversation, the response and the turn (its controller, which holds the
    input audio buffer and what listens to it). No part holds the session: each is given the values fixed for the
    session's life it uses (the pipeline, the engine, the engine pool, the metrics, the session id, the dialect),
    the settings (one object, changed in place by ``session.update``), the parts made before it, and callables for
    the rest (sending events, closing the session, what a part made after it says); none imports this module."""

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
        self.settings = settings = Settings(modalities=modalities)  # changed in place by session.update
        if pipeline.serving.duplex or pipeline.serving.live_transcriber:  # the model speaks when it will; the
            settings.turn_detection = None  # client commits a transcription session's turns
        self.pause = SessionPause(pool.config.pause_timeout_s, handle, stop_input=self._stop_input, send=self.send,
                                  send_error=self.send_error, close=self.close)
        self.idle = IdleWatch(pool.config.idle_timeout_s, busy=lambda: self.pause.paused or self.responses.running,
                              closed=lambda: self.closed, send=self.send, send_error=self.send_error, close=self.close)
        self.frames = CameraFrames(pipeline, engine, self.pause)
        self.transcriptions = Transcriptions(settings, pipeline, pool, metrics, self.send)
        self.conversation = Conversation(settings, pipeline, dialect, idle=self.idle, frames=self.frames,
                                         transcribe=self.transcriptions.start,
                                         answering=lambda item: self.responses.holds(item),
                                         drop_stream=lambda stream: engine.drop_audio_stream(stream), send=self.send)
        self.responses = Responses(settings, pipeline, engine, pool, metrics, self.session_id, dialect,
                                   pause=self.pause, conversation=self.conversation, idle=self.idle,
                                   answered=lambda ends_at: self.turn.answer_ended(ends_at), send=self.send,
                                   send_error=self.send_error)
        self.turn = TurnController(settings, pipeline, engine, pool, metrics, self.session_id, idle=self.idle,
                                   pause=self.pause, frames=self.frames, conversation=self.conversation,
                                   responses=self.responses, send=self.send, send_error=self.send_error)
        self.handlers: dict[str, Callable[[Any], Awaitable[None]]] = {
            ClientEvent.SESSION_UPDATE: self.on_session_update,
            ClientEvent.SESSION_PAUSE: self.pause.on_pause,
            ClientEvent.SESSION_RESUME: self.pause.on_resume,
            ClientEvent.INPUT_AUDIO_BUFFER_APPEND: self.turn.append,
            ClientEvent.INPUT_AUDIO_BUFFER_COMMIT: self.turn.commit,
            ClientEvent.INPUT_AUDIO_BUFFER_CLEAR: self.turn.clear,
            ClientEvent.INPUT_VIDEO_FRAME_APPEND: self.frames.append,
            ClientEvent.CONVERSATION_ITEM_CREATE: self.conversation.create,
            ClientEvent.CONVERSATION_ITEM_TRUNCATE: self.conversation.truncate,
            ClientEvent.CONVERSATION_ITEM_DELETE: self.conversation.delete,
            ClientEvent.CONVERSATION_ITEM_RETRIEVE: self.conversation.retrieve,
            ClientEvent.RESPONSE_CREATE: self.responses.create,
            ClientEvent.RESPONSE_CANCEL: self.responses.cancel_by_client,
        }
        # a duplex family's session: one response from its first audio to its end, no turns (duplex.py)
        self.duplex = DuplexTalk(settings, pipeline, engine, self.session_id, responses=self.responses) \
            if pipeline.serving.duplex else None
        if self.duplex is not None:
            for kind in self.handlers:
                if kind not in (ClientEvent.SESSION_UPDATE, ClientEvent.CONVERSATION_ITEM_RETRIEVE):
                    self.handlers[kind] = self._refused_in_duplex
            self.handlers[ClientEvent.INPUT_AUDIO_BUFFER_APPEND] = self.duplex.append
        # a live transcriber's session: a transcription session, each committed turn one live request
        # (transcription_session.py)
        self.transcribing = TranscriptionSession(pipeline, engine, self.session_id, pool.model_name, idle=self.idle,
                                                 send=self.send) if pipeline.serving.live_transcriber else None
        if self.transcribing is not None:
            for kind in self.handlers:
                self.handlers[kind] = self._refused_in_transcription
            self.handlers.update({ClientEvent.SESSION_UPDATE: self.transcribing.on_update,
                                  ClientEvent.INPUT_AUDIO_BUFFER_APPEND: self.transcribing.append,
                                  ClientEvent.INPUT_AUDIO_BUFFER_COMMIT: self.transcribing.commit,
                                  ClientEvent.INPUT_AUDIO_BUFFER_CLEAR: self.transcribing.clear})

    # ------------------------------------------------------------------ sending
    async def send(self, type_: str, **fields: Any) -> None:
        if self.closed:
            return
        if self.dialect == BETA and type_ in BETA_NAMES:
            renamed = BETA_NAMES[type_]
            if renamed is None:
                return
            type_ = renamed
        payload = json.dumps({"type": type_, "event_id": new_event_id(), **fields}, separators=(",", ":"))
        async with self.send_lock:
            try:
                await self.ws.send_text(payload)
            except Exception:  # noqa: BLE001 - the client went away; the receive loop notices
                self.closed = True

    async def send_error(self, message: str, *, param: str | None = None, code: str | None = None,
                         type_: str = "invalid_request_error", client_event_id: str | None = None) -> None:
        await self.send(ServerEvent.ERROR, error={"type": type_, "code": code, "message": message, "param": param,
                                                  "event_id": client_event_id})

    async def close(self, reason: str) -> None:
        """Close the session from the server's side (a timeout; its ``error`` event already sent): nothing more is
        sent, and the connection closes with 1000 and ``reason``."""
        self.closed = True
        with contextlib.suppress(Exception):  # already gone
            await self.ws.close(code=CLOSE_NORMAL, reason=reason)

    async def _stop_input(self) -> None:
        """What ``session.pause`` stops: the turn's answer is cancelled and its uncommitted audio dropped, and the
        camera frames are dropped."""
        await self.turn.session_paused()
        self.frames.clear()

    def session_object(self) -> dict[str, Any]:
        if self.transcribing is not None:
            return self.transcribing.session_object()
        return session_object(self.settings, self.dialect, self.session_id, self.pool.model_name)

    # ------------------------------------------------------------------ loop
    async def run(self) -> None:
        await self.send(ServerEvent.SESSION_CREATED, session=self.session_object())
        self.idle.start()
        if self.duplex is None and self.transcribing is None:
            self.turn.live.warm_up()
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
            await self.idle.stop()
            await self.pause.stop_timer()
            if self.duplex is not None:
                await self.duplex.close()
            if self.transcribing is not None:
                await self.transcribing.close()
            await self.turn.close()
            await self.transcriptions.cancel()
            await self.engine.end_session(self.session_id)  # the stages drop what they kept of the conversation

    async def handle_text(self, text: str) -> None:
        try:  # pydantic's parser: a nesting too deep for json's recursion is an error, not a RecursionError
            raw = pydantic_core.from_json(text)
        except ValueError as exc:
            await self.send_error(f"the event is not valid JSON: {exc}", code="invalid_json")
            return
        client_event_id = raw.get("event_id") if isinstance(raw, dict) and isinstance(raw.get("event_id"), str) \
            else None
        try:
            event = parse_event(raw, self.dialect, self.handlers,
                                TRANSCRIPTION_CLIENT_EVENT if self.transcribing is not None else None)
            await self.handlers[event.type](event)
            if event.type in TURN_EVENTS and self.duplex is None and self.transcribing is None:
                await self.turn.handle(TURN_EVENTS[event.type])
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

    # ------------------------------------------------------------------ session.update
    def _check_change(self, change: Change) -> Any:
        """The value a session change sets, checked against the pipeline (an EventError naming its field)."""
        key, value, param = change.key, change.value, change.param
        if self.duplex is not None:
            self.duplex.check_change(key, value, param)
        if key == "modalities":
            return check_modalities(self.pipeline, value, param)
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
                check_sampling({"max_tokens": value}, param)
            return value
        if key == "temperature":
            if value is not None:
                check_sampling({"temperature": value}, param)
            return value
        if key in ("tools", "turn_detection", "transcription"):
            return self._check_feature(key, value, param)
        return value

    def _check_feature(self, key: str, value: Any, param: str) -> Any:
        """A change this server may lack the means for: tools, semantic_vad, transcription."""
        if key == "tools":
            if value and not self.pipeline.takes_tools:
                raise EventError(f"{param}: pipeline {self.pipeline.name!r} calls no tools (its model has no "
                                 "tool-call format)", param, code="unsupported_parameter")
            return function_tools([(t["name"], t.get("description"), t.get("parameters")) for t in value],
                                  param + "[{}]")
        if key == "turn_detection":
            if value is not None and value.get("type") == "semantic_vad" and not end_of_turn_model_ready():
                raise EventError(f"{param}.type: semantic_vad needs the end-of-turn model, which is not in this "
                                 "server's cache (run `omnipipe download`)", f"{param}.type",
                                 code="unsupported_feature")
            return value
        transcriber = self.pool.endpoint_pipelines.get("transcription")
        if value is not None and transcriber is None:
            raise EventError(f"{param}: pipeline {self.pipeline.name!r} has no transcription pipeline", param,
                             code="unsupported_feature")
        if value is not None and value.get("language") is not None:
            try:  # one the transcription pipeline takes, as its code
                value = {**value, "language": language_code(value["language"], self.pool.slots[transcriber].pipeline)}
            except APIError as exc:
                raise EventError(f"{param}.{exc.message}", f"{param}.language") from None
        return value

    async def _refused_in_duplex(self, event: Any) -> None:
        assert self.duplex is not None
        self.duplex.refuse(event.type)

    async def _refused_in_transcription(self, event: Any) -> None:
        assert self.transcribing is not None
        self.transcribing.refuse(event.type)

    async def on_session_update(self, event: Any) -> None:
        update = event.session
        if update.model is not None:
            self.pool.check_model(update.model, "chat")
        new = {change.key: self._check_change(change) for change in changes(update, self.settings)}
        if "tools" in new or "tool_choice" in new:  # the choice against the tools the session will have
            choice = new.get("tool_choice", self.settings.tool_choice)
            named = choice.get("name") if isinstance(choice, dict) else None
            tool_choice(None if named else choice, new.get("tools", self.settings.tools), "session.tool_choice",
                        named=named)
        detection_changed = "turn_detection" in new and new["turn_detection"] != self.settings.turn_detection
        for key, value in new.items():
            setattr(self.settings, key, value)
        if detection_changed:
            await self.turn.detection_changed()
        await self.send(ServerEvent.SESSION_UPDATED, session=self.session_object())
