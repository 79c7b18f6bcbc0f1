"""``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``: OpenAI's Responses API on the main pipeline's
thinker, text answers (``message`` items) and function calls (``function_call`` items), whole or streamed as typed
server-sent events.

The input items become the prompt as chat completions build it: the last item is the question (a user message,
its text and inline images) or a ``function_call_output`` the model goes on from; the items before it (after the
stored conversation of ``previous_response_id`` and ``instructions`` as a system turn) are the history. Tools,
``tool_choice`` and ``text.format`` go through ``server/tool_calls.py`` like chat's. A stored response
(``store: true``) is kept in the app's ``ResponseStore`` (``server/response_store.py``)."""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from omnipipe.api.async_omni import AsyncOmni
from omnipipe.api.outputs import OmniRequestOutput, RequestMetrics
from omnipipe.api.sampling_params import SamplingParams
from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.protocol.errors import APIError
from omnipipe.protocol.openai import ErrorResponse
from omnipipe.protocol.responses import FunctionChoice, ResponseDeleted, ResponseObject, ResponsesRequest
from omnipipe.protocol.worker import RESPONSES_PATH
from omnipipe.server.disconnect import while_connected
from omnipipe.server.engines import EnginePool
from omnipipe.server.errors import from_engine_error, from_validation_errors, invalid
from omnipipe.server.prometheus import ServerMetrics
from omnipipe.server.response_store import ResponseStore
from omnipipe.server.routes.chat import inline_media, refuse_modality
from omnipipe.server.streaming import SSE_HEADERS, ClosingStreamingResponse, first_output, with_first
from omnipipe.server.tool_calls import ToolCalls, check_arguments, offered_tools, structured_format
from omnipipe.util.field_error import FieldError

ENDPOINT = RESPONSES_PATH
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 415, 429,
                                                                                          503)}
router = APIRouter()


@dataclass
class ResponsesPlan:
    """A validated Responses request, in the engine's terms, and the conversation it continues."""

    prompt: dict[str, Any]
    sampling_params: dict[str, SamplingParams]
    field_map: dict[str, str]
    items: list[dict[str, Any]]  # the conversation's items before the answer (images left out), for the store
    echo: dict[str, Any] = field(default_factory=dict)  # the request's settings a response object repeats


# ---------------------------------------------------------------------------------------------- request -> plan
def _input_items(body: ResponsesRequest) -> list[dict[str, Any]]:
    if isinstance(body.input, str):
        return [{"type": "message", "role": "user", "content": body.input}]
    if not body.input:
        raise invalid("input: give at least one item", "input")
    return [item.model_dump(by_alias=True, exclude_none=True) for item in body.input]


def _without_images(item: dict[str, Any]) -> dict[str, Any]:
    """An item as the store keeps it: an earlier turn's images are not given to the model again (its text is)."""
    content = item.get("content")
    if not isinstance(content, list):
        return item
    return {**item, "content": [part for part in content if part.get("type") != "input_image"]}


@dataclass
class _Question:
    text: str = ""
    images: list[bytes] = field(default_factory=list)
    params: list[str] = field(default_factory=list)


def _message_turn(item: dict[str, Any], where: str, question: _Question | None,
                  pipeline: PipelineSpec) -> dict[str, Any] | None:
    """A message item as a history turn (None when it has no text), or, given ``question``, its text and images
    taken as the question (images only there)."""
    content = item["content"]
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    texts: list[str] = []
    for j, part in enumerate(parts):
        if part["type"] != "input_image":
            if part["text"].strip():
                texts.append(part["text"].strip())
            continue
        param = f"{where}.content[{j}]"
        if question is None:
            raise invalid(f"{param}: images are taken in the last user message only", param,
                          code="unsupported_content")
        refuse_modality(pipeline, "image", param)
        question.images.append(inline_media("image", part["image_url"], f"{param}.image_url", "invalid_image_url"))
        question.params.append(f"{param}.image_url")
    if question is not None:
        question.text = " ".join(texts)
        if not question.text and not question.images:
            raise invalid(f"{where}.content: the last user message has no text or image", f"{where}.content")
        return None
    if not texts:
        return None
    return {"role": "system" if item["role"] == "developer" else item["role"], "content": " ".join(texts)}


def _conversation(items: list[dict[str, Any]], first_new: int, pipeline: PipelineSpec) -> tuple[
        list[dict[str, Any]], _Question | None]:
    """The history turns before the question, and the question (None: the conversation ends with a call's result,
    the model goes on from it). ``items[first_new:]`` are this request's ``input`` (named in errors); the ones
    before come from ``previous_response_id``'s conversation."""
    turns: list[dict[str, Any]] = []
    calls: set[str] = set()
    question: _Question | None = None
    last = len(items) - 1
    for k, item in enumerate(items):
        where = f"input[{k - first_new}]" if k >= first_new else "previous_response_id"
        kind = item.get("type", "message")
        if kind == "function_call":
            check_arguments(item["arguments"], f"{where}.arguments")
            calls.add(item["call_id"])
            call = {"id": item["call_id"], "name": item["name"], "arguments": item["arguments"]}
            if turns and turns[-1]["role"] == "assistant":  # the calls of the answer whose words came before
                turns[-1].setdefault("tool_calls", []).append(call)
            else:
                turns.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            if item["call_id"] not in calls:
                raise invalid(f"{where}.call_id: no earlier function_call item has call_id {item['call_id']!r}",
                              f"{where}.call_id")
            turns.append({"role": "tool", "content": item["output"], "tool_call_id": item["call_id"]})
        else:
            asked = k == last and item["role"] == "user"
            question = _Question() if asked else None
            turn = _message_turn(item, where, question, pipeline)
            if turn is not None:
                turns.append(turn)
    if question is None and items[last].get("type", "message") != "function_call_output":
        where = f"input[{last - first_new}]"
        raise invalid(f"{where}: the last input item must be a user message or a function_call_output", where)
    return turns, question


def _function_choice(choice: dict[str, Any]) -> FunctionChoice:
    """``tool_choice`` given as an object: ``{"type": "function", "name": ...}``; a 400 naming its field."""
    try:
        return FunctionChoice.model_validate(choice)
    except ValidationError as exc:
        error = from_validation_errors(list(exc.errors()))
        param = f"tool_choice.{error.param}" if error.param else "tool_choice"
        raise invalid(f"tool_choice: {error.message}", param, code=error.code) from None


def _shape(body: ResponsesRequest, pipeline: PipelineSpec) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The request's tools (the prompt's) and the thinker's sampling fields."""
    choice = _function_choice(body.tool_choice) if isinstance(body.tool_choice, dict) else body.tool_choice
    named = choice.name if isinstance(choice, FunctionChoice) else None
    tools, fields = offered_tools(pipeline, body.model, [(t.name, t.description, t.parameters)
                                                         for t in body.tools or []], "tools[{}]", choice, named,
                                  "tool_choice.name", body.parallel_tool_calls)
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type == "json_schema" and fmt.name is None:
        raise invalid("text.format.name: a json_schema format needs its name", "text.format.name",
                      code="missing_field")
    if fmt is not None and fmt.type != "json_schema" and fmt.schema_ is not None:
        raise invalid(f"text.format.schema: a {fmt.type} format has no schema", "text.format.schema")
    if fmt is not None and fmt.type != "text":
        fields["response_format"] = structured_format(fmt.type, fmt.schema_, "text.format.schema")
    for name, value in (("temperature", body.temperature), ("top_p", body.top_p),
                        ("max_tokens", body.max_output_tokens)):
        if value is not None:
            fields[name] = value
    return tools, fields


_SAMPLING_FIELDS = {"max_tokens": "max_output_tokens", "response_format": "text.format"}


def _echo(body: ResponsesRequest) -> dict[str, Any]:
    choice = body.tool_choice
    text = body.text.model_dump(by_alias=True, exclude_none=True) if body.text is not None else {}
    return {"instructions": body.instructions, "tools": [t.model_dump() for t in body.tools or []],
            "tool_choice": choice or "auto",
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "text": {"format": {"type": "text"}, **text}, "temperature": body.temperature, "top_p": body.top_p,
            "max_output_tokens": body.max_output_tokens, "metadata": body.metadata or {},
            "previous_response_id": body.previous_response_id, "store": body.store, "user": body.user}


def plan_response(body: ResponsesRequest, pipeline: PipelineSpec, store: ResponseStore) -> ResponsesPlan:
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options: only allowed when stream is true", "stream_options")
    tools, shape = _shape(body, pipeline)
    earlier: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        stored = store.get(body.previous_response_id)
        if stored is None:
            raise APIError(404, f"previous_response_id: no stored response {body.previous_response_id!r} on this "
                           "server (unknown, deleted, evicted or made with store: false)",
                           param="previous_response_id", code="previous_response_not_found")
        earlier = stored.items
    new = _input_items(body)
    turns, question = _conversation(earlier + new, len(earlier), pipeline)
    if body.instructions:
        turns.insert(0, {"role": "system", "content": body.instructions})
    if turns and not pipeline.takes_history:
        param = "instructions" if body.instructions else "previous_response_id" if earlier else "input"
        raise invalid(f"{param}: pipeline {pipeline.name!r} answers one question at a time; it does not take "
                      "earlier turns or instructions (send the question alone)", param, code="unsupported_content")
    prompt: dict[str, Any] = {"prompt": question.text if question else "", "history": turns}
    field_map = {"prompt": "input", "prompt.history": "input", "prompt.multi_modal_data": "input",
                 "prompt.tools": "tools", "sampling_params.response_format": "text.format",
                 "sampling_params.max_tokens": "max_output_tokens"}
    if question is not None and question.images:
        prompt["multi_modal_data"] = {"image": question.images}
        field_map["prompt.multi_modal_data.image"] = question.params[0] if len(question.params) == 1 else "input"
        for n, param in enumerate(question.params):
            field_map[f"prompt.multi_modal_data.image[{n}]"] = param
    if tools:
        prompt["tools"] = tools
    stage = pipeline.comprehension_stage or pipeline.stages[0].name
    try:
        params = SamplingParams.from_dict(shape)
        params.check_extra(pipeline.stage_extra_schema(stage))
    except FieldError as exc:
        name = exc.field.removeprefix("sampling_params.")
        param = _SAMPLING_FIELDS.get(name.partition(".")[0], name)
        raise invalid(f"{param}: {exc.rule}", param) from None
    return ResponsesPlan(prompt, {stage: params}, field_map, earlier + [_without_images(item) for item in new],
                         _echo(body))


# ---------------------------------------------------------------------------------------------- answer
def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputItems:
    """The answer's output items built from the engine's events, with the stream events that build them (``type``
    and fields, no ``sequence_number``): a ``message`` item with one ``output_text`` part for the words, a
    ``function_call`` item per call. A whole answer is the same items with the events dropped."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.calls = ToolCalls()
        self._call_items: dict[int, dict[str, Any]] = {}
        self._open: dict[str, Any] | None = None

    def feed(self, out: OmniRequestOutput) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if out.modality != "text":
            return events
        for piece in self.calls.add((out.details or {}).get("tool_calls") or []):
            if "name" in piece:
                events += self.close("completed")
                item = {"type": "function_call", "id": _new_id("fc"), "call_id": piece["id"], "name": piece["name"],
                        "arguments": "", "status": "in_progress"}
                self._call_items[piece["index"]] = item
                events += self._start(item)
            elif "arguments" in piece:
                item = self._call_items[piece["index"]]
                item["arguments"] += piece["arguments"]
                events.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                               "output_index": self.items.index(item), "delta": piece["arguments"]})
        if out.text_delta:
            if self._open is None or self._open["type"] != "message":
                events += self.close("completed")
                events += self._start({"type": "message", "id": _new_id("msg"), "status": "in_progress",
                                       "role": "assistant", "content": []})
            message = self._open
            assert message is not None
            if not message["content"]:
                message["content"].append({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
                events.append({"type": "response.content_part.added", "item_id": message["id"],
                               "output_index": len(self.items) - 1, "content_index": 0,
                               "part": copy.deepcopy(message["content"][0])})
            message["content"][0]["text"] += out.text_delta
            events.append({"type": "response.output_text.delta", "item_id": message["id"],
                           "output_index": len(self.items) - 1, "content_index": 0, "delta": out.text_delta,
                           "logprobs": []})
        return events

    def _start(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.items.append(item)
        self._open = item
        return [{"type": "response.output_item.added", "output_index": len(self.items) - 1,
                 "item": copy.deepcopy(item)}]

    def close(self, status: str) -> list[dict[str, Any]]:
        """End the item being written (``status``: completed or incomplete)."""
        item, self._open = self._open, None
        if item is None:
            return []
        index = self.items.index(item)
        item["status"] = status
        events: list[dict[str, Any]] = []
        if item["type"] == "function_call":
            events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                           "output_index": index, "name": item["name"], "arguments": item["arguments"]})
        elif item["content"]:
            part = item["content"][0]
            events.append({"type": "response.output_text.done", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "text": part["text"], "logprobs": []})
            events.append({"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "part": copy.deepcopy(part)})
        events.append({"type": "response.output_item.done", "output_index": index, "item": copy.deepcopy(item)})
        return events

    def finish(self, status: str) -> list[dict[str, Any]]:
        """The last events: the open item ended; an answer with no words and no calls still has its (empty)
        message."""
        events = self.close(status)
        if not self.items:
            events += self._start({"type": "message", "id": _new_id("msg"), "status": "in_progress",
                                   "role": "assistant", "content": [{"type": "output_text", "text": "",
                                                                     "annotations": [], "logprobs": []}]})
            events += self.close(status)
        return events


def _usage(metrics: RequestMetrics | None) -> dict[str, Any]:
    prompt = metrics.num_prompt_tokens if metrics is not None else 0
    tokens = metrics.num_output_tokens if metrics is not None else 0
    cached = metrics.num_cached_tokens if metrics is not None else 0
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": tokens,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + tokens}


@dataclass
class _Answer:
    """One response being made: its id, the request's settings, its items so far."""

    response_id: str
    model: str
    plan: ResponsesPlan
    created_at: int = field(default_factory=lambda: int(time.time()))
    output: OutputItems = field(default_factory=OutputItems)

    def response(self, status: str, usage: dict[str, Any] | None = None, error: dict[str, Any] | None = None,
                 incomplete: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"id": self.response_id, "object": "response", "created_at": self.created_at, "status": status,
                "model": self.model, "output": copy.deepcopy(self.output.items), "usage": usage, "error": error,
                "incomplete_details": incomplete, **self.plan.echo}

    def end(self, final: OmniRequestOutput | None, store: ResponseStore) -> tuple[list[dict[str, Any]],
                                                                                   dict[str, Any]]:
        """The closing events and the finished response (kept in ``store`` when the request asked)."""
        incomplete = final is not None and final.finish_reason == "length"
        status = "incomplete" if incomplete else "completed"
        events = self.output.finish(status)
        response = self.response(status, _usage(final.metrics if final else None),
                                 incomplete={"reason": "max_output_tokens"} if incomplete else None)
        if self.plan.echo["store"]:
            store.put(response, self.plan.items + copy.deepcopy(self.output.items))
        return events, response


async def _complete(outputs: AsyncIterator[OmniRequestOutput], first: OmniRequestOutput | None, answer: _Answer,
                    metrics: ServerMetrics, store: ResponseStore) -> JSONResponse:
    final = first
    try:
        async for out in with_first(first, outputs):
            final = out
            answer.output.feed(out)
    except Exception as exc:  # noqa: BLE001 - mapped to an API error
        raise from_engine_error(exc, answer.plan.field_map) from None
    metrics.observe(ENDPOINT, final.metrics if final else None)
    _, response = answer.end(final, store)
    return JSONResponse(response)


def _event(event: dict[str, Any], sequence_number: int) -> bytes:
    data = json.dumps({**event, "sequence_number": sequence_number}, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


async def _stream(outputs: AsyncIterator[OmniRequestOutput], first: OmniRequestOutput | None, answer: _Answer,
                  metrics: ServerMetrics, store: ResponseStore) -> AsyncIterator[bytes]:
    """The answer as typed server-sent events. A failure after the stream started ends it with an ``error`` event
    and ``response.failed``, never with ``response.completed``."""
    sequence = 0

    def emit(event: dict[str, Any]) -> bytes:
        nonlocal sequence
        sequence += 1
        return _event(event, sequence - 1)

    final = first
    try:
        yield emit({"type": "response.created", "response": answer.response("in_progress")})
        yield emit({"type": "response.in_progress", "response": answer.response("in_progress")})
        async for out in with_first(first, outputs):
            final = out
            for event in answer.output.feed(out):
                yield emit(event)
        metrics.observe(ENDPOINT, final.metrics if final else None)
        events, response = answer.end(final, store)
        for event in events:
            yield emit(event)
        done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        yield emit({"type": done, "response": response})
    except Exception as exc:  # noqa: BLE001 - the response has started: an error event ends the stream
        error = from_engine_error(exc, answer.plan.field_map)
        yield emit({"type": "error", "code": error.code, "message": error.message, "param": error.param})
        yield emit({"type": "response.failed", "response": answer.response(
            "failed", error={"code": error.code or "server_error", "message": error.message})})
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]


def _store(request: Request) -> ResponseStore:
    store: ResponseStore = request.app.state.response_store
    return store


@router.post(ENDPOINT, response_model=ResponseObject, responses=_ERRORS)
async def create_response(body: ResponsesRequest, request: Request) -> Any:
    pool: EnginePool = request.app.state.pool
    metrics: ServerMetrics = request.app.state.metrics
    store = _store(request)
    pool.check_model(body.model, "chat")
    engine: AsyncOmni
    engine, pipeline = await pool.engine_for("chat")
    plan = plan_response(body, pipeline, store)
    answer = _Answer(_new_id("resp"), body.model, plan)
    outputs = engine.generate(plan.prompt, request_id=answer.response_id, sampling_params=plan.sampling_params,
                              output_modalities=["text"])
    first = await first_output(request, outputs, plan.field_map)
    if not body.stream:
        try:
            return await while_connected(request, _complete(outputs, first, answer, metrics, store))
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]
    return ClosingStreamingResponse(_stream(outputs, first, answer, metrics, store), media_type="text/event-stream",
                                    headers=SSE_HEADERS)


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"response_id: no stored response {response_id!r} on this server (unknown, deleted, "
                    "evicted or made with store: false)", param="response_id", code="response_not_found")


@router.get(ENDPOINT + "/{response_id}", response_model=ResponseObject, responses=_ERRORS)
async def retrieve_response(response_id: str, request: Request) -> Any:
    stored = _store(request).get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return JSONResponse(stored.response)


@router.delete(ENDPOINT + "/{response_id}", response_model=ResponseDeleted, responses=_ERRORS)
async def delete_response(response_id: str, request: Request) -> ResponseDeleted:
    if not _store(request).delete(response_id):
        raise _not_found(response_id)
    return ResponseDeleted(id=response_id)


__all__ = ["OutputItems", "plan_response", "router"]
