"""The HTTP versions every omnipipe HTTP server (worker and gateway) answers: a request in any other is refused with
505 ``http_version_not_supported`` (OpenAI's error object) before any route runs; a WebSocket handshake is refused.

uvicorn's h11 parser takes any ``HTTP/<digit>.<digit>`` request line (``HTTP/9.9``, ``HTTP/0.9``, ``HTTP/2.0`` as
plain text) and hands the version on in ``scope["http_version"]`` as written, so the check is kept here, once, for
both servers. ``"2"`` is what an ASGI server puts there for real HTTP/2 (uvicorn over TLS with ALPN).
"""

from __future__ import annotations

from omnipipe.protocol.errors import INVALID_REQUEST, APIError
from omnipipe.protocol.header_limits import ASGIApp, Receive, Scope, Send

SUPPORTED_HTTP_VERSIONS = frozenset({"1.0", "1.1", "2"})  # the values the ASGI spec allows in scope["http_version"]


class HTTPVersionCheck:
    """ASGI middleware: 505 for an HTTP request in a version other than ``SUPPORTED_HTTP_VERSIONS``; a WebSocket
    handshake in one is closed before it is accepted (clients see 403)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = scope.get("http_version", "1.1")  # the ASGI default
        if scope["type"] not in ("http", "websocket") or version in SUPPORTED_HTTP_VERSIONS:
            await self.app(scope, receive, send)
            return
        problem = f"HTTP version not supported: {str(version)[:16]!r} (use HTTP/1.1)"
        if scope["type"] == "http":
            refusal = APIError(505, problem, code="http_version_not_supported", type=INVALID_REQUEST,
                               headers={"Connection": "close"})
            await refusal.response()(scope, receive, send)
        else:
            await send({"type": "websocket.close", "code": 1002, "reason": problem[:120]})
