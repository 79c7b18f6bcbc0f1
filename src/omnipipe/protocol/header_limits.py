"""Request-header limits for every omnipipe HTTP server (worker and gateway): too many headers, or too many
header bytes, is answered 431 with OpenAI's error object before any route runs (a WebSocket handshake is refused).

uvicorn's h11 parser bounds only a header block that arrives in pieces; one that arrives whole is parsed however
large it is, so the limit is kept here, once, for both servers. The parser's own bound (PARSER_HEADER_BLOCK_BYTES,
given to uvicorn by both servers) sits well above it, so that a block past our limit gets the same 431 whether it
arrived in one read or in several; only a block past the parser's bound is cut with uvicorn's plain 400.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from omnipipe.protocol.errors import APIError

MAX_HEADERS = 100  # header lines per request
MAX_HEADER_BYTES = 32 * 1024  # names and values together
PARSER_HEADER_BLOCK_BYTES = 256 * 1024  # uvicorn's h11_max_incomplete_event_size (its default, 16 KiB, is below ours)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def header_problem(headers: list[tuple[bytes, bytes]], max_headers: int, max_header_bytes: int) -> str | None:
    """Why ``headers`` break the limits, or None."""
    if len(headers) > max_headers:
        return f"too many request headers: {len(headers)} (at most {max_headers})"
    size = sum(len(name) + len(value) for name, value in headers)
    if size > max_header_bytes:
        return f"request headers too large: {size} bytes (at most {max_header_bytes})"
    return None


class HeaderLimits:
    """ASGI middleware: 431 ``request_headers_too_large`` for an HTTP request beyond the limits; a WebSocket
    handshake beyond them is closed before it is accepted (clients see 403)."""

    def __init__(self, app: ASGIApp, *, max_headers: int = MAX_HEADERS,
                 max_header_bytes: int = MAX_HEADER_BYTES) -> None:
        self.app = app
        self.max_headers = max_headers
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        problem = header_problem(list(scope.get("headers", [])), self.max_headers, self.max_header_bytes)
        if problem is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await APIError(431, problem, code="request_headers_too_large").response()(scope, receive, send)
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": problem[:120]})
