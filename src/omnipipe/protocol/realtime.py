"""The events of ``WS /v1/realtime``: OpenAI's Realtime API in its GA form, and its beta form for clients that
ask for it, plus pause/resume and live camera frames (``input_video_frame.append``).

A connection speaks the beta dialect when its handshake carries the ``OpenAI-Beta: realtime=v1`` header (what
``client.beta.realtime.connect`` sends) or offers the ``openai-beta.realtime-v1`` WebSocket subprotocol (the way
a browser can ask); otherwise GA. The two differ in the session's shape (GA: ``type``, ``output_modalities``,
``audio.input`` / ``audio.output``; beta: flat ``modalities``, ``voice``, ``turn_detection``, ...), in a few server
event names (``ServerEvent`` holds the GA names; ``BETA_NAMES`` the beta name of each one that differs;
``conversation.item.done`` is GA only) and in content part types (GA ``output_audio`` / ``output_text``, beta
``audio`` / ``text``).

The worker's session (``omnipipe.server.routes.realtime``) validates every client frame with the dialect's schema
(``CLIENT_EVENT`` for GA, ``BETA_CLIENT_EVENT``: pydantic models by ``type``; unknown fields are refused by name,
as OpenAI does) and sends ``ServerEvent``s renamed for the dialect. The gateway's recording tap
(``omnipipe.gateway.recording.taps.RealtimeTap``) reads both dialects (``ga_name``). Audio is ``pcm16``
(``protocol.audio``). The schema holds shapes and ranges that need no pipeline; what depends on the pipeline (its
modalities and voices, base64 audio, the sampling limits the stages use, which items are supported) the worker
checks after it.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

GA = "ga"
BETA = "beta"
BETA_HEADER = "openai-beta"
BETA_HEADER_VALUE = "realtime=v1"
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"


def negotiate_dialect(headers: Any) -> tuple[str, str | None]:
    """A handshake's dialect and the subprotocol to accept, from its headers (a mapping with lower-case keys):
    beta for the ``OpenAI-Beta: realtime=v1`` header or the ``openai-beta.realtime-v1`` subprotocol, else GA
    (accepting ``realtime`` where offered: a browser fails a handshake that selects none of the subprotocols it
    offered)."""
    offered = [p.strip() for p in (headers.get("sec-websocket-protocol") or "").split(",") if p.strip()]
    if BETA_SUBPROTOCOL in offered:
        return BETA, BETA_SUBPROTOCOL
    beta = BETA_HEADER_VALUE in (headers.get(BETA_HEADER) or "").replace(" ", "").split(",")
    return (BETA if beta else GA), ("realtime" if "realtime" in offered else None)


class ClientEvent:
    """``type`` of the events a client sends (the same names in both dialects)."""

    SESSION_UPDATE = "session.update"
    SESSION_PAUSE = "session.pause"  # extension
    SESSION_RESUME = "session.resume"  # extension
    INPUT_AUDIO_BUFFER_APPEND = "input_audio_buffer.append"
    INPUT_AUDIO_BUFFER_COMMIT = "input_audio_buffer.commit"
    INPUT_AUDIO_BUFFER_CLEAR = "input_audio_buffer.clear"
    INPUT_VIDEO_FRAME_APPEND = "input_video_frame.append"  # extension: a camera frame
    CONVERSATION_ITEM_CREATE = "conversation.item.create"
    CONVERSATION_ITEM_TRUNCATE = "conversation.item.truncate"
    CONVERSATION_ITEM_DELETE = "conversation.item.delete"
    CONVERSATION_ITEM_RETRIEVE = "conversation.item.retrieve"
    RESPONSE_CREATE = "response.create"
    RESPONSE_CANCEL = "response.cancel"


class ServerEvent:
    """``type`` of the events a worker sends, by their GA names (``BETA_NAMES`` renames them for beta)."""

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
    INPUT_AUDIO_BUFFER_TIMEOUT_TRIGGERED = "input_audio_buffer.timeout_triggered"
    CONVERSATION_ITEM_ADDED = "conversation.item.added"
    CONVERSATION_ITEM_DONE = "conversation.item.done"  # GA only
    CONVERSATION_ITEM_TRUNCATED = "conversation.item.truncated"
    CONVERSATION_ITEM_DELETED = "conversation.item.deleted"
    CONVERSATION_ITEM_RETRIEVED = "conversation.item.retrieved"
    INPUT_AUDIO_TRANSCRIPTION_DELTA = "conversation.item.input_audio_transcription.delta"
    INPUT_AUDIO_TRANSCRIPTION_COMPLETED = "conversation.item.input_audio_transcription.completed"
    INPUT_AUDIO_TRANSCRIPTION_FAILED = "conversation.item.input_audio_transcription.failed"
    RESPONSE_CREATED = "response.created"
    RESPONSE_OUTPUT_ITEM_ADDED = "response.output_item.added"
    RESPONSE_OUTPUT_ITEM_DONE = "response.output_item.done"
    RESPONSE_CONTENT_PART_ADDED = "response.content_part.added"
    RESPONSE_CONTENT_PART_DONE = "response.content_part.done"
    RESPONSE_OUTPUT_TEXT_DELTA = "response.output_text.delta"
    RESPONSE_OUTPUT_TEXT_DONE = "response.output_text.done"
    RESPONSE_OUTPUT_AUDIO_TRANSCRIPT_DELTA = "response.output_audio_transcript.delta"
    RESPONSE_OUTPUT_AUDIO_TRANSCRIPT_DONE = "response.output_audio_transcript.done"
    RESPONSE_OUTPUT_AUDIO_DELTA = "response.output_audio.delta"
    RESPONSE_OUTPUT_AUDIO_DONE = "response.output_audio.done"
    RESPONSE_FUNCTION_CALL_ARGUMENTS_DELTA = "response.function_call_arguments.delta"
    RESPONSE_FUNCTION_CALL_ARGUMENTS_DONE = "response.function_call_arguments.done"
    RESPONSE_DONE = "response.done"


BETA_NAMES: dict[str, str | None] = {
    ServerEvent.CONVERSATION_ITEM_ADDED: "conversation.item.created",
    ServerEvent.CONVERSATION_ITEM_DONE: None,  # not in beta
    ServerEvent.RESPONSE_OUTPUT_TEXT_DELTA: "response.text.delta",
    ServerEvent.RESPONSE_OUTPUT_TEXT_DONE: "response.text.done",
    ServerEvent.RESPONSE_OUTPUT_AUDIO_TRANSCRIPT_DELTA: "response.audio_transcript.delta",
    ServerEvent.RESPONSE_OUTPUT_AUDIO_TRANSCRIPT_DONE: "response.audio_transcript.done",
    ServerEvent.RESPONSE_OUTPUT_AUDIO_DELTA: "response.audio.delta",
    ServerEvent.RESPONSE_OUTPUT_AUDIO_DONE: "response.audio.done",
}
"""The beta name of each server event whose name differs (``None``: beta has no such event)."""
_GA_NAMES = {beta: ga for ga, beta in BETA_NAMES.items() if beta is not None}


def ga_name(type_: str) -> str:
    """A server event's GA name, whichever dialect it was sent in."""
    return _GA_NAMES.get(type_, type_)


COMMIT_EMPTY = "input_audio_buffer_commit_empty"
"""``error`` code of a commit of an empty input buffer: that commit gets no ``input_audio_buffer.committed``."""
MAX_FRAME_BYTES = 512 * 1024
"""``input_video_frame.append``: the most bytes of one encoded frame (the worker refuses more; the recorder keeps
what the worker takes)."""
MIN_FRAME_INTERVAL_MS = 250.0
"""``input_video_frame.append``: frames at most 4 a second, by capture time."""

PAUSE_TIMEOUT = "pause_timeout"
"""``error`` code (and close reason) of a session paused past the worker's pause timeout."""
IDLE_TIMEOUT = "idle_timeout"
"""``error`` code (and close reason) of a session in which nothing happened for the server's idle timeout."""
IDLE_WARNING_S = 15.0
"""How long before an idle session is closed the client is warned (``session.idle_warning``)."""
PCM_RATE: Final = 24_000
MAX_OUTPUT_TOKENS = 4096
MAX_TOOLS = 128
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for function names
SEMANTIC_TURN_END_MS: dict[str, tuple[int, int]] = {"low": (600, 3000), "medium": (300, 1500), "auto": (300, 1500),
                                                    "high": (200, 800)}
"""``semantic_vad``, per ``eagerness``: the silence after which a turn ends when the end-of-turn model hears it
complete, and when it hears it unfinished (the speaker may be pausing mid-sentence)."""
IDLE_TIMEOUT_MS_RANGE = (1000, 600_000)  # server_vad's idle_timeout_ms, inclusive


# ---------------------------------------------------------------------------------------------- client events
_FIELDS = ConfigDict(strict=True, extra="forbid")  # an unknown field is refused by name, as OpenAI does
_Tokens = Annotated[int, Field(ge=1, le=MAX_OUTPUT_TOKENS)] | Literal["inf"]


class ServerVad(BaseModel):
    """The server VAD (Silero). A field left out keeps the session's current value. ``semantic_vad`` (what the
    Agents SDK asks for by default) adds an end-of-turn model to the same VAD: its ``eagerness`` chooses how long
    a silence ends a turn the model hears complete, and one it hears unfinished (``SEMANTIC_TURN_END_MS``)."""

    model_config = _FIELDS
    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    eagerness: Literal["low", "medium", "high", "auto"] = Field(
        "auto", description="semantic_vad: how soon a silence ends the turn, heard complete / unfinished (low "
        "600 / 3000 ms, auto and medium 300 / 1500 ms, high 200 / 800 ms)")
    threshold: float = Field(0.5, gt=0, le=1, allow_inf_nan=False, examples=[0.5, 0.9],
                             description="speech probability (0..1) from which a 32 ms window is speech")
    silence_duration_ms: int = Field(500, ge=0, le=60_000)
    prefix_padding_ms: int = Field(300, ge=0, le=60_000)
    create_response: bool = True
    interrupt_response: bool = Field(True, description="speech during a response cancels it (barge-in)")
    idle_timeout_ms: int | None = Field(
        None, ge=IDLE_TIMEOUT_MS_RANGE[0], le=IDLE_TIMEOUT_MS_RANGE[1],
        description="server_vad only: once an answer's audio has played, this long without speech commits the "
        "silence as the user's turn and answers it (input_audio_buffer.timeout_triggered); null: never")
    speculative_start: bool = Field(True, description="omnipipe: start the answer tentatively when the speech "
                                    "pauses, release it when the silence window closes, drop it without a trace "
                                    "when the user goes on")

    @model_validator(mode="after")
    def _idle_timeout_is_server_vads(self) -> ServerVad:
        if self.type == "semantic_vad" and self.idle_timeout_ms is not None:
            raise ValueError("idle_timeout_ms: only server_vad has an idle timeout (semantic_vad decides the end "
                             "of a turn from the words)")
        return self


class NoiseReduction(BaseModel):
    model_config = _FIELDS
    type: Literal["near_field", "far_field"] = Field(description="accepted; no effect (the input is not filtered)")


class InputAudioTranscription(BaseModel):
    model_config = _FIELDS
    model: str = Field("whisper-1", min_length=1, examples=["whisper-1"])
    language: str | None = Field(None, min_length=2, max_length=32, description=(
        "one of the transcription pipeline's languages, an ISO 639-1 code or its English name (the default family's: "
        "en)"))
    prompt: Literal[""] | None = Field(None, description="not supported: only empty")


class VoiceId(BaseModel):
    model_config = _FIELDS
    id: str = Field(examples=["default"])


class PcmFormat(BaseModel):
    model_config = _FIELDS
    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[24000] = PCM_RATE


class AudioInput(BaseModel):
    model_config = _FIELDS
    format: PcmFormat = PcmFormat()
    transcription: InputAudioTranscription | None = None
    noise_reduction: NoiseReduction | None = Field(None, description="accepted; no effect here")
    turn_detection: ServerVad | None = ServerVad()
    live_transcription: bool = Field(True, description="omnipipe: the session transcribes a spoken turn as it "
                                     "ends (a pass in a window fitted to the speech) and answers from its transcript "
                                     "(where the pipeline can); false: the committed audio goes to the pipeline whole")


class AudioOutput(BaseModel):
    model_config = _FIELDS
    format: PcmFormat = PcmFormat()
    voice: str | VoiceId = Field("default", examples=["default"])
    speed: float = Field(1.0, ge=0.25, le=1.5, allow_inf_nan=False)


class AudioConfig(BaseModel):
    model_config = _FIELDS
    input: AudioInput = AudioInput()
    output: AudioOutput = AudioOutput()


class FunctionTool(BaseModel):
    """A function the model may call (``session.tools[i]``)."""

    model_config = _FIELDS
    type: Literal["function"] = "function"
    name: str = Field(pattern=TOOL_NAME_PATTERN, examples=["get_weather"])
    description: str | None = Field(None, examples=["The weather in a city"])
    parameters: dict[str, Any] | None = Field(None, description="a JSON schema of an object",
                                              examples=[{"type": "object", "properties": {"city": {"type": "string"}},
                                                         "required": ["city"]}])


class NamedFunction(BaseModel):
    """``tool_choice``: call this function."""

    model_config = _FIELDS
    type: Literal["function"]
    name: str = Field(examples=["get_weather"])


_ToolChoice = Literal["auto", "none", "required"] | NamedFunction


class TracingConfig(BaseModel):
    model_config = _FIELDS
    workflow_name: str | None = None
    group_id: str | None = None
    metadata: dict[str, Any] | None = None


_Tracing = Literal["auto"] | TracingConfig | None


class TokenLimits(BaseModel):
    model_config = _FIELDS
    post_instructions: int | None = Field(None, ge=0)


class RetentionRatio(BaseModel):
    model_config = _FIELDS
    type: Literal["retention_ratio"]
    retention_ratio: float = Field(ge=0, le=1, allow_inf_nan=False)
    token_limits: TokenLimits | None = None


class SessionConfig(BaseModel):
    """GA ``session.update``'s ``session``: only the fields given change (``model_fields_set``, at every level);
    the defaults here only describe a new session."""

    model_config = _FIELDS
    type: Literal["realtime"]
    model: str | None = Field(None, examples=["default"])
    output_modalities: list[Literal["text", "audio"]] = Field(["audio"], min_length=1, max_length=1,
                                                             examples=[["audio"], ["text"]])
    instructions: str = ""
    audio: AudioConfig = AudioConfig()
    max_output_tokens: _Tokens = Field("inf", examples=[16, "inf"])
    tools: list[FunctionTool] = Field([], max_length=MAX_TOOLS)
    tool_choice: _ToolChoice = "auto"
    parallel_tool_calls: bool = True
    truncation: Literal["auto", "disabled"] | RetentionRatio = Field("auto", description="accepted; no effect here")
    tracing: _Tracing = Field(None, description="accepted; no effect (omnipipe keeps no traces)")
    include: list[Literal["item.input_audio_transcription.logprobs"]] | None = Field(
        None, description="accepted; no effect (transcription events carry no logprobs)")
    prompt: None = Field(None, description="not supported: only null (omnipipe keeps no stored prompts)")


class TranscriptionAudioInput(BaseModel):
    """A transcription session's ``audio.input`` (GA ``session.type`` ``transcription``)."""

    model_config = _FIELDS
    format: PcmFormat = PcmFormat()
    transcription: InputAudioTranscription | None = Field(
        None, description="model: echoed (the server's pipeline transcribes); language: checked against the "
        "pipeline's (the model hears it); null is refused (a transcription session always transcribes)")
    noise_reduction: NoiseReduction | None = Field(None, description="accepted; no effect here")
    turn_detection: ServerVad | None = Field(None, description="only null: the client commits each turn "
                                             "(input_audio_buffer.commit)")


class TranscriptionAudioConfig(BaseModel):
    model_config = _FIELDS
    input: TranscriptionAudioInput = TranscriptionAudioInput()


class TranscriptionSessionConfig(BaseModel):
    """GA ``session.update``'s ``session`` in a transcription session (a server whose pipeline transcribes live,
    ``ServingTraits.live_transcriber``): only the fields given change."""

    model_config = _FIELDS
    type: Literal["transcription"]
    audio: TranscriptionAudioConfig = TranscriptionAudioConfig()
    include: list[Literal["item.input_audio_transcription.logprobs"]] | None = Field(
        None, description="accepted; no effect (transcription events carry no logprobs)")


class BetaTurnDetection(ServerVad):
    pass


class BetaInputAudioTranscription(BaseModel):
    model_config = _FIELDS
    model: str = Field("whisper-1", min_length=1, examples=["whisper-1"])
    language: str | None = Field(None, min_length=2, max_length=32)
    prompt: Literal[""] | None = None


class BetaSessionConfig(BaseModel):
    """Beta ``session.update``'s ``session``: only the fields given change."""

    model_config = _FIELDS
    model: str | None = Field(None, examples=["default"])
    modalities: list[Literal["text", "audio"]] = Field(["text", "audio"], min_length=1, max_length=2,
                                                      examples=[["text"], ["text", "audio"]])
    voice: str = Field("default", examples=["default"])
    instructions: str = ""
    input_audio_format: Literal["pcm16"] = "pcm16"
    output_audio_format: Literal["pcm16"] = "pcm16"
    turn_detection: BetaTurnDetection | None = BetaTurnDetection()
    max_response_output_tokens: _Tokens = Field("inf", examples=[16, "inf"])
    temperature: float | None = Field(None, examples=[0.0, 0.8])
    input_audio_transcription: BetaInputAudioTranscription | None = None
    speed: float = Field(1.0, ge=0.25, le=1.5, allow_inf_nan=False)
    input_audio_noise_reduction: NoiseReduction | None = Field(None, description="accepted; no effect here")
    tools: list[FunctionTool] = Field([], max_length=MAX_TOOLS)
    tool_choice: _ToolChoice | str = Field("auto", description="auto, none, required, or the one function to "
                                           "call (its name, or {type: function, name})")
    tracing: _Tracing = Field(None, description="accepted; no effect")


class ContentPart(BaseModel):
    """An item's content part: ``input_text`` / ``input_audio`` / ``input_image`` (user), ``input_text``
    (system), ``output_text`` / ``output_audio`` (assistant; beta ``text`` / ``audio``)."""

    model_config = _FIELDS
    type: Literal["input_text", "input_audio", "input_image", "output_text", "output_audio", "text", "audio"] = \
        Field(examples=["input_text"])
    text: str | None = Field(None, examples=["hello"])
    audio: str | None = Field(None, description="input_audio: base64 pcm16")
    image_url: str | None = Field(None, description="input_image: a data URL, data:image/png or image/jpeg;base64",
                                  examples=["data:image/png;base64,iVBORw0KGgo..."])
    detail: Literal["auto", "low", "high"] | None = Field(None, description="input_image: accepted; every image is "
                                                          "read at the size the pipeline reads images")
    transcript: str | None = None


class Item(BaseModel):
    """A created item: a ``message`` (``role``, ``content``), a ``function_call`` the model made (``call_id``,
    ``name``, ``arguments``) or a ``function_call_output`` answering one (``call_id``, ``output``). Which fields a
    type requires the worker checks, naming them."""

    model_config = _FIELDS
    id: str | None = Field(None, max_length=64)
    object: Literal["realtime.item"] | None = None
    type: Literal["message", "function_call", "function_call_output"] = "message"
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    role: Literal["user", "assistant", "system"] | None = Field(None, examples=["user"])
    content: list[ContentPart] | None = Field(None, min_length=1)
    call_id: str | None = Field(None, min_length=1, max_length=64, examples=["call_abc123"])
    name: str | None = Field(None, examples=["get_weather"])
    arguments: str | None = Field(None, examples=['{"city": "Paris"}'])
    output: str | None = Field(None, examples=["It is 18 degrees and sunny in Paris"])


class ResponseOptions(BaseModel):
    """GA ``response.create``'s ``response``."""

    model_config = _FIELDS
    output_modalities: list[Literal["text", "audio"]] | None = Field(None, min_length=1, max_length=1,
                                                                    examples=[["text"], ["audio"]])
    max_output_tokens: _Tokens | None = None
    conversation: Literal["auto"] | None = Field(None, description="out-of-band responses are not supported")


class BetaResponseOptions(BaseModel):
    model_config = _FIELDS
    modalities: list[Literal["text", "audio"]] | None = Field(None, min_length=1, max_length=2,
                                                             examples=[["text"], ["audio"]])
    max_response_output_tokens: _Tokens | None = None
    conversation: Literal["auto"] | None = None


class _Event(BaseModel):
    model_config = _FIELDS
    event_id: str | None = None


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: SessionConfig


class TranscriptionSessionUpdate(_Event):
    type: Literal["session.update"]
    session: TranscriptionSessionConfig


class BetaSessionUpdate(_Event):
    type: Literal["session.update"]
    session: BetaSessionConfig


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


class InputVideoFrameAppend(_Event):
    """A live camera frame (an omnipipe extension): it goes with the next user item (the worker's
    ``server/routes/realtime/frames.py`` says how they are kept and sampled)."""

    type: Literal["input_video_frame.append"]
    image: str = Field(description="a PNG or JPEG data URL", examples=["data:image/jpeg;base64,/9j/4AAQ..."])
    captured_at_ms: float = Field(ge=0, allow_inf_nan=False, examples=[1234.5],
                                  description="when the frame was captured, in ms on the client's clock (any origin "
                                  "that does not go back during the session)")


class ConversationItemCreate(_Event):
    type: Literal["conversation.item.create"]
    previous_item_id: str | None = None
    item: Item


class ConversationItemTruncate(_Event):
    type: Literal["conversation.item.truncate"]
    item_id: str = Field(examples=["item_0"])
    content_index: int = Field(0, ge=0, le=0)
    audio_end_ms: int = Field(ge=0, examples=[0, 500])


class ConversationItemDelete(_Event):
    type: Literal["conversation.item.delete"]
    item_id: str = Field(examples=["item_0"])


class ConversationItemRetrieve(_Event):
    type: Literal["conversation.item.retrieve"]
    item_id: str = Field(examples=["item_0"])


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: ResponseOptions | None = None


class BetaResponseCreate(_Event):
    type: Literal["response.create"]
    response: BetaResponseOptions | None = None


class ResponseCancel(_Event):
    type: Literal["response.cancel"]
    response_id: str | None = None


_COMMON = (SessionPause, SessionResume, InputAudioBufferAppend, InputAudioBufferCommit, InputAudioBufferClear,
           InputVideoFrameAppend, ConversationItemCreate, ConversationItemTruncate, ConversationItemDelete,
           ConversationItemRetrieve, ResponseCancel)


def _adapter(models: tuple[type[_Event], ...]) -> TypeAdapter[Any]:
    union = models[0]
    for model in models[1:]:
        union = union | model  # type: ignore[assignment]
    event: Any = Annotated[union, Field(discriminator="type")]  # a union built at run time: no static type
    return TypeAdapter(event)


def _by_type(models: tuple[type[_Event], ...]) -> dict[str, type[_Event]]:
    return {model.model_fields["type"].annotation.__args__[0]: model  # type: ignore[union-attr]
            for model in models}


CLIENT_EVENT: TypeAdapter[Any] = _adapter((SessionUpdate, ResponseCreate, *_COMMON))
"""Validates one decoded GA client event (``CLIENT_EVENT.validate_python(obj)``) into its model."""
BETA_CLIENT_EVENT: TypeAdapter[Any] = _adapter((BetaSessionUpdate, BetaResponseCreate, *_COMMON))
"""The same for the beta dialect."""
TRANSCRIPTION_CLIENT_EVENT: TypeAdapter[Any] = _adapter((TranscriptionSessionUpdate, ResponseCreate, *_COMMON))
"""The same for a GA transcription session (its ``session.update`` takes ``type: transcription``)."""
CLIENT_EVENT_MODELS: dict[str, type[_Event]] = _by_type((SessionUpdate, ResponseCreate, *_COMMON))
"""The model of each GA client event type."""
