"""The sessions a server holds, its capacity, and the state it reports on ``/health`` (the worker protocol,
whose shapes and codes live in ``omnipipe.protocol.worker``).

A session is one HTTP request to a model endpoint (chat completions, responses, audio speech, audio
transcriptions), from its arrival at the model routes until its response body has been sent or the client went
away, or one realtime WebSocket from accept to close. A realtime session may be paused (``session.pause``).
Beyond ``capacity`` (``None``: unlimited) a new HTTP session is answered 429 (code ``worker_at_capacity``,
``Retry-After``) by ``SessionLimiter``; the realtime route refuses a WebSocket itself (``error`` event, close 1013).

Everything here runs on the server's event loop, so counting needs no lock.
"""

from __future__ import annotations

from typing import Literal

from omnipipe.protocol.errors import RETRY_AFTER_S, APIError
from omnipipe.protocol.worker import (
    AT_CAPACITY,
    CHAT_PATH,
    RESPONSES_PATH,
    SPEECH_PATH,
    TRANSCRIPTION_PATH,
    SessionCounts,
    WorkerState,
)
from omnipipe.server.guard import ASGIApp, Message, Receive, Scope, Send
from omnipipe.util.field_error import FieldError

SessionKind = Literal["http", "realtime"]
MODEL_ENDPOINTS = frozenset({CHAT_PATH, RESPONSES_PATH, SPEECH_PATH, TRANSCRIPTION_PATH})


def at_capacity_error(capacity: int | None) -> APIError:
    return APIError(429, f"the worker is at capacity ({capacity} session{'s' if capacity != 1 else ''} at once); "
                    "retry later", code=AT_CAPACITY, headers={"Retry-After": str(RETRY_AFTER_S)})


class Session:
    """One counted session; ``close()`` gives its slot back (idempotent)."""

    def __init__(self, tracker: SessionTracker, kind: SessionKind) -> None:
        self.tracker = tracker
        self.kind: SessionKind = kind
        self.paused = False
        self.closed = False

    def pause(self) -> None:
        """Mark a realtime session paused (idempotent)."""
        if self.kind != "realtime":
            raise ValueError("only realtime sessions can be paused")
        if not self.closed and not self.paused:
            self.paused = True
            self.tracker._paused += 1

    def resume(self) -> None:
        if not self.closed and self.paused:
            self.paused = False
            self.tracker._paused -= 1

    def close(self) -> None:
        if self.closed:
            return
        self.resume()
        self.closed = True
        self.tracker._open[self.kind] -= 1


class SessionTracker:
    """Counts open sessions against ``capacity`` and derives the worker state from them and the engine status."""

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise FieldError("capacity", f"must be an integer >= 1 or None, got {capacity!r}")
        self.capacity = capacity
        self._open: dict[SessionKind, int] = {"http": 0, "realtime": 0}
        self._paused = 0

    @property
    def http(self) -> int:
        return self._open["http"]

    @property
    def realtime(self) -> int:
        return self._open["realtime"]

    @property
    def paused(self) -> int:
        return self._paused

    @property
    def active(self) -> int:
        """Open sessions of either kind (paused realtime sessions included: they hold their slot)."""
        return self.http + self.realtime

    def has_room(self) -> bool:
        return self.capacity is None or self.active < self.capacity

    def open(self, kind: SessionKind) -> Session | None:
        """Count a new session, or ``None`` if the server is at capacity."""
        if not self.has_room():
            return None
        self._open[kind] += 1
        return Session(self, kind)

    def counts(self) -> SessionCounts:
        return {"http": self.http, "realtime": self.realtime, "paused": self.paused}

    def state(self, engine_status: str = "ready") -> WorkerState:
        """The reported state; ``engine_status`` is the main pipeline's (``idle|loading|ready|degraded|failed``)."""
        if engine_status in ("failed", "degraded"):
            return WorkerState.ERROR
        if engine_status != "ready":
            return WorkerState.LOADING
        if self.realtime:
            return WorkerState.DUPLEX_PAUSED if self.paused == self.realtime else WorkerState.DUPLEX_ACTIVE
        return WorkerState.BUSY if self.http else WorkerState.IDLE


class SessionLimiter:
    """ASGI middleware counting each POST to a model endpoint as an HTTP session, refusing it beyond capacity.

    The slot is given back just before the last body message is sent (so a client that read the whole answer
    finds it free), or when the app returns (an error, or a streaming response stopped by a disconnect).
    """

    def __init__(self, app: ASGIApp, *, tracker: SessionTracker) -> None:
        self.app = app
        self.tracker = tracker

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in MODEL_ENDPOINTS:
            await self.app(scope, receive, send)
            return
        session = self.tracker.open("http")
        if session is None:
            await at_capacity_error(self.tracker.capacity).response()(scope, receive, send)
            return

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                session.close()
            await send(message)

        try:
            await self.app(scope, receive, closing_send)
        finally:
            session.close()
