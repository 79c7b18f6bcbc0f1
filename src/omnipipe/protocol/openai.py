"""Request and response bodies of the OpenAI-compatible API (pydantic models, strict types).

Fields omnipipe reads are checked strictly, so ``"max_tokens": "10"`` is a 400 naming ``max_tokens`` rather than a
silent conversion. A chat request is closed: a field omnipipe does not implement is a 400 naming it (as OpenAI
answers an unknown argument), never accepted and dropped. The exceptions are the fields that cannot change an
answer (``user``, ``store``, ``metadata``, ...) and the off values of features omnipipe lacks (``functions: []``,
``logit_bias: {}``), which clients send by default.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(strict=True, extra="ignore")
_CLOSED = ConfigDict(strict=True, extra="forbid")

ChatAudioFormat = Literal["wav", "pcm16", "flac", "mp3", "opus", "aac"]
InputAudioFormat = Literal["wav", "mp3", "flac", "ogg"]
SpeechFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
TranscriptionFormat = Literal["json", "text", "verbose_json", "srt", "vtt"]
TimestampGranularity = Literal["segment", "word"]

# the voice names OpenAI's own models answer to; a server maps each to one of its pipeline's voices
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse",
                 "marin", "cedar")


class VoiceRef(BaseModel):
    """A voice given as an object (OpenAI's form for custom voices): ``{"id": "..."}``."""

    model_config = _STRICT
    id: str = Field(min_length=1)


Voice = str | VoiceRef


def voice_name(voice: Voice) -> str:
    """The voice a request names, in either form."""
    return voice.id if isinstance(voice, VoiceRef) else voice


# ---------------------------------------------------------------------------------------------- chat: request
class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class InputAudio(BaseModel):
    model_config = _STRICT
    data: str = Field(min_length=1, description="base64 of the encoded audio file")
    format: InputAudioFormat


class InputAudioPart(BaseModel):
    model_config = _STRICT
    type: Literal["input_audio"]
    input_audio: InputAudio


class ImageUrl(BaseModel):
    model_config = _STRICT
    url: str = Field(description="data:image/<type>;base64,<data> (nothing is fetched)")
    detail: str | None = None


class ImageUrlPart(BaseModel):
    model_config = _STRICT
    type: Literal["image_url"]
    image_url: ImageUrl


class AudioUrl(BaseModel):
    model_config = _STRICT
    url: str = Field(description="data:audio/<type>;base64,<data> (nothing is fetched)")


class AudioUrlPart(BaseModel):
    model_config = _STRICT
    type: Literal["audio_url"]
    audio_url: AudioUrl


class VideoUrl(BaseModel):
    model_config = _STRICT
    url: str = Field(description="data:video/<type>;base64,<data> (nothing is fetched)")


class VideoUrlPart(BaseModel):
    model_config = _STRICT
    type: Literal["video_url"]
    video_url: VideoUrl


ContentPart = Annotated[TextPart | InputAudioPart | ImageUrlPart | AudioUrlPart | VideoUrlPart,
                        Field(discriminator="type")]


class AssistantAudioRef(BaseModel):
    """An earlier spoken answer, by the ``audio.id`` omnipipe gave it: it stands for that answer's words."""

    model_config = _CLOSED
    id: str = Field(min_length=1)


class FunctionCall(BaseModel):
    """A call the model made: the function's name and its arguments as a JSON object's text."""

    model_config = _STRICT
    name: str = Field(min_length=1)
    arguments: str


class ToolCall(BaseModel):
    model_config = _STRICT
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = _CLOSED
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    audio: AssistantAudioRef | None = None  # assistant messages only
    tool_calls: list[ToolCall] | None = None  # assistant messages: the calls it made
    tool_call_id: str | None = None  # tool messages: the call this is the result of
    # what a client echoes back from an earlier answer: accepted when empty, refused when they carry anything
    refusal: str | None = None
    annotations: list[Any] | None = None
    function_call: Any = None


class FunctionDefinition(BaseModel):
    model_config = _STRICT
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # the arguments always follow the schema here (constrained decoding)


class ChatTool(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = _STRICT
    name: str = Field(min_length=1)


class NamedToolChoice(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    model_config = _STRICT
    name: str = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormatText(BaseModel):
    model_config = _STRICT
    type: Literal["text"]


class ResponseFormatJsonObject(BaseModel):
    model_config = _STRICT
    type: Literal["json_object"]


class ResponseFormatJsonSchema(BaseModel):
    model_config = _STRICT
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema,
                           Field(discriminator="type")]


class AudioOutputParams(BaseModel):
    model_config = _STRICT
    voice: Voice = "default"
    format: ChatAudioFormat = "wav"


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class OmnipipeExtension(BaseModel):
    """The ``omnipipe`` field: per-stage sampling parameters and the first vocoder chunk size."""

    model_config = _CLOSED
    sampling_params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    initial_codec_chunk_frames: int | None = Field(None, ge=1)


class ChatCompletionRequest(BaseModel):
    model_config = _CLOSED
    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[Literal["text", "audio", "image"]] | None = Field(None, min_length=1)
    audio: AudioOutputParams | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    n: int = Field(1, ge=1, le=1, description="only 1 choice is supported")
    top_k: int | None = Field(None, ge=0, description="vLLM's extension: sample from the k likeliest tokens")
    repetition_penalty: float | None = Field(None, gt=0, description="vLLM's extension")
    omnipipe: OmnipipeExtension | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # features omnipipe does not have: their off values are accepted (clients send them), anything else is a 400
    functions: list[Any] | None = None
    function_call: Any = None
    logit_bias: dict[str, Any] | None = None
    # accepted, not used: they cannot change the answer (bookkeeping, or options of tools omnipipe refuses)
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


# ---------------------------------------------------------------------------------------------- chat: response
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens whose KV a prefix cache kept: their prefill was spared


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0  # text tokens of the answer (its speech is not counted in tokens)
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class ResponseAudio(BaseModel):
    id: str
    data: str
    transcript: str
    expires_at: int


class ResponseImageUrl(BaseModel):
    url: str  # data:image/png;base64,...


class ResponseImage(BaseModel):
    """An image the answer drew (``modalities`` with ``image``), as OpenRouter and vLLM-Omni return them beside the
    text: ``message.images`` / ``delta.images``. A stream's previews of an image still being drawn carry the
    denoising ``step`` of ``steps`` (omnipipe's extension); the finished image has neither."""

    type: Literal["image_url"] = "image_url"
    image_url: ResponseImageUrl
    step: int | None = None
    steps: int | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    audio: ResponseAudio | None = None
    images: list[ResponseImage] | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: str | None = "stop"
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class DeltaAudio(BaseModel):
    id: str
    data: str | None = None
    transcript: str | None = None
    expires_at: int | None = None


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A piece of a streamed call: its ``index``, then ``id``, ``type`` and name first, argument text after."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    audio: DeltaAudio | None = None
    images: list[ResponseImage] | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


# ---------------------------------------------------------------------------------------------- speech
class SpeechRequest(BaseModel):
    model_config = _STRICT
    model: str = Field(min_length=1)
    input: str = Field(min_length=1, max_length=4096)
    voice: Voice = "default"
    response_format: SpeechFormat = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    instructions: str | None = None


class VoiceCard(BaseModel):
    id: str
    name: str
    # omnipipe extension: the other names (OpenAI's voice names) that select this voice
    aliases: list[str] = Field(default_factory=list)
    # omnipipe extension: for a voice made from an uploaded clip, the model's voice it builds on; else null
    base_voice: str | None = None


class VoiceDeleted(BaseModel):
    """``DELETE /v1/audio/voices/{name}``: the voice made from a clip that was removed."""

    id: str
    object: Literal["audio.voice"] = "audio.voice"
    deleted: bool = True


class VoiceList(BaseModel):
    """``GET /v1/audio/voices``: the voices of one model (``model``), or of every model that speaks (``models``)."""

    voices: list[VoiceCard]
    model: str | None = None
    models: dict[str, list[VoiceCard]] | None = None


# ---------------------------------------------------------------------------------------------- images
ImageFormat = Literal["png", "webp", "jpeg"]


class ImageGenerationRequest(BaseModel):
    """``POST /v1/images/generations``, OpenAI's fields plus vLLM-Omni's diffusion knobs (``seed``,
    ``num_inference_steps``, ``guidance_scale``). Closed: an unknown field is a 400 naming it."""

    model_config = _CLOSED
    prompt: str = Field(min_length=1, max_length=32_000)
    model: str | None = Field(None, min_length=1)  # None: the served model
    n: int = Field(1, ge=1, le=10)
    size: str = "auto"  # "auto" (the model's own size) or "WIDTHxHEIGHT"
    response_format: Literal["b64_json", "url"] | None = None
    output_format: Literal["png", "webp", "jpeg", "gif", "svg"] | None = None
    output_compression: int | None = Field(None, ge=0, le=100)
    stream: bool = False
    partial_images: int | None = Field(None, ge=0, le=3)
    # features omnipipe does not have: their default values are accepted, anything else is a 400
    quality: str | None = None
    background: str | None = None
    style: str | None = None
    # accepted, not used: nothing here moderates, and identifiers change no image
    moderation: Literal["low", "auto"] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    # vLLM-Omni's extensions
    seed: int | None = Field(None, ge=0, lt=2**63)
    num_inference_steps: int | None = Field(None, ge=1, le=1000)
    guidance_scale: float | None = Field(None, ge=0, le=50)


class ImageData(BaseModel):
    b64_json: str
    revised_prompt: str | None = None  # think-and-draw: the thinker's answer the image was drawn from


class ImagesResponse(BaseModel):
    created: int
    data: list[ImageData]
    output_format: ImageFormat
    size: str
    background: Literal["opaque"] = "opaque"


# ---------------------------------------------------------------------------------------------- models
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "omnipipe"
    # omnipipe extension: what the model takes and what it can answer with ("text", "audio", "image", ...)
    input_modalities: list[str] | None = None
    output_modalities: list[str] | None = None
    conversation: bool | None = None  # whether chat takes earlier turns and system messages (else: the question)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---------------------------------------------------------------------------------------------- errors
class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
