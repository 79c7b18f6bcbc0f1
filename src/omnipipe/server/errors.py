"""The mapping of engine and validation exceptions onto OpenAI error objects (``APIError``, defined in
``api_error.py``): never a 500 for something the caller sent."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from omnipipe.api.async_omni import EngineClosedError, RequestFailedError, StageLostError
from omnipipe.engine.async_omni_engine import EngineOverloadedError
from omnipipe.protocol.errors import RETRY_AFTER_S, APIError, install_api_error_handlers
from omnipipe.server.disconnect import CLIENT_CLOSED_REQUEST, ClientGone
from omnipipe.util.audio import AudioDecodeError
from omnipipe.util.field_error import FieldError

logger = logging.getLogger(__name__)

_UNION_TAG = re.compile(r"^(str|int|float|bool|none|list\[.*\]|dict\[.*\]|tagged-union\[.*\]|literal\[.*\]|function-.*|"
                        r"constrained-.*)$")


def invalid(message: str, param: str | None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def overloaded(message: str) -> APIError:
    return APIError(429, message, code="engine_overloaded", headers={"Retry-After": str(RETRY_AFTER_S)})


def unavailable(message: str, code: str = "engine_unavailable") -> APIError:
    return APIError(503, message, code=code, headers={"Retry-After": str(RETRY_AFTER_S)})


def map_field(field: str | None, field_map: Mapping[str, str]) -> str | None:
    """Rename an engine field to the API field it came from, by longest matching prefix."""
    if field is None:
        return None
    for prefix in sorted(field_map, key=len, reverse=True):
        if field == prefix or field.startswith(prefix + "."):
            return field_map[prefix] + field[len(prefix):]
    return field


def from_engine_error(exc: BaseException, field_map: Mapping[str, str], audio_param: str | None = None) -> APIError:
    """Turn what ``AsyncOmni.generate`` raised into the API error to answer."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, AudioDecodeError):
        return invalid(f"{audio_param or 'audio'}: {exc}", audio_param, code="invalid_audio")
    if isinstance(exc, EngineOverloadedError):
        return overloaded(str(exc))
    if isinstance(exc, EngineClosedError):
        return unavailable(str(exc))
    if isinstance(exc, FieldError):
        param = map_field(exc.field, field_map)
        return invalid(f"{param}: {exc.rule}", param)
    if isinstance(exc, ValueError):  # a caller's mistake that names no field
        return invalid(str(exc), None)
    if isinstance(exc, StageLostError):  # nothing wrong with the request: its stage is being replaced
        return APIError(503, str(exc), code="stage_unavailable", type="server_error",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, RequestFailedError):
        return APIError(500, str(exc), code="request_failed", type="server_error")
    logger.exception("unexpected error", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}", type="server_error", code="internal_error")


def loc_to_param(loc: tuple[Any, ...] | list[Any]) -> str | None:
    """pydantic's error location -> ``messages[0].content[1].input_audio.data``."""
    parts = list(loc)
    if len(parts) == 1 and parts[0] == "body":
        return "body"
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    out = ""
    for i, part in enumerate(parts):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i >= 2 and isinstance(parts[i - 1], int) and str(parts[i - 2]).startswith("list[tagged-union["):
            continue  # the tag of a tagged-union member (the part's "type")
        elif _UNION_TAG.match(str(part)):
            continue  # the member of a union pydantic tried
        else:
            out += ("." if out else "") + str(part)
    return out or None


def from_validation_errors(errors: list[Any]) -> APIError:
    # the deepest location is the most specific (a union reports one error per member it tried)
    first = max(errors, key=lambda e: len(e.get("loc", ()))) if errors else {"loc": (), "msg": "invalid body"}
    if first.get("type") == "json_invalid":
        return invalid(f"the body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}", None,
                       code="invalid_json")
    param = loc_to_param(first.get("loc", ()))
    message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    if first.get("type") == "missing":
        message = f"{param}: required field is missing"
    if first.get("type") == "extra_forbidden":
        message = f"{param}: not supported (omnipipe does not implement this parameter)"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    codes = {"missing": "missing_field", "extra_forbidden": "unsupported_parameter"}
    code = codes.get(first.get("type"), "invalid_value")
    return invalid(message, param, code=code)


def install_error_handlers(app: FastAPI) -> None:
    install_api_error_handlers(app)

    async def request_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, (RequestValidationError, ValidationError))
        return from_validation_errors(list(exc.errors())).response()

    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        return from_engine_error(exc, {}).response()

    async def client_gone(_: Request, exc: Exception) -> Response:
        return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody reads it: the log and the metrics do

    app.add_exception_handler(RequestValidationError, request_validation)
    app.add_exception_handler(ValidationError, request_validation)
    app.add_exception_handler(ClientGone, client_gone)
    app.add_exception_handler(Exception, unexpected)
