"""Options dataclasses from plain dicts (deploy YAML, per-request overrides), with errors naming the key."""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any, TypeVar

from omnipipe.util.field_error import FieldError

T = TypeVar("T")


@dataclass(frozen=True)
class NoOptions:
    """The schema of something that takes no options: any key is refused."""


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
            expected = f"expected one of: {', '.join(known)}" if known else "none are taken here"
            raise FieldError(f"{field}.{key}", f"unknown option ({expected})")
    try:
        return schema(**raw)
    except FieldError as exc:
        raise exc.renamed(f"{field}.{exc.field}") from None
