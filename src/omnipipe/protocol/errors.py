"""The OpenAI error object, ``{"error": {"message", "type", "param", "code"}}``, with no engine imports (the gateway
answers with it too, and loads no model)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

INVALID_REQUEST = "invalid_request_error"
RETRY_AFTER_S = 1
_STATUS_TYPES = {401: "authentication_error", 403: "permission_error", 404: INVALID_REQUEST, 405: INVALID_REQUEST,
                 413: INVALID_REQUEST, 415: INVALID_REQUEST, 429: "rate_limit_error", 431: INVALID_REQUEST,
                 503: "server_error"}


class APIError(Exception):
    """An error answered as an OpenAI error object with ``status``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _STATUS_TYPES.get(status, INVALID_REQUEST if status < 500 else "server_error")
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def install_api_error_handlers(app: FastAPI) -> None:
    """Answer ``APIError`` and the router's own 404/405 (and other HTTP exceptions) as OpenAI error objects."""

    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return exc.response()

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        messages = {404: "no such route", 405: "method not allowed on this route"}
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = messages.get(exc.status_code, str(exc.detail))
        return APIError(exc.status_code, message, code=code, headers=exc.headers).response()

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
