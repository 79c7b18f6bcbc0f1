"""``WS /v1/realtime`` through the gateway: a place in the queue, then a WebSocket relay to the assigned worker.

The client first gets ``queued`` (its position, estimated wait and ticket id), ``queue_update`` whenever that
changes, then ``queue_done`` (session id and worker) and from there on the worker's own events. What the client
sends while queued is held (up to ``max_held_bytes``) and forwarded in order. Both directions are fed to the
session's ``RealtimeTap``, which records the conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any
from urllib.parse import urlsplit

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from omnipipe.gateway.apps import AppSwitches
from omnipipe.gateway.live_sessions import LiveSession, LiveSessions
from omnipipe.gateway.pool import QueueFullError, WorkerPool
from omnipipe.gateway.proxy.queue_wait import QUEUE_DONE, QueueWait, retry_at_capacity
from omnipipe.gateway.recording.taps import RealtimeTap
from omnipipe.gateway.worker import Worker
from omnipipe.protocol.errors import APIError
from omnipipe.protocol.realtime import negotiate_dialect
from omnipipe.protocol.worker import (
    CLOSE_ABNORMAL,
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    CLOSE_TRY_AGAIN,
    REALTIME_PATH,
    is_at_capacity,
)

logger = logging.getLogger(__name__)

_FORWARDED_HANDSHAKE_HEADERS = ("authorization", "openai-beta")
_CLIENT_GONE = object()
_CLIENT_LEFT = 0  # not a WebSocket close code: the client went while the worker was still talking


class _Inbox:
    """The client's messages in arrival order, with the bytes held and whether the client has gone."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.held_bytes = 0
        self.gone = asyncio.Event()
        self.overflowed = False  # the client sent more than the limit while queued
        self.forwarding = False  # a worker is taking the messages
        self._drained = asyncio.Event()

    def put(self, message: str | bytes) -> None:
        self.held_bytes += len(message)
        self._drained.clear()
        self.queue.put_nowait(message)

    def close(self) -> None:
        self.gone.set()
        self.queue.put_nowait(_CLIENT_GONE)

    async def get(self) -> Any:
        message = await self.queue.get()
        if message is not _CLIENT_GONE:
            self.held_bytes -= len(message)
            if self.held_bytes <= 0:
                self._drained.set()
        return message

    async def wait_drained(self) -> None:
        await self._drained.wait()


def same_origin(ws: WebSocket) -> bool:
    """True for clients that send no ``Origin`` (non-browser clients) and for pages served by this gateway."""
    origin = ws.headers.get("origin")
    if origin is None:
        return True
    host = ws.headers.get("host", "")
    return urlsplit(origin).netloc.lower() == host.lower()


def error_event(code: str, message: str, **extra: Any) -> str:
    return json.dumps({"type": "error", "error": {"type": "server_error", "code": code, "message": message, **extra}})


class RealtimeProxy:
    def __init__(self, pool: WorkerPool, sessions: LiveSessions, apps: AppSwitches, *, max_held_bytes: int,
                 on_worker_failure: Any) -> None:
        self.pool = pool
        self.sessions = sessions
        self.apps = apps
        self.max_held_bytes = max_held_bytes
        self.on_worker_failure = on_worker_failure

    async def handle(self, ws: WebSocket) -> None:
        if not same_origin(ws):
            # a browser page of another site must not open voice sessions with this gateway's users' microphones
            await ws.close(CLOSE_POLICY, "cross-origin WebSocket refused")
            return
        await ws.accept(subprotocol=negotiate_dialect(ws.headers)[1])
        try:
            self.apps.check("voice")
        except APIError as exc:
            await _close(ws, CLOSE_POLICY, error_event("app_disabled", exc.message))
            return
        try:
            ticket = self.pool.enqueue("voice")
        except QueueFullError as exc:
            await _close(ws, CLOSE_TRY_AGAIN, error_event("queue_full", str(exc),
                                                          retry_after_s=round(exc.retry_after_s, 1)))
            return
        inbox = _Inbox()
        reader = asyncio.create_task(self._read_client(ws, inbox), name="omnipipe-gateway-ws-reader")
        wait = QueueWait(self.pool, ticket)  # after it, wait.worker is the worker the ticket got, however it ended
        session: LiveSession | None = None
        tap: RealtimeTap | None = None
        status, error = "completed", None
        try:
            async with wait:
                worker = await self._wait_in_queue(ws, wait, inbox)
            if worker is None:
                status = "cancelled"
                return
            client = f"{ws.client.host}:{ws.client.port}" if ws.client else None
            session = self.sessions.open("voice", worker=worker.address, client=client,
                                         config={"path": ws.url.path})
            if session.recorder is not None:
                tap = RealtimeTap(session.recorder)
            status, error = await self._relay(ws, worker, session, inbox, tap)
        except Exception as exc:  # noqa: BLE001 - one session's failure must not take the gateway down
            logger.exception("realtime session failed")
            status, error = "failed", f"{type(exc).__name__}: {exc}"
            await _close(ws, CLOSE_INTERNAL, error_event("gateway_error", error))
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            if wait.worker is not None:
                self.pool.release(wait.worker, ticket)
            elif ticket.waiting:
                self.pool.cancel(ticket.ticket_id)
            if tap is not None:
                with contextlib.suppress(Exception):
                    tap.close(status)
            if session is not None:
                self.sessions.request_done(session, status, error)

    async def _read_client(self, ws: WebSocket, inbox: _Inbox) -> None:
        """Everything the client sends, in order; ``_CLIENT_GONE`` once it has closed."""
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                payload = message.get("text")
                if payload is None:
                    payload = message.get("bytes")
                if payload is None:
                    continue
                inbox.put(payload)
                if inbox.held_bytes > self.max_held_bytes:
                    if not inbox.forwarding:
                        inbox.overflowed = True
                        break
                    await inbox.wait_drained()  # back-pressure: read on once the worker has taken what is held
        except (RuntimeError, ConnectionError):
            pass
        finally:
            inbox.close()

    async def _wait_in_queue(self, ws: WebSocket, wait: QueueWait, inbox: _Inbox) -> Worker | None:
        """Send queue messages until a worker is assigned; ``None`` if the client left or was cancelled."""

        async def client_gone() -> bool:
            return inbox.gone.is_set()  # also set when it sent too much while queued

        try:
            async for message in wait.updates(until=client_gone, wake=inbox.gone, poll_s=1.0):
                await ws.send_text(json.dumps(message))
        except (WebSocketDisconnect, RuntimeError, OSError):
            return None  # the client went while a queue message was being sent
        if wait.cancelled:
            await _close(ws, CLOSE_TRY_AGAIN, error_event("queue_cancelled", "your place in the queue was cancelled"))
            return None
        if wait.stopped:
            if inbox.overflowed:
                await _close(ws, CLOSE_TOO_BIG, error_event(
                    "held_too_much", f"sent more than {self.max_held_bytes} bytes while queued; wait for "
                    "queue_done before streaming audio"))
            return None
        return wait.worker

    async def _relay(self, ws: WebSocket, worker: Worker, session: LiveSession, inbox: _Inbox,
                     tap: RealtimeTap | None) -> tuple[str, str | None]:
        """Relay both ways until either side closes; returns the session's status and error."""
        upstream, first = await self._open_upstream(ws, worker)
        if upstream is None:
            return "failed", first
        inbox.forwarding = True
        to_worker = asyncio.create_task(self._client_to_worker(inbox, upstream, tap))
        to_client: asyncio.Task[tuple[int, str]] | None = None
        try:
            await ws.send_text(json.dumps({"type": QUEUE_DONE, "session_id": session.session_id,
                                           "worker": worker.address}))
            if tap is not None:
                with contextlib.suppress(Exception):
                    tap.on_server_event(first)
            await ws.send_text(first)
            to_client = asyncio.create_task(self._worker_to_client(upstream, ws, tap))
            done, _ = await asyncio.wait({to_worker, to_client}, return_when=asyncio.FIRST_COMPLETED)
            if to_client in done:
                code, reason = to_client.result()
                if code == _CLIENT_LEFT:
                    return "completed", None
                if code in (CLOSE_NORMAL, CLOSE_GOING_AWAY):
                    await _close(ws, code, None, reason)
                    return "completed", None
                if code in (CLOSE_ABNORMAL, CLOSE_INTERNAL):
                    self.on_worker_failure(worker.address)
                    message = f"worker {worker.address} failed mid-session (connection closed, code {code})"
                    await _close(ws, CLOSE_INTERNAL, error_event("worker_failed", message))
                    return "failed", message
                await _close(ws, code, None, reason)  # e.g. 1008 refused, 1013 at capacity or loading
                return "failed", f"worker closed the session: {code} {reason}".strip()
            return "completed", None  # the client closed
        except (WebSocketDisconnect, RuntimeError):
            return "cancelled", "the client left"  # it went while the session was being set up
        finally:
            tasks = [t for t in (to_worker, to_client) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await upstream.close()

    async def _open_upstream(self, ws: WebSocket, worker: Worker) -> tuple[ClientConnection | None, str]:
        """Connect to the worker and read its first event (``session.created``).

        A ``worker_at_capacity`` refusal just after the worker was assigned is retried (``retry_at_capacity``).
        Returns the connection and the first event, or ``None`` and the failure (already sent to the client).
        """
        headers = [(k, v) for k, v in ws.headers.items() if k.lower() in _FORWARDED_HANDSHAKE_HEADERS]
        subprotocol = negotiate_dialect(ws.headers)[1]  # the worker speaks the dialect the client asked for

        async def attempt() -> tuple[ClientConnection, str]:
            upstream, first = await _connect(worker.address, headers, subprotocol)
            return upstream, first if isinstance(first, str) else first.decode("utf-8", "replace")

        async def refused(opened: tuple[ClientConnection, str]) -> bool:
            upstream, first_text = opened
            if not is_at_capacity(first_text):
                return False
            with contextlib.suppress(Exception):
                await upstream.close()
            return True

        try:
            return await retry_at_capacity(attempt, refused)
        except InvalidStatus as exc:
            message = f"worker {worker.address} refused the session (HTTP {exc.response.status_code})"
            await _close(ws, CLOSE_TRY_AGAIN if exc.response.status_code >= 500 else CLOSE_POLICY,
                         error_event("worker_refused", message))
            return None, message
        except (TimeoutError, OSError, InvalidHandshake, ConnectionClosed) as exc:
            self.on_worker_failure(worker.address)
            message = f"worker {worker.address} failed: {type(exc).__name__}: {exc}"
            await _close(ws, CLOSE_INTERNAL, error_event("worker_failed", message))
            return None, message

    async def _client_to_worker(self, inbox: _Inbox, upstream: ClientConnection,
                                tap: RealtimeTap | None) -> None:
        while True:
            message = await inbox.get()
            if message is _CLIENT_GONE:
                return
            if tap is not None and isinstance(message, str):
                with contextlib.suppress(Exception):
                    tap.on_client_event(message)
            try:
                await upstream.send(message)
            except ConnectionClosed:
                return  # the other direction reports how the worker closed

    async def _worker_to_client(self, upstream: ClientConnection, ws: WebSocket,
                                tap: RealtimeTap | None) -> tuple[int, str]:
        """Forward the worker's events; returns the worker's close code and reason."""
        try:
            async for message in upstream:
                if tap is not None and isinstance(message, str):
                    with contextlib.suppress(Exception):
                        tap.on_server_event(message)
                try:
                    if isinstance(message, str):
                        await ws.send_text(message)
                    else:
                        await ws.send_bytes(message)
                except (WebSocketDisconnect, RuntimeError, OSError):
                    return _CLIENT_LEFT, "the client left"
        except ConnectionClosed:
            pass
        close = upstream.protocol.close_rcvd
        return (close.code, close.reason) if close is not None else (CLOSE_ABNORMAL, "")


async def _connect(address: str, headers: list[tuple[str, str]],
                   subprotocol: str | None = None) -> tuple[ClientConnection, str | bytes]:
    """Open a realtime session on the worker and read its first event; on any failure after the connection
    opened, close it (a session left open would hold one of the worker's slots)."""
    upstream = await connect(f"ws://{address}{REALTIME_PATH}", additional_headers=headers, max_size=None,
                             open_timeout=10, ping_interval=None,
                             subprotocols=[subprotocol] if subprotocol else None)  # type: ignore[list-item]
    try:
        return upstream, await asyncio.wait_for(upstream.recv(), 30)
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(upstream.close(), 5)
        raise


async def _close(ws: WebSocket, code: int, event: str | None, reason: str = "") -> None:
    """Send ``event`` (if any) and close, ignoring a client that has already gone."""
    if ws.client_state is not WebSocketState.CONNECTED or ws.application_state is not WebSocketState.CONNECTED:
        return
    with contextlib.suppress(Exception):
        if event is not None:
            await ws.send_text(event)
        await ws.close(code, reason[:120])
