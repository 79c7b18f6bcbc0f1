"""Realtime events on the wire: the ids the server gives, a client frame parsed with its dialect's schema,
``EventError``, the refusal a bad client event is answered with (an ``error`` event; the connection stays open),
and the way a part of the session sends events (``Send``, ``SendError``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any, Protocol

from pydantic import TypeAdapter, ValidationError

from omnipipe.protocol.realtime import BETA_CLIENT_EVENT, CLIENT_EVENT, GA
from omnipipe.server.errors import from_validation_errors


class EventError(Exception):
    """A client event the server refuses: answered with an ``error`` event, the connection stays open."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value",
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.type = message, param, code, type


class Send(Protocol):
    """Send a server event (renamed for the beta dialect; nothing once the session is closed)."""

    async def __call__(self, type_: str, **fields: Any) -> None: ...


class SendError(Protocol):
    """Send an ``error`` event (nothing once the session is closed)."""

    async def __call__(self, message: str, *, param: str | None = None, code: str | None = None,
                       type_: str = "invalid_request_error", client_event_id: str | None = None) -> None: ...


def new_event_id() -> str:
    return f"event_{uuid.uuid4().hex[:24]}"


def new_item_id() -> str:
    return f"item_{uuid.uuid4().hex[:24]}"


def parse_event(raw: Any, dialect: str, supported: Iterable[str], schema: TypeAdapter[Any] | None = None) -> Any:
    """A decoded client frame -> its event model (``schema``, else the dialect's in ``protocol.realtime``), or the
    EventError naming the field the schema refuses (an unknown type lists the ``supported`` ones)."""
    if not isinstance(raw, dict):
        raise EventError("the event must be a JSON object", code="invalid_event")
    if schema is None:
        schema = CLIENT_EVENT if dialect == GA else BETA_CLIENT_EVENT
    try:
        return schema.validate_python(raw)
    except ValidationError as exc:
        errors = exc.errors()
    kinds = {error["type"] for error in errors}
    if "union_tag_not_found" in kinds:
        raise EventError("type: required field is missing", "type", code="missing_field")
    if "union_tag_invalid" in kinds:
        raise EventError(f"type: unknown or unsupported event type {raw.get('type')!r} (supported: "
                         f"{', '.join(sorted(supported))})", "type", code="invalid_event_type")
    # every location starts with the event's type (the union's tag)
    error = from_validation_errors([{**e, "loc": tuple(e["loc"][1:])} for e in errors])
    code = "unknown_parameter" if any(e["type"] == "extra_forbidden" for e in errors) else error.code
    raise EventError(error.message, error.param, code=code or "invalid_value")
