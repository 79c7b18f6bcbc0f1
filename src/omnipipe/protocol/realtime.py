"""The events of ``WS /v1/realtime`` (a subset of the OpenAI Realtime API, plus pause/resume).

The worker's session (``omnipipe.server.routes.realtime``) dispatches on ``ClientEvent`` and sends
``ServerEvent``; the gateway's recording tap (``omnipipe.gateway.recording.taps.RealtimeTap``) reads the same
frames both ways. Both take the names from here. Audio in these events is ``pcm16`` (``protocol.audio``).

The client events' schema is the pydantic models below (``CLIENT_EVENT``, by ``type``): the worker validates
every frame with it, and the tests generate events from it. It holds the shapes and the ranges that need no
pipeline; what depends on the pipeline (its modalities and voices, base64 audio, the sampling limits the stages
use, which items and formats are supported) the worker checks after it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class ClientEvent:
    """``type`` of the events a client sends."""

    SESSION_UPDATE = "session.update"
    SESSION_PAUSE = "session.pause"  # extension
    SESSION_RESUME = "session.resume"  # extension
    INPUT_AUDIO_BUFFER_APPEND = "input_audio_buffer.append"
    INPUT_AUDIO_BUFFER_COMMIT = "input_audio_buffer.commit"
    INPUT_AUDIO_BUFFER_CLEAR = "input_audio_buffer.clear"
    CONVERSATION_ITEM_CREATE = "conversation.item.create"
    RESPONSE_CREATE = "response.create"
    RESPONSE_CANCEL = "response.cancel"


class ServerEvent:
    """``type`` of the events a worker sends."""

    ERROR = "error"
    SESSION_CREATED = "session.created"
    SESSION_UPDATED = "session.updated"
    SESSION_PAUSED = "session.paused"  # extension
    SESSION_RESUMED = "session.resumed"  # extension
    SESSION_IDLE_WARNING = "session.idle_warning"  # extension: {closes_in_s}
    INPUT_AUDIO_BUFFER_COMMITTED = "input_audio_buffer.committed"
    INPUT_AUDIO_BUFFER_CLEARED = "input_audio_buffer.cleared"
    INPUT_AUDIO_BUFFER_SPEECH_STARTED = "input_audio_buffer.speech_started"
    INPUT_AUDIO_BUFFER_SPEECH_STOPPED = "input_audio_buffer.speech_stopped"
    CONVERSATION_ITEM_CREATED = "conversation.item.created"
    INPUT_AUDIO_TRANSCRIPTION_COMPLETED = "conversation.item.input_audio_transcription.completed"
    INPUT_AUDIO_TRANSCRIPTION_FAILED = "conversation.item.input_audio_transcription.failed"
    RESPONSE_CREATED = "response.created"
    RESPONSE_TEXT_DELTA = "response.text.delta"
    RESPONSE_TEXT_DONE = "response.text.done"
    RESPONSE_AUDIO_TRANSCRIPT_DELTA = "response.audio_transcript.delta"
    RESPONSE_AUDIO_TRANSCRIPT_DONE = "response.audio_transcript.done"
    RESPONSE_AUDIO_DELTA = "response.audio.delta"
    RESPONSE_AUDIO_DONE = "response.audio.done"
    RESPONSE_DONE = "response.done"


COMMIT_EMPTY = "input_audio_buffer_commit_empty"
"""``error`` code of a commit of an empty input buffer: that commit gets no ``input_audio_buffer.committed``."""
PAUSE_TIMEOUT = "pause_timeout"
"""``error`` code (and close reason) of a session paused past the worker's pause timeout."""
IDLE_TIMEOUT = "idle_timeout"
"""``error`` code (and close reason) of a session in which nothing happened for the server's idle timeout."""
IDLE_WARNING_S = 15.0
"""How long before an idle session is closed the client is warned (``session.idle_warning``)."""


# ---------------------------------------------------------------------------------------------- client events
_FIELDS = ConfigDict(strict=True, extra="ignore")  # unknown fields are ignored, as in the OpenAI API


class TurnDetection(BaseModel):
    """``session.turn_detection``: the energy VAD. A field left out keeps the session's current value."""

    model_config = _FIELDS
    type: Literal["server_vad"] = "server_vad"
    threshold: float = Field(0.02, gt=0, le=1, allow_inf_nan=False, examples=[0.02, 0.5],
                             description="RMS of a 20 ms frame (full scale 1) above which it is speech")
    silence_duration_ms: int = Field(500, ge=0, le=60_000)
    prefix_padding_ms: int = Field(300, ge=0, le=60_000)
    create_response: bool = True


class InputAudioTranscription(BaseModel):
    model_config = _FIELDS
    model: str = Field("whisper-1", min_length=1, examples=["whisper-1"])


class SessionConfig(BaseModel):
    """``session.update``'s ``session``: only the fields given change (``model_fields_set``); the defaults here
    only describe a new session."""

    model_config = _FIELDS
    modalities: list[str] = Field(["text", "audio"], min_length=1, examples=[["text"], ["text", "audio"]])
    voice: str = Field("default", examples=["default"])
    instructions: str = ""
    input_audio_format: str = Field("pcm16", examples=["pcm16"])
    output_audio_format: str = Field("pcm16", examples=["pcm16"])
    turn_detection: TurnDetection | None = TurnDetection()
    max_response_output_tokens: Annotated[int, Field(ge=1)] | Literal["inf"] = Field("inf", examples=[16, "inf"])
    temperature: float | None = Field(None, examples=[0.0, 0.8])
    input_audio_transcription: InputAudioTranscription | None = None


class ContentPart(BaseModel):
    model_config = _FIELDS
    type: str = Field(examples=["input_text"])
    text: str = Field(examples=["hello"])


class Item(BaseModel):
    model_config = _FIELDS
    id: str | None = None
    type: str = Field("message", examples=["message"])
    role: str = Field(examples=["user"])
    content: list[ContentPart]


class ResponseOptions(BaseModel):
    model_config = _FIELDS
    modalities: list[str] | None = Field(None, min_length=1, examples=[["text"], ["audio"]])


class _Event(BaseModel):
    model_config = _FIELDS
    event_id: str | None = None


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: SessionConfig


class SessionPause(_Event):
    type: Literal["session.pause"]


class SessionResume(_Event):
    type: Literal["session.resume"]


class InputAudioBufferAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str = Field(examples=["AAAAAA=="], description="base64 of pcm16 (24 kHz mono int16 little-endian)")


class InputAudioBufferCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ConversationItemCreate(_Event):
    type: Literal["conversation.item.create"]
    item: Item


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: ResponseOptions | None = None


class ResponseCancel(_Event):
    type: Literal["response.cancel"]


ClientEventModel = Annotated[
    SessionUpdate | SessionPause | SessionResume | InputAudioBufferAppend | InputAudioBufferCommit
    | InputAudioBufferClear | ConversationItemCreate | ResponseCreate | ResponseCancel,
    Field(discriminator="type"),
]
CLIENT_EVENT: TypeAdapter[Any] = TypeAdapter(ClientEventModel)
"""Validates one decoded client event (``CLIENT_EVENT.validate_python(obj)``) into its model."""
CLIENT_EVENT_MODELS: dict[str, type[_Event]] = {
    model.model_fields["type"].annotation.__args__[0]: model  # type: ignore[union-attr]
    for model in (SessionUpdate, SessionPause, SessionResume, InputAudioBufferAppend, InputAudioBufferCommit,
                  InputAudioBufferClear, ConversationItemCreate, ResponseCreate, ResponseCancel)
}
"""The model of each client event type."""
