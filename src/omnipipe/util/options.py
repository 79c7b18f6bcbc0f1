"""Options dataclasses from plain dicts (deploy YAML, per-request overrides), with errors naming the key."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

from omnipipe.util.field_error import FieldError

T = TypeVar("T")


def options_from_dict(schema: type[T], raw: Any, field: str) -> T:
    """Build ``schema`` (a dataclass whose ``__post_init__`` raises FieldError per field) from ``raw``.

    Unknown keys are refused, never ignored; every error is renamed under ``field`` (``edges.a->b.options``).
    """
    assert is_dataclass(schema), schema
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise FieldError(field, f"must be a mapping, got {type(raw).__name__}")
    known = [f.name for f in fields(schema)]
    for key in raw:
        if key not in known:
            raise FieldError(f"{field}.{key}", f"unknown option (expected one of: {', '.join(known)})")
    try:
        return schema(**raw)
    except FieldError as exc:
        raise exc.renamed(f"{field}.{exc.field}") from None
