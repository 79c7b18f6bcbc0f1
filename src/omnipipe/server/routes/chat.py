"""``POST /v1/chat/completions``: the last message (the user's text and/or media parts) as the question, the
messages before it as the conversation (for a pipeline that takes history), text and optionally speech as the
answer, whole or streamed as server-sent events."""

from __future__ import annotations

import base64
import binascii
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from omnipipe.api.async_omni import AsyncOmni
from omnipipe.api.outputs import OmniRequestOutput, RequestMetrics
from omnipipe.api.sampling_params import SamplingParams
from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.protocol.openai import (
    AudioUrlPart,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    DeltaAudio,
    DeltaFunctionCall,
    DeltaToolCall,
    ErrorResponse,
    FunctionCall,
    ImageUrlPart,
    InputAudioPart,
    NamedToolChoice,
    PromptTokensDetails,
    ResponseAudio,
    ResponseFormatJsonSchema,
    ResponseImage,
    ResponseImageUrl,
    ResponseMessage,
    TextPart,
    ToolCall,
    Usage,
    VideoUrlPart,
)
from omnipipe.protocol.worker import CHAT_PATH
from omnipipe.server.audio_stream import Pcm16Stream, encode_whole
from omnipipe.server.disconnect import while_connected
from omnipipe.server.engines import EnginePool, with_voice
from omnipipe.server.errors import APIError, from_engine_error, invalid
from omnipipe.server.prometheus import ServerMetrics
from omnipipe.server.spoken_answers import AUDIO_EXPIRY_S, SpokenAnswers
from omnipipe.server.streaming import SSE_HEADERS, ClosingStreamingResponse, first_output, sse, with_first
from omnipipe.server.tool_calls import ToolCalls, check_arguments, offered_tools, structured_format
from omnipipe.util.data_url import DataUrlError, parse_data_url
from omnipipe.util.field_error import FieldError
from omnipipe.util.image import encode_image

ENDPOINT = CHAT_PATH
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 415, 429,
                                                                                          503)}
router = APIRouter()


@dataclass
class ChatPlan:
    """A validated chat request, in the engine's terms."""

    prompt: dict[str, Any]
    audio_param: str | None
    modalities: list[str]
    sampling_params: dict[str, SamplingParams]
    field_map: dict[str, str]
    edge_options: dict[str, dict[str, Any]]


# ---------------------------------------------------------------------------------------------- request -> plan
def _refuse_unsupported(body: ChatCompletionRequest) -> None:
    """Features omnipipe does not have: their off values pass (clients send them by default), anything else is a
    400 naming the field rather than an answer that silently ignores it."""
    off = {
        "functions": not body.functions,
        "function_call": body.function_call in (None, "none"),
        "logit_bias": not body.logit_bias,
    }
    for name, ok in off.items():
        if not ok:
            use = "tools and tool_choice" if name.startswith("function") else "nothing: omnipipe has no logit bias"
            raise invalid(f"{name}: not supported (use {use})", name, code="unsupported_parameter")


_URL_PARTS = {"image_url": "image", "audio_url": "audio", "video_url": "video"}  # part type -> modality


@dataclass
class MessageContent:
    """A message's content parts sorted out: its text, and the media files it attaches by modality (``image``,
    ``audio``, ``video``: each file's bytes, in the order given) with the API field each came from."""

    texts: list[str] = field(default_factory=list)
    media: dict[str, list[bytes]] = field(default_factory=dict)
    params: dict[str, list[str]] = field(default_factory=dict)

    def add(self, modality: str, data: bytes, param: str) -> None:
        self.media.setdefault(modality, []).append(data)
        self.params.setdefault(modality, []).append(param)


def _not_empty(data: bytes, param: str) -> bytes:
    if not data:
        raise invalid(f"{param}: the data is empty", param)
    return data


def _base64(data: str, param: str) -> bytes:
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"{param}: the data is not valid base64", param, code="invalid_base64") from None
    return _not_empty(decoded, param)


def refuse_modality(pipeline: PipelineSpec, modality: str, param: str) -> None:
    if modality not in pipeline.input_modalities:
        raise invalid(f"{param}: pipeline {pipeline.name!r} does not take {modality} input (it takes "
                      f"{', '.join(pipeline.input_modalities)})", param, code="unsupported_modality")


def _url_part(part: ImageUrlPart | AudioUrlPart | VideoUrlPart, param: str, pipeline: PipelineSpec,
              earlier: bool) -> tuple[str, bytes]:
    """A media part given by URL: its modality and its file's bytes, from an inline base64 data URL."""
    modality = _URL_PARTS[part.type]
    refuse_modality(pipeline, modality, param)
    if earlier:
        raise invalid(f"{param}: {modality} is taken in the last user message only", param,
                      code="unsupported_content")
    return modality, inline_media(modality, getattr(part, part.type).url, f"{param}.url", f"invalid_{part.type}")


def inline_media(modality: str, url: str, where: str, code: str) -> bytes:
    """The bytes of a ``modality`` file given at API field ``where`` as an inline base64 data URL (this server
    fetches nothing: another URL is a 400 with ``code``)."""
    if not url.startswith("data:"):
        raise invalid(f"{where}: give the {modality} inline as data:{modality}/<type>;base64,<data> (this "
                      "server fetches nothing)", where, code=code)
    try:
        _, data = parse_data_url(url, field=where, kind=modality)
    except DataUrlError as exc:
        raise invalid(str(exc), where, code="invalid_base64" if exc.problem == "base64" else code) from None
    return _not_empty(data, where)


def message_content(content: str | list[Any] | None, where: str, pipeline: PipelineSpec,
                    earlier: bool = False) -> MessageContent:
    """The parts of a message's ``content`` (``where``: its API field, ``messages[i].content``) sorted out; a part of
    a modality ``pipeline`` does not take, or media in an ``earlier`` message, is a 400 naming the part. Media
    parts: ``image_url``, ``audio_url`` and ``video_url`` (inline ``data:<modality>/...;base64,`` URLs) and
    ``input_audio`` (base64 ``data``); each is decoded from base64 once (the prompt processor takes the bytes)."""
    parts = [TextPart(type="text", text=content)] if isinstance(content, str) else list(content or [])
    out = MessageContent()
    for j, part in enumerate(parts):
        param = f"{where}[{j}].{part.type}"
        if isinstance(part, TextPart):
            if part.text.strip():
                out.texts.append(part.text.strip())
        elif isinstance(part, InputAudioPart):
            if earlier:
                raise invalid(f"{param}: audio is taken in the last user message only; give an earlier spoken "
                              "question as its transcript (text)", param, code="unsupported_content")
            data = _base64(part.input_audio.data, f"{param}.data")
            refuse_modality(pipeline, "audio", param)
            out.add("audio", data, f"{param}.data")
        else:
            modality, data = _url_part(part, param, pipeline, earlier)
            out.add(modality, data, f"{param}.url")
    return out


def _tool_turn(message: ChatMessage, where: str, calls: set[str]) -> dict[str, Any]:
    """A tool message: the result of an earlier call, named by its id."""
    if not message.tool_call_id:
        raise invalid(f"{where}.tool_call_id: a tool message names the call it answers", f"{where}.tool_call_id")
    if message.tool_call_id not in calls:
        raise invalid(f"{where}.tool_call_id: no earlier assistant message made a call with id "
                      f"{message.tool_call_id!r}", f"{where}.tool_call_id")
    content = message.content if isinstance(message.content, str) else " ".join(
        part.text for part in message.content or [] if isinstance(part, TextPart))
    return {"role": "tool", "content": content, "tool_call_id": message.tool_call_id}


def _history(messages: list[ChatMessage], pipeline: PipelineSpec, answers: SpokenAnswers) -> list[dict[str, Any]]:
    """The turns before the question, in the prompt's ``history`` form (developer messages are system ones; an
    assistant's calls and the tools' results as the prompt takes them)."""
    history: list[dict[str, Any]] = []
    calls: set[str] = set()
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        for name in ("function_call", "refusal"):
            if getattr(message, name):
                raise invalid(f"{where}.{name}: not supported (use tool_calls)", f"{where}.{name}",
                              code="unsupported_parameter")
        if message.tool_calls and message.role != "assistant":
            raise invalid(f"{where}.tool_calls: only an assistant message makes tool calls", f"{where}.tool_calls")
        if message.tool_call_id is not None and message.role != "tool":
            raise invalid(f"{where}.tool_call_id: only a tool message answers a call", f"{where}.tool_call_id")
        if message.role == "tool":
            history.append(_tool_turn(message, where, calls))
            continue
        if message.audio is not None and message.role != "assistant":
            raise invalid(f"{where}.audio: only an assistant message refers to an earlier spoken answer",
                          f"{where}.audio")
        texts = message_content(message.content, f"{where}.content", pipeline, earlier=True).texts
        if message.role == "assistant" and message.audio is not None and not texts:
            words = answers.words(message.audio.id)
            if words is None:
                raise invalid(f"{where}.audio.id: no spoken answer {message.audio.id!r} on this server (unknown or "
                              "expired): give the assistant's answer as content", f"{where}.audio.id")
            texts = [words]
        if message.tool_calls:
            for j, call in enumerate(message.tool_calls):
                check_arguments(call.function.arguments, f"{where}.tool_calls[{j}].function.arguments")
                calls.add(call.id)
            history.append({"role": "assistant", "content": " ".join(texts), "tool_calls": [
                {"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls]})
        elif texts:
            role = "system" if message.role == "developer" else message.role
            history.append({"role": role, "content": " ".join(texts)})
    if history and not pipeline.takes_history:
        raise invalid(f"messages: pipeline {pipeline.name!r} answers one question at a time; it does not take "
                      "earlier turns or system messages (send the question alone)", "messages",
                      code="unsupported_content")
    return history


def _question(messages: list[ChatMessage], pipeline: PipelineSpec, answers: SpokenAnswers) -> tuple[
        dict[str, Any], str | None, dict[str, str]]:
    """The last message is the question (a user's: text and/or media); the ones before are the conversation it
    belongs to. Returns the prompt, the API field of its audio when it has one audio file, and the API field of each
    of its ``multi_modal_data`` entries (for naming what a stage finds wrong with them). A conversation that ends
    with tool results has no question: the model goes on from them."""
    index = len(messages) - 1
    if messages[index].role == "tool":
        return {"prompt": "", "history": _history(messages, pipeline, answers)}, None, {}
    if messages[index].role != "user":
        raise invalid(f"messages[{index}].role: the last message must be the user's question, got "
                      f"{messages[index].role!r}", f"messages[{index}].role")
    where = f"messages[{index}].content"
    content = message_content(messages[index].content, where, pipeline)
    if messages[index].audio is not None:
        raise invalid(f"messages[{index}].audio: only an assistant message refers to an earlier spoken answer",
                      f"messages[{index}].audio")
    text = " ".join(content.texts)
    if not content.media and not text:
        raise invalid(f"{where}: the last user message has no text or media", where)
    if text and "text" not in pipeline.input_modalities:
        raise invalid(f"{where}: pipeline {pipeline.name!r} does not take text input", where)
    prompt: dict[str, Any] = {"prompt": text, "history": _history(messages[:index], pipeline, answers)}
    if content.media:
        prompt["multi_modal_data"] = content.media
    media_fields: dict[str, str] = {}
    for modality, params in content.params.items():
        media_fields[f"prompt.multi_modal_data.{modality}"] = params[0] if len(params) == 1 else where
        for n, param in enumerate(params):
            media_fields[f"prompt.multi_modal_data.{modality}[{n}]"] = param
    audio_params = content.params.get("audio", [])
    return prompt, audio_params[0] if len(audio_params) == 1 else None, media_fields


def _sampling_params(body: ChatCompletionRequest, pipeline: PipelineSpec, shape: dict[str, Any]) -> tuple[
        dict[str, SamplingParams], dict[str, str]]:
    comprehension = pipeline.comprehension_stage or pipeline.stages[0].name
    top: dict[str, Any] = dict(shape)
    for name in ("temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty",
                 "repetition_penalty"):
        value = getattr(body, name)
        if value is not None:
            top[name] = value
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if max_tokens is not None:
        top["max_tokens"] = max_tokens
    if body.stop is not None:
        top["stop"] = [body.stop] if isinstance(body.stop, str) else body.stop
    per_stage: dict[str, dict[str, Any]] = {comprehension: top} if top else {}
    extension = body.omnipipe.sampling_params if body.omnipipe is not None else {}
    field_map: dict[str, str] = {"prompt.multi_modal_data": "messages", "prompt": "messages",
                                 # what a stage finds too long for the answer's cap (its KV, its context)
                                 "sampling_params.max_tokens": ("max_completion_tokens"
                                                                if body.max_completion_tokens is not None
                                                                else "max_tokens")}
    for stage, fields in extension.items():
        if stage not in pipeline.stage_names:
            param = f"omnipipe.sampling_params.{stage}"
            raise invalid(f"{param}: no such stage (stages: {', '.join(pipeline.stage_names)})", param)
        per_stage[stage] = {**per_stage.get(stage, {}), **fields}
    params: dict[str, SamplingParams] = {}
    for stage, fields in per_stage.items():
        try:
            params[stage] = SamplingParams.from_dict(fields)
            params[stage].check_extra(pipeline.stage_extra_schema(stage))
        except FieldError as exc:
            name, rule = exc.field.removeprefix("sampling_params."), exc.rule
            if name.partition(".")[0] in extension.get(stage, {}):
                param = f"omnipipe.sampling_params.{stage}.{name}"
            elif name == "max_tokens":
                param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
            else:
                param = name
            raise invalid(f"{param}: {rule}", param) from None
    return params, field_map


def _shape(body: ChatCompletionRequest, pipeline: PipelineSpec, model: str) -> tuple[list[dict[str, Any]],
                                                                                   dict[str, Any]]:
    """The request's tools (the prompt's) and its answer's shape (the thinker's sampling fields)."""
    asked = {"response_format": body.response_format is not None and body.response_format.type != "text",
             "logprobs": bool(body.logprobs), "top_logprobs": bool(body.top_logprobs)}
    for name, wanted in asked.items():
        if wanted and not pipeline.constrained_decoding:
            raise invalid(f"{name}: not supported by model {model!r} (its pipeline {pipeline.name!r} has no "
                          "constrained decoding or logprobs)", name, code="unsupported_parameter")
    if body.top_logprobs and not body.logprobs:
        raise invalid("top_logprobs: needs logprobs: true", "top_logprobs")
    choice = body.tool_choice
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    tools, fields = offered_tools(pipeline, model, [(t.function.name, t.function.description, t.function.parameters)
                                                    for t in body.tools or []], "tools[{}].function", choice, named,
                                  "tool_choice.function.name", body.parallel_tool_calls)
    fmt = body.response_format
    if fmt is not None and fmt.type != "text":
        schema = fmt.json_schema.schema_ if isinstance(fmt, ResponseFormatJsonSchema) else None
        fields["response_format"] = structured_format(fmt.type, schema, "response_format.json_schema.schema")
    if body.logprobs:
        fields["logprobs"] = body.top_logprobs or 0
    return tools, fields


def plan_chat(body: ChatCompletionRequest, pool: EnginePool, pipeline: PipelineSpec,
              answers: SpokenAnswers) -> ChatPlan:
    _refuse_unsupported(body)
    tools, shape = _shape(body, pipeline, body.model)
    prompt, audio_param, media_fields = _question(body.messages, pipeline, answers)
    if tools:
        prompt["tools"] = tools
    try:  # audio brings the transcript of the spoken answer
        modalities = pipeline.check_output_modalities(body.modalities or ["text"], "modalities", with_transcript=True)
    except FieldError as exc:
        raise invalid(str(exc), exc.field) from None
    voice = "default"
    if "audio" in modalities:
        audio = body.audio
        if audio is not None:
            voice = pool.check_voice(audio.voice, pipeline, "audio.voice")
            if body.stream and audio.format != "pcm16":
                raise invalid(f"audio.format: streamed audio is pcm16 (24 kHz mono int16), got {audio.format!r}",
                              "audio.format")
    elif body.audio is not None:
        raise invalid("audio: given but modalities does not include 'audio'", "audio")
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options: only allowed when stream is true", "stream_options")
    params, field_map = _sampling_params(body, pipeline, shape)
    field_map.update({"prompt.tools": "tools", "sampling_params.response_format": "response_format",
                      "prompt.history": "messages"})
    params = with_voice(params, voice, pipeline, "audio.voice")
    field_map.update(media_fields)
    if audio_param is not None and not prompt["prompt"]:
        # a spoken question alone: what a stage finds wrong with the prompt is in its audio
        field_map["prompt"] = audio_param
    edge_options: dict[str, dict[str, Any]] = {}
    chunk_frames = body.omnipipe.initial_codec_chunk_frames if body.omnipipe is not None else None
    if chunk_frames is not None:
        param = "omnipipe.initial_codec_chunk_frames"
        edges = pipeline.edges_with_option("initial_codec_chunk_frames")
        if not edges:
            raise invalid(f"{param}: pipeline {pipeline.name!r} streams no frames", param)
        for edge in edges:
            edge_options[edge.name] = {"initial_codec_chunk_frames": chunk_frames}
            field_map[f"edge_options.{edge.name}.initial_codec_chunk_frames"] = param
    return ChatPlan(prompt, audio_param, modalities, params, field_map, edge_options)


# ---------------------------------------------------------------------------------------------- responses
def _usage(metrics: RequestMetrics | None) -> Usage:
    prompt = metrics.num_prompt_tokens if metrics is not None else 0
    tokens = metrics.num_output_tokens if metrics is not None else 0
    cached = metrics.num_cached_tokens if metrics is not None else 0
    return Usage(prompt_tokens=prompt, completion_tokens=tokens, total_tokens=prompt + tokens,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


def _image(image: np.ndarray, progress: dict[str, Any] | None = None) -> ResponseImage:
    """An image as a PNG data URL; a preview with its denoising step."""
    url = f"data:image/png;base64,{base64.b64encode(encode_image(image, 'png')).decode()}"
    progress = progress or {}
    return ResponseImage(image_url=ResponseImageUrl(url=url), step=progress.get("step"), steps=progress.get("steps"))


async def _complete(outputs: AsyncIterator[OmniRequestOutput], first: OmniRequestOutput | None,
                    body: ChatCompletionRequest, plan: ChatPlan, model: str, request_id: str,
                    metrics: ServerMetrics, answers: SpokenAnswers) -> JSONResponse:
    """The whole answer. With audio, as OpenAI: the words are the audio's ``transcript`` and ``content`` is
    null."""
    final = first
    calls, logprobs = ToolCalls(), []
    try:
        async for out in with_first(first, outputs):
            final = out
            if out.details and out.modality == "text":
                calls.add(out.details.get("tool_calls") or [])
                logprobs += out.details.get("logprobs") or []
    except Exception as exc:  # noqa: BLE001 - mapped to an API error
        raise from_engine_error(exc, plan.field_map, plan.audio_param) from None
    assert final is not None
    metrics.observe(ENDPOINT, final.metrics)
    audio = None
    if "audio" in plan.modalities and not calls.calls:  # a turn of calls is not spoken
        fmt = body.audio.format if body.audio is not None else "wav"
        samples = final.audio if final.audio is not None else None
        data = b""
        if samples is not None and samples.size and final.sample_rate_hz:
            data = encode_whole(samples, final.sample_rate_hz, fmt)
        audio = ResponseAudio(id=f"audio_{uuid.uuid4().hex}", data=base64.b64encode(data).decode(),
                              transcript=final.text, expires_at=int(time.time()) + AUDIO_EXPIRY_S)
        answers.remember(audio.id, final.text)
    images = [_image(final.image)] if "image" in plan.modalities and final.image is not None else None
    tool_calls = [ToolCall(id=c["id"], function=FunctionCall(name=c["name"], arguments=c["arguments"]))
                  for c in calls.calls] or None
    content = None if audio is not None or (tool_calls and not final.text) else final.text
    completion = ChatCompletion(
        id=request_id, created=int(time.time()), model=model, usage=_usage(final.metrics),
        choices=[Choice(message=ResponseMessage(content=content, audio=audio, images=images, tool_calls=tool_calls),
                        finish_reason=final.finish_reason or "stop",
                        logprobs=ChoiceLogprobs(content=logprobs) if body.logprobs else None)])
    answer = completion.model_dump(exclude_none=False)
    message = answer["choices"][0]["message"]
    if images is None:  # an extension field: only in answers that drew something
        del message["images"]
    if tool_calls is None:
        del message["tool_calls"]
    return JSONResponse(answer)


def _text_deltas(out: OmniRequestOutput, calls: ToolCalls, audio_id: str | None) -> list[
        tuple[Delta, ChoiceLogprobs | None]]:
    """A text event as chunk deltas: its tool-call pieces as OpenAI streams them (``index``, then ``id``, ``type``
    and name, then argument text), then its text (as the audio's transcript when the answer is spoken) with its
    tokens' logprobs."""
    details = out.details or {}
    deltas: list[tuple[Delta, ChoiceLogprobs | None]] = []
    for piece in calls.add(details.get("tool_calls") or []):
        function = DeltaFunctionCall(name=piece.get("name"), arguments=piece.get("arguments"))
        call = DeltaToolCall(index=piece["index"], id=piece.get("id"), type="function" if "id" in piece else None,
                             function=function)
        deltas.append((Delta(tool_calls=[call]), None))
    entries = details.get("logprobs")
    if out.text_delta or entries:
        delta = Delta(audio=DeltaAudio(id=audio_id, transcript=out.text_delta)) if audio_id is not None \
            else Delta(content=out.text_delta)
        deltas.append((delta, ChoiceLogprobs(content=entries) if entries else None))
    return deltas


async def _stream(outputs: AsyncIterator[OmniRequestOutput], first: OmniRequestOutput | None,
                  body: ChatCompletionRequest, plan: ChatPlan, model: str, request_id: str,
                  metrics: ServerMetrics, answers: SpokenAnswers) -> AsyncIterator[bytes]:
    """The answer as server-sent chunks. With audio, as OpenAI: the words come as ``audio.transcript`` deltas
    (never also as ``content``) beside the pcm16 ``audio.data``."""
    created = int(time.time())
    audio_id = f"audio_{uuid.uuid4().hex}"
    with_audio = "audio" in plan.modalities
    pcm: Pcm16Stream | None = None

    def chunk(delta: Delta, finish_reason: str | None = None) -> bytes:
        return sse(ChatCompletionChunk(id=request_id, created=created, model=model,
                                       choices=[ChunkChoice(delta=delta, finish_reason=finish_reason)]))

    def audio_delta(data: bytes) -> bytes:
        return chunk(Delta(audio=DeltaAudio(id=audio_id, data=base64.b64encode(data).decode())))

    calls = ToolCalls()
    try:
        yield chunk(Delta(role="assistant", content=None if with_audio else ""))
        async for out in with_first(first, outputs):
            if out.modality == "text" and (out.text_delta or out.details):
                for delta, logprobs in _text_deltas(out, calls, audio_id if with_audio else None):
                    yield sse(ChatCompletionChunk(id=request_id, created=created, model=model, choices=[
                        ChunkChoice(delta=delta, logprobs=logprobs)]))
            elif out.modality == "image" and out.image is not None:
                yield chunk(Delta(images=[_image(out.image, out.details)]))
            elif out.modality == "audio" and with_audio and out.audio is not None and out.sample_rate_hz:
                pcm = pcm or Pcm16Stream(out.sample_rate_hz)
                data = pcm.feed(out.audio)
                if data:
                    yield audio_delta(data)
            elif out.finished:
                metrics.observe(ENDPOINT, out.metrics)
                if with_audio:
                    answers.remember(audio_id, out.text)  # a turn of calls has no audio: nothing to play back
                if pcm is not None:
                    tail = pcm.flush()
                    if tail:
                        yield audio_delta(tail)
                closing = DeltaAudio(id=audio_id, expires_at=created + AUDIO_EXPIRY_S) if with_audio else None
                yield chunk(Delta(audio=closing), finish_reason=out.finish_reason or "stop")
                if body.stream_options is not None and body.stream_options.include_usage:
                    yield sse(ChatCompletionChunk(id=request_id, created=created, model=model, choices=[],
                                                  usage=_usage(out.metrics)))
                yield sse("[DONE]")
    except Exception as exc:  # noqa: BLE001 - the response has started: an error event ends the stream
        yield sse(from_engine_error(exc, plan.field_map, plan.audio_param).body())
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]


@router.post(ENDPOINT, response_model=ChatCompletion, responses=_ERRORS)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    pool: EnginePool = request.app.state.pool
    metrics: ServerMetrics = request.app.state.metrics
    pool.check_model(body.model, "chat")
    engine: AsyncOmni
    engine, pipeline = await pool.engine_for("chat")
    answers: SpokenAnswers = request.app.state.spoken_answers
    plan = plan_chat(body, pool, pipeline, answers)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    outputs = engine.generate(plan.prompt, request_id=request_id, sampling_params=plan.sampling_params,
                              output_modalities=plan.modalities,
                              edge_options=plan.edge_options)
    first = await first_output(request, outputs, plan.field_map, plan.audio_param)
    if not body.stream:
        try:
            return await while_connected(request, _complete(outputs, first, body, plan, body.model, request_id,
                                                            metrics, answers))
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]
    stream = _stream(outputs, first, body, plan, body.model, request_id, metrics, answers)
    return ClosingStreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)


__all__ = ["APIError", "MessageContent", "inline_media", "message_content", "plan_chat", "refuse_modality", "router"]
