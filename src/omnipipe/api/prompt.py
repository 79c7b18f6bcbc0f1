"""Validate what a caller passes as a prompt before it reaches a pipeline's prompt processor."""

from __future__ import annotations

from typing import Any

from omnipipe.util.field_error import FieldError

MM_KEYS = ("audio", "image", "video")
HISTORY_ROLES = ("system", "user", "assistant")  # "system" also carries OpenAI's "developer" messages


def check_unicode(text: str, field: str) -> None:
    """Refuse a string that is not Unicode text (a lone surrogate, which JSON's ``\\ud800`` escapes can carry):
    it cannot be encoded as UTF-8, so no tokenizer, phonemizer or wire message could take it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FieldError(field, f"is not valid Unicode text: a lone surrogate {text[exc.start]!r} at "
                         f"position {exc.start}") from None


def check_history(history: Any, takes_history: bool) -> list[dict[str, str]]:
    """The conversation before the question: ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``."""
    if history is None:
        return []
    if not isinstance(history, list):
        raise FieldError("prompt.history",
                         f"must be a list of {{'role', 'content'}} dicts, got {type(history).__name__}")
    out: list[dict[str, str]] = []
    for i, turn in enumerate(history):
        where = f"prompt.history[{i}]"
        if not isinstance(turn, dict) or set(turn) != {"role", "content"}:
            raise FieldError(where, "must be a dict with exactly 'role' and 'content'")
        if turn["role"] not in HISTORY_ROLES:
            raise FieldError(f"{where}.role", f"must be one of {', '.join(HISTORY_ROLES)}, got {turn['role']!r}")
        if not isinstance(turn["content"], str):
            raise FieldError(f"{where}.content", f"must be a string, got {type(turn['content']).__name__}")
        check_unicode(turn["content"], f"{where}.content")
        out.append({"role": turn["role"], "content": turn["content"]})
    if out and not takes_history:
        raise FieldError("prompt.history", "this pipeline answers one question at a time: it does not take "
                         "earlier turns or system instructions")
    return out


def normalize_prompt(prompt: Any, accepted: tuple[str, ...], takes_history: bool = False) -> dict[str, Any]:
    """Return ``{"prompt": str, "multi_modal_data": {...}, "history": [...]}`` or raise FieldError naming the
    field. ``history`` holds the turns before the question (system instructions, earlier questions and answers)
    for a pipeline whose prompt processor reads them (``PipelineSpec.takes_history``)."""
    if isinstance(prompt, str):
        prompt = {"prompt": prompt}
    if not isinstance(prompt, dict):
        raise FieldError("prompt", "must be a string or a dict with 'prompt', 'multi_modal_data' and 'history', "
                         f"got {type(prompt).__name__}")
    unknown = sorted(set(prompt) - {"prompt", "multi_modal_data", "history"})
    if unknown:
        raise FieldError(f"prompt.{unknown[0]}", "unknown key (expected 'prompt', 'multi_modal_data', 'history')")
    history = check_history(prompt.get("history"), takes_history)
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
    if not text.strip() and not mm:
        raise FieldError("prompt", "is empty (give text or multi_modal_data)")
    return {"prompt": text, "multi_modal_data": dict(mm), "history": history}
