"""Request and response bodies of OpenAI's Responses API, ``POST /v1/responses`` (pydantic models, strict types).

The request is closed like a chat request (``protocol/openai.py``): a field omnipipe does not implement is a 400
naming it. Accepted without effect: the fields that cannot change the answer (``user``, ``service_tier``,
``prompt_cache_key``, ``safety_identifier``, ``text.verbosity``) and the off values of features omnipipe lacks
(``include: []``, ``background: false``, ``truncation: "disabled"``, ``top_logprobs: 0``, ``reasoning: null``).

The answer's shapes (``Response``, its output items, the stream's events) are built as plain dicts by the route;
the models below document them for the OpenAPI schema and are what the tests read with the ``openai`` package.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

_STRICT = ConfigDict(strict=True, extra="ignore")
_CLOSED = ConfigDict(strict=True, extra="forbid")


# ---------------------------------------------------------------------------------------------- input items
class InputText(BaseModel):
    model_config = _CLOSED
    type: Literal["input_text"]
    text: str


class InputImage(BaseModel):
    model_config = _CLOSED
    type: Literal["input_image"]
    image_url: str = Field(description="data:image/<type>;base64,<data> (nothing is fetched)")
    detail: Literal["low", "high", "auto"] | None = None


class OutputText(BaseModel):
    """An assistant's earlier words, as an answer gave them (sent back as input)."""

    model_config = _CLOSED
    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


InputContent = Annotated[InputText | InputImage | OutputText, Field(discriminator="type")]


class MessageItem(BaseModel):
    """A message: ``type`` may be left out (the "easy" form), ``id`` and ``status`` are what an answer's own
    message items carry when sent back."""

    model_config = _CLOSED
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputContent]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallItem(BaseModel):
    """A call the model made (from an earlier answer)."""

    model_config = _CLOSED
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(BaseModel):
    """The result of a call, named by its ``call_id``."""

    model_config = _CLOSED
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


def _item_type(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("type", "message"))
    return str(getattr(value, "type", "message"))


InputItem = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                      | Annotated[FunctionCallOutputItem, Tag("function_call_output")], Discriminator(_item_type)]


# ---------------------------------------------------------------------------------------------- tools, formats
class FunctionTool(BaseModel):
    """A function the model may call, in the Responses API's flat shape."""

    model_config = _CLOSED
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # the arguments always follow the schema here (constrained decoding)


class FunctionChoice(BaseModel):
    """``tool_choice`` naming the one function to call (read by the route from the request's object, so that a
    problem in it is named ``tool_choice.<field>``)."""

    model_config = _CLOSED
    type: Literal["function"]
    name: str = Field(min_length=1)


class TextFormat(BaseModel):
    """``text.format``: ``text``, ``json_object``, or ``json_schema`` with its ``name`` and ``schema`` (one shape
    for the three, so a problem is named ``text.format.<field>``; the route checks what each type needs)."""

    model_config = _CLOSED
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, min_length=1, max_length=64)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextOptions(BaseModel):
    model_config = _CLOSED
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, not used


class StreamOptions(BaseModel):
    model_config = _CLOSED
    include_obfuscation: bool | None = None  # accepted, not used: nothing is obfuscated


class ResponsesRequest(BaseModel):
    model_config = _CLOSED
    model: str = Field(min_length=1)
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None  # or a FunctionChoice
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    metadata: dict[str, str] | None = None
    store: bool = True
    previous_response_id: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # accepted, not used: they cannot change the answer
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # features omnipipe does not have: accepted only off (clients send these by default)
    include: Annotated[list[Any], Field(max_length=0)] | None = None
    background: Literal[False] | None = None
    truncation: Literal["disabled"] | None = None
    top_logprobs: Literal[0] | None = None
    reasoning: None = None


# ---------------------------------------------------------------------------------------------- answer
class ResponseUsage(BaseModel):
    input_tokens: int = 0
    input_tokens_details: dict[str, int] = Field(default_factory=lambda: {"cached_tokens": 0})
    output_tokens: int = 0
    output_tokens_details: dict[str, int] = Field(default_factory=lambda: {"reasoning_tokens": 0})
    total_tokens: int = 0


class ResponseObject(BaseModel):
    """``POST /v1/responses`` (whole) and ``GET /v1/responses/{id}``: ``output`` holds ``message`` items (with
    ``output_text`` parts) and ``function_call`` items (``id``, ``call_id``, ``name``, ``arguments``,
    ``status``)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    model: str
    output: list[dict[str, Any]]
    usage: ResponseUsage | None = None
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] = Field(default_factory=dict)
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    previous_response_id: str | None = None
    store: bool = True
    user: str | None = None


class ResponseDeleted(BaseModel):
    """``DELETE /v1/responses/{id}``."""

    id: str
    object: Literal["response"] = "response"
    deleted: bool = True
