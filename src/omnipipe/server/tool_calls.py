"""Tools, tool choice and structured output as every endpoint takes them (chat completions, the Responses API,
realtime sessions), in the engine's terms; and the tool calls of an answer put back together from its stream.

An endpoint hands the engine the functions as ``prompt.tools`` (``[{"name", "description", "parameters"}]``) and
the choices as the thinker's ``SamplingParams`` (``tool_choice``, ``parallel_tool_calls``, ``response_format``,
``logprobs``); the thinker's grammar (``stage/structured_output.py``) makes every call's arguments follow their
schema. The model's calls come back as ``details["tool_calls"]`` pieces on text events: ``ToolCalls`` gathers
them and gives each call its ``call_...`` id."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.server.errors import invalid
from omnipipe.stage.structured_output import GrammarError, check_schema


def function_tools(tools: list[tuple[str, str | None, dict[str, Any] | None]], where: str) -> list[dict[str, Any]]:
    """The functions offered, each ``(name, description, parameters)`` with ``where.format(i)`` its API field
    (``tools[{}].function``): a 400 naming a name given twice or parameters the grammar engine refuses."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, (name, description, parameters) in enumerate(tools):
        here = where.format(i)
        if name in seen:
            raise invalid(f"{here}.name: {name!r} is given twice; tool names must be unique", f"{here}.name")
        seen.add(name)
        if parameters is not None:
            if parameters.get("type", "object") != "object":
                raise invalid(f"{here}.parameters: must be a JSON schema of an object", f"{here}.parameters")
            try:
                check_schema(parameters, f"{here}.parameters")
            except GrammarError as exc:
                raise invalid(str(exc), exc.field, code="invalid_schema") from None
        tool: dict[str, Any] = {"name": name}
        if description is not None:
            tool["description"] = description
        if parameters is not None:
            tool["parameters"] = parameters
        out.append(tool)
    return out


def tool_choice(choice: Any, tools: list[dict[str, Any]], where: str = "tool_choice",
                named: str | None = None, named_field: str | None = None) -> str | dict[str, str]:
    """``none`` / ``auto`` / ``required``, or the one function to call (``named``: its name, from the endpoint's
    own shape, whose API field ``named_field`` is); a 400 naming the field for a function that is not among the
    tools, or ``required`` without tools."""
    if named is not None:
        if named not in {tool["name"] for tool in tools}:
            field_ = named_field or (f"{where}.function.name" if where == "tool_choice" else f"{where}.name")
            raise invalid(f"{field_}: no tool named {named!r} (tools: "
                          f"{', '.join(t['name'] for t in tools) or 'none given'})", field_)
        return {"name": named}
    value = choice or "auto"
    if value == "required" and not tools:
        raise invalid(f"{where}: 'required' needs at least one tool", where)
    return str(value)


def offered_tools(pipeline: PipelineSpec, model: str, tools: list[tuple[str, str | None, dict[str, Any] | None]],
                  where: str, choice: Any, named: str | None, named_field: str,
                  parallel: bool | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A request's tools (``function_tools``' form and ``where``) and its choice among them (``choice``: the API's
    value, ``named``: the one function it names, at ``named_field``): the prompt's ``tools`` and the thinker's
    sampling fields (``tool_choice``, ``parallel_tool_calls``). A pipeline with no tool-call format refuses
    tools and a choice that would call one; a choice other than ``none`` needs tools."""
    fields: dict[str, Any] = {}
    offered: list[dict[str, Any]] = []
    for name, asked in (("tools", bool(tools)), ("tool_choice", choice not in (None, "none", "auto"))):
        if asked and not pipeline.takes_tools:
            raise invalid(f"{name}: model {model!r} calls no tools (its pipeline {pipeline.name!r} has no tool-call "
                          "format)", name, code="unsupported_parameter")
    if tools:
        offered = function_tools(tools, where)
    if choice is not None and not offered and choice != "none":
        raise invalid("tool_choice: given without tools", "tool_choice")
    if offered:
        fields["tool_choice"] = tool_choice(None if named else choice, offered, named=named, named_field=named_field)
        if parallel is not None:
            fields["parallel_tool_calls"] = parallel
    return offered, fields


def check_arguments(arguments: str, where: str) -> None:
    """A call's ``arguments`` (at API field ``where``) must be a JSON object's text."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        raise invalid(f"{where}: must be a JSON object's text", where) from None
    if not isinstance(parsed, dict):
        raise invalid(f"{where}: must be a JSON object's text", where)


def structured_format(kind: str | None, schema: dict[str, Any] | None, where: str) -> dict[str, Any] | None:
    """``response_format`` in the engine's terms: None (text), any JSON object, or JSON of ``schema`` (a 400 naming
    ``where`` when the grammar engine cannot compile it)."""
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if schema is None:
        raise invalid(f"{where}: a json_schema format needs its schema", where)
    try:
        check_schema(schema, where)
    except GrammarError as exc:
        raise invalid(str(exc), exc.field, code="invalid_schema") from None
    return {"type": "json_schema", "schema": schema}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCalls:
    """An answer's tool calls, gathered from the ``details["tool_calls"]`` pieces of its text events."""

    calls: list[dict[str, str]] = field(default_factory=list)  # {"id", "name", "arguments"}

    def add(self, pieces: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Take a text event's pieces; returns them with each new call's id (``{"index", "id", "name"}``)."""
        out = []
        for piece in pieces:
            index = int(piece["index"])
            if "name" in piece:
                while len(self.calls) <= index:
                    self.calls.append({"id": new_call_id(), "name": "", "arguments": ""})
                self.calls[index]["name"] = piece["name"]
                out.append({"index": index, "id": self.calls[index]["id"], "name": piece["name"]})
            if piece.get("arguments"):
                self.calls[index]["arguments"] += piece["arguments"]
                out.append({"index": index, "arguments": piece["arguments"]})
        return out
