"""The ASGI layer in front of the routes: API key, body size limit, content type, and per-endpoint counts.

It runs before FastAPI parses anything, so an oversized, unauthenticated or mistyped body is refused without
being parsed, and every answer (also 401/404/413/415) is counted in the request metrics.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from omnipipe.server.errors import APIError
from omnipipe.server.prometheus import ServerMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON = "application/json"
MULTIPART = "multipart/form-data"
# path -> the content type its POST body must have
BODY_TYPES: dict[str, str] = {
    "/v1/chat/completions": JSON,
    "/v1/responses": JSON,
    "/v1/audio/speech": JSON,
    "/v1/audio/transcriptions": MULTIPART,
}
KNOWN_PATHS = frozenset({*BODY_TYPES, "/v1/models", "/health", "/metrics", "/debug/state", "/openapi.json", "/docs"})
PROTECTED_PREFIXES = ("/v1/", "/debug/")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _media_type(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


class RequestGuard:
    def __init__(self, app: ASGIApp, *, api_key: str | None, max_body_bytes: int, metrics: ServerMetrics) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        endpoint = path if path in KNOWN_PATHS else "other"
        status_seen: list[int] = []

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_seen.append(int(message["status"]))
            await send(message)

        try:
            problem = self._check_headers(scope, path)
            if problem is not None:
                await self._answer(problem, counting_send)
                return
            if scope.get("method") in ("POST", "PUT", "PATCH"):
                body = await self._read_body(receive)
                if isinstance(body, APIError):
                    await self._answer(body, counting_send)
                    return
                receive = self._replay(body, receive)
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.count_request(endpoint, status_seen[0] if status_seen else 499)

    def _check_headers(self, scope: Scope, path: str) -> APIError | None:
        if self.api_key is not None and path.startswith(PROTECTED_PREFIXES):
            auth = _header(scope, b"authorization") or ""
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
                message = "missing API key (send Authorization: Bearer KEY)" if not auth else "invalid API key"
                return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        length = _header(scope, b"content-length")
        if length is not None:
            if not length.strip().isdigit():
                return APIError(400, "content-length: not a number", param="content-length")
            if int(length) > self.max_body_bytes:
                return self._too_large()
        expected = BODY_TYPES.get(path)
        if expected is not None and scope.get("method") == "POST":
            got = _media_type(_header(scope, b"content-type"))
            if got != expected:
                return APIError(415, f"content-type: expected {expected}, got {got or 'none'}", param="content-type",
                                code="unsupported_media_type")
        return None

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than {self.max_body_bytes} bytes", code="body_too_large")

    async def _read_body(self, receive: Receive) -> bytes | APIError:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return APIError(400, "the client disconnected while sending the body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    @staticmethod
    def _replay(body: bytes, receive: Receive) -> Receive:
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay

    @staticmethod
    async def _answer(error: APIError, send: Send) -> None:
        payload = json.dumps(error.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
