"""Validate what a caller passes as a prompt before it reaches a pipeline's prompt processor."""

from __future__ import annotations

import json
import re
from typing import Any

from omnipipe.util.field_error import FieldError

MM_KEYS = ("audio", "image", "video")
HISTORY_ROLES = ("system", "user", "assistant", "tool")  # "system" also carries OpenAI's "developer" messages
MAX_TOOLS = 128
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names


def check_unicode(text: str, field: str) -> None:
    """Refuse a string that is not Unicode text (a lone surrogate, which JSON's ``\\ud800`` escapes can carry):
    it cannot be encoded as UTF-8, so no tokenizer, phonemizer or wire message could take it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FieldError(field, f"is not valid Unicode text: a lone surrogate {text[exc.start]!r} at "
                         f"position {exc.start}") from None


def check_history(history: Any, takes_history: bool) -> list[dict[str, Any]]:
    """The conversation before the question: ``[{"role": "system"|"user"|"assistant"|"tool", "content": str},
    ...]``. An assistant turn may carry the tool calls it made (``tool_calls``: ``[{"id", "name", "arguments"}]``,
    arguments a JSON object's text); a ``tool`` turn is a call's result and names it (``tool_call_id``)."""
    if history is None:
        return []
    if not isinstance(history, list):
        raise FieldError("prompt.history",
                         f"must be a list of {{'role', 'content'}} dicts, got {type(history).__name__}")
    out: list[dict[str, Any]] = []
    calls: set[str] = set()
    for i, turn in enumerate(history):
        where = f"prompt.history[{i}]"
        allowed = {"role", "content", "tool_calls", "tool_call_id"}
        if not isinstance(turn, dict) or not {"role", "content"} <= set(turn) <= allowed:
            raise FieldError(where, "must be a dict with 'role' and 'content' (and 'tool_calls' for an assistant "
                             "turn, 'tool_call_id' for a tool turn)")
        if turn["role"] not in HISTORY_ROLES:
            raise FieldError(f"{where}.role", f"must be one of {', '.join(HISTORY_ROLES)}, got {turn['role']!r}")
        if not isinstance(turn["content"], str):
            raise FieldError(f"{where}.content", f"must be a string, got {type(turn['content']).__name__}")
        check_unicode(turn["content"], f"{where}.content")
        checked: dict[str, Any] = {"role": turn["role"], "content": turn["content"]}
        if turn.get("tool_calls"):
            if turn["role"] != "assistant":
                raise FieldError(f"{where}.tool_calls", "only an assistant turn makes tool calls")
            checked["tool_calls"] = [_checked_call(call, f"{where}.tool_calls[{j}]")
                                     for j, call in enumerate(turn["tool_calls"])]
            calls.update(call["id"] for call in checked["tool_calls"])
        if turn["role"] == "tool":
            call_id = turn.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in calls:
                raise FieldError(f"{where}.tool_call_id", f"no earlier assistant turn made a tool call with id "
                                 f"{call_id!r}")
            checked["tool_call_id"] = call_id
        elif "tool_call_id" in turn:
            raise FieldError(f"{where}.tool_call_id", "only a tool turn answers a tool call")
        out.append(checked)
    if out and not takes_history:
        raise FieldError("prompt.history", "this pipeline answers one question at a time: it does not take "
                         "earlier turns or system instructions")
    return out


def _checked_call(call: Any, where: str) -> dict[str, str]:
    if not isinstance(call, dict) or set(call) != {"id", "name", "arguments"}:
        raise FieldError(where, "must be a dict with exactly 'id', 'name' and 'arguments'")
    for key in ("id", "name", "arguments"):
        if not isinstance(call[key], str) or not call[key]:
            raise FieldError(f"{where}.{key}", "must be a non-empty string")
    try:
        arguments = json.loads(call["arguments"])
    except ValueError:
        raise FieldError(f"{where}.arguments", "must be a JSON object's text") from None
    if not isinstance(arguments, dict):
        raise FieldError(f"{where}.arguments", "must be a JSON object's text")
    return {"id": call["id"], "name": call["name"], "arguments": call["arguments"]}


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """Functions the model may call: ``[{"name", "description"?, "parameters"?}]`` (``parameters`` a JSON schema
    of an object), names unique."""
    if tools is None:
        return []
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise FieldError("prompt.tools", f"must be a list of at most {MAX_TOOLS} tools")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"prompt.tools[{i}]"
        if not isinstance(tool, dict) or not {"name"} <= set(tool) <= {"name", "description", "parameters"}:
            raise FieldError(where, "must be a dict with 'name' and optionally 'description' and 'parameters'")
        name = tool["name"]
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise FieldError(f"{where}.name", "must be 1-64 letters, digits, underscores or dashes, got "
                             f"{name!r}")
        if name in seen:
            raise FieldError(f"{where}.name", f"{name!r} is given twice; tool names must be unique")
        seen.add(name)
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise FieldError(f"{where}.description", "must be a string")
        parameters = tool.get("parameters")
        if parameters is not None and (not isinstance(parameters, dict)
                                       or parameters.get("type", "object") != "object"):
            raise FieldError(f"{where}.parameters", "must be a JSON schema of an object")
        out.append({key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None})
    return out


def normalize_prompt(prompt: Any, accepted: tuple[str, ...], takes_history: bool = False,
                     takes_tools: bool = False) -> dict[str, Any]:
    """Return ``{"prompt": str, "multi_modal_data": {...}, "history": [...]}`` or raise FieldError naming the
    field. ``history`` holds the turns before the question (system instructions, earlier questions and answers)
    for a pipeline whose prompt processor reads them (``PipelineSpec.takes_history``)."""
    if isinstance(prompt, str):
        prompt = {"prompt": prompt}
    if not isinstance(prompt, dict):
        raise FieldError("prompt", "must be a string or a dict with 'prompt', 'multi_modal_data' and 'history', "
                         f"got {type(prompt).__name__}")
    unknown = sorted(set(prompt) - {"prompt", "multi_modal_data", "history", "tools"})
    if unknown:
        raise FieldError(f"prompt.{unknown[0]}", "unknown key (expected 'prompt', 'multi_modal_data', 'history', "
                         "'tools')")
    history = check_history(prompt.get("history"), takes_history)
    tools = check_tools(prompt.get("tools"))
    if tools and not takes_tools:
        raise FieldError("prompt.tools", "this pipeline's model calls no tools")
    text = prompt.get("prompt", "")
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise FieldError("prompt.prompt", f"must be a string, got {type(text).__name__}")
    check_unicode(text, "prompt")
    mm = prompt.get("multi_modal_data") or {}
    if not isinstance(mm, dict):
        raise FieldError("prompt.multi_modal_data", f"must be a dict, got {type(mm).__name__}")
    for key in mm:
        if key not in MM_KEYS:
            raise FieldError(f"prompt.multi_modal_data.{key}",
                             f"unknown modality (expected one of {', '.join(MM_KEYS)})")
        if key not in accepted:
            raise FieldError(f"prompt.multi_modal_data.{key}", f"this pipeline does not accept {key} input "
                             f"(it accepts {', '.join(accepted)})")
    if "text" not in accepted and text:
        raise FieldError("prompt.prompt",
                         f"this pipeline does not accept text input (it accepts {', '.join(accepted)})")
    answers_a_call = bool(history) and history[-1]["role"] == "tool"  # the model goes on from a tool's result
    if not text.strip() and not mm and not answers_a_call:
        raise FieldError("prompt", "is empty (give text or multi_modal_data)")
    normalized = {"prompt": text, "multi_modal_data": dict(mm), "history": history}
    if tools:
        normalized["tools"] = tools
    return normalized
