"""Proxies the model endpoints (chat completions, speech, transcriptions) to the worker the queue assigns, and
changes to the voices to every worker (``ModelProxy.to_every_worker``).

The worker's status, headers and body pass through unchanged and unbuffered (SSE and chunked audio keep
streaming); the gateway adds ``X-Omnipipe-Session-Id`` and ``X-Omnipipe-Worker``. A streamed chat request that
asks with ``X-Omnipipe-Queue-Events: 1`` gets ``event: queue`` SSE events while it waits. The bytes are also fed
to the session's tap, which records the turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import Request
from starlette.datastructures import Headers
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from omnipipe.gateway.apps import AppSwitches
from omnipipe.gateway.live_sessions import LiveSession, LiveSessions
from omnipipe.gateway.pool import QueueFullError, Ticket, WorkerPool
from omnipipe.gateway.proxy.http_recording import make_tap, record_upload, recording_sink
from omnipipe.gateway.proxy.queue_wait import QUEUE_DONE, QueueWait, retry_at_capacity
from omnipipe.gateway.recording.store import InvalidSessionPath, validate_session_id
from omnipipe.gateway.recording.taps import HttpTap
from omnipipe.gateway.worker import Worker
from omnipipe.protocol.errors import APIError
from omnipipe.protocol.worker import HEALTH_PATH, is_at_capacity

logger = logging.getLogger(__name__)

SESSION_HEADER = "X-Omnipipe-Session-Id"
WORKER_HEADER = "X-Omnipipe-Worker"
QUEUE_EVENTS_HEADER = "X-Omnipipe-Queue-Events"
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
                         "transfer-encoding", "upgrade", "host", "content-length"})
_GATEWAY_ONLY = frozenset({"x-admin-token", "cookie"})
_MAX_RECONNECTS = 2
_PROBE_TIMEOUT_S = 2.0  # a worker whose connection dropped without an answer: is it still there?


class _ClientGone(Exception):
    """The client disconnected while its request waited in the queue."""


def queue_full_error(exc: QueueFullError) -> APIError:
    retry = max(1, round(exc.retry_after_s))
    return APIError(503, str(exc), code="queue_full", headers={"Retry-After": str(retry)})


def worker_failed_error(address: str, detail: str) -> APIError:
    return APIError(502, f"worker {address} failed: {detail}", code="worker_failed", type="server_error")


def _no_worker_error() -> APIError:
    return APIError(503, "no worker is online", code="no_worker", headers={"Retry-After": "2"})


def _target(request: Request) -> str:
    """The request's path and query, as a worker is asked them."""
    return request.url.path + (f"?{request.url.query}" if request.url.query else "")


def _whole_response(reply: httpx.Response) -> Response:
    """A worker's whole (read) reply, passed on with its status and headers."""
    response = Response(reply.content, reply.status_code)
    response.raw_headers = [*response_headers(reply.headers), (b"content-length", str(len(reply.content)).encode())]
    return response


def _dropped(headers: Headers | httpx.Headers, extra: frozenset[str]) -> frozenset[str]:
    """Header names not to pass on: hop-by-hop ones, those the ``Connection`` header names, and ``extra``."""
    named = {t.strip().lower() for v in headers.get_list("connection") for t in v.split(",")} \
        if isinstance(headers, httpx.Headers) else {t.strip().lower() for t in headers.get("connection", "").split(",")}
    return _HOP_BY_HOP | named | extra


def request_headers(headers: Headers) -> list[tuple[str, str]]:
    """The client's headers as sent on to a worker (no hop-by-hop, admin token or gateway headers)."""
    drop = _dropped(headers, _GATEWAY_ONLY)
    out = [(k, v) for k, v in headers.items() if k.lower() not in drop and not k.lower().startswith("x-omnipipe-")]
    if "accept-encoding" not in {k.lower() for k, _ in out}:
        out.append(("accept-encoding", "identity"))  # not httpx's default gzip: the client did not ask for it
    return out


def response_headers(headers: httpx.Headers) -> list[tuple[bytes, bytes]]:
    """The worker's response headers as passed to the client, repeated ones (``Set-Cookie``) kept apart."""
    drop = _dropped(headers, frozenset({"date", "server"}))  # the gateway's own server adds these
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.multi_items() if k.lower() not in drop]


def _sse(event: str | None, data: dict[str, Any]) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


class _ProxiedResponse(StreamingResponse):
    """A streaming response that runs ``on_close`` however the exchange ends (done, client gone, error)."""

    def __init__(self, body: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], **kwargs: Any) -> None:
        super().__init__(body, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


class Exchange:
    """One proxied request: its ticket, worker, upstream response, session and tap; ``close`` is idempotent."""

    def __init__(self, proxy: ModelProxy, request_type: str, ticket: Ticket, session_id: str,
                 resumed: LiveSession | None) -> None:
        self.proxy = proxy
        self.request_type = request_type
        self.ticket = ticket
        self.session_id = session_id
        self.session: LiveSession | None = resumed
        self.resumed = resumed is not None
        self.worker: Worker | None = None
        self.upstream: httpx.Response | None = None
        self.tap: HttpTap | None = None
        self.prefetched: bytes | None = None  # a body already read (a refusal checked for worker_at_capacity)
        self.reconnects = 0  # times the request got the head of the queue again after a refused connection
        self.status = "completed"
        self.error: str | None = None
        self.refused = False  # the worker answered 4xx: no session was served, nothing is kept
        self.transcript_for: LiveSession | None = None  # a chat session whose spoken question this transcribes
        self.recorded = True  # False: no session is opened or recorded (a Responses API request)
        self._closed = False

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.upstream is not None:
            await self.upstream.aclose()
        pool = self.proxy.pool
        if self.worker is not None:
            pool.release(self.worker, self.ticket)
        elif self.ticket.waiting:
            pool.cancel(self.ticket.ticket_id)
        if self.tap is not None:
            with contextlib.suppress(Exception):
                self.tap.end(self.status)
        if self.session is not None:
            if self.refused and not self.resumed:
                self.proxy.sessions.discard(self.session)  # a refused request alone is no session to keep
            else:
                self.proxy.sessions.request_done(self.session, self.status, self.error)


class ModelProxy:
    def __init__(self, pool: WorkerPool, client: httpx.AsyncClient, sessions: LiveSessions, apps: AppSwitches, *,
                 max_body_bytes: int, on_worker_failure: Callable[[str], None]) -> None:
        self.pool = pool
        self.client = client
        self.sessions = sessions
        self.apps = apps
        self.max_body_bytes = max_body_bytes
        self.on_worker_failure = on_worker_failure

    async def catalog(self, request: Request) -> Response:
        """What the workers serve (``GET /v1/models``, ``/v1/models/{id}``, ``/v1/audio/voices``), from any online
        worker, path and query as asked (no queue: it costs the worker nothing)."""
        target = _target(request)
        for worker in self.pool.workers:
            if not worker.online:
                continue
            try:
                reply = await self.client.get(f"http://{worker.address}{target}",
                                              headers=request_headers(request.headers), timeout=5.0)
            except httpx.HTTPError:
                continue
            return _whole_response(reply)
        raise _no_worker_error()

    async def to_every_worker(self, request: Request) -> Response:
        """A change to the workers' voices (``POST /v1/audio/voices``, ``DELETE /v1/audio/voices/{name}``) sent to
        every online worker at once (no queue), so that the next request can use it whichever worker serves it: the
        first refusal (4xx) is the answer; else, when a worker could not take it, a 502 naming it (the others keep
        it; sending it again is answered 200 by those); else the first worker's answer. A ``DELETE`` that some
        worker answers 404 (it never had the voice, or shares its voice directory with one that removed it) counts
        as done when another removed it. A worker offline meanwhile does not get it."""
        body = await self._read_body(request)
        asked = await self._ask_every_worker(request, request.method, _target(request), body, 120.0)
        workers = [w for w, _ in asked]
        replies = [r for _, r in asked]
        answered = [r for r in replies if isinstance(r, httpx.Response)]
        done = [r for r in answered if r.is_success]
        refused = [r for r in answered if 400 <= r.status_code < 500
                   and not (request.method == "DELETE" and r.status_code == 404 and done)]
        failed = [f"{w.address} ({r if isinstance(r, str) else f'status {r.status_code}'})"
                  for w, r in zip(workers, replies, strict=True)
                  if isinstance(r, str) or r.status_code >= 500]
        if refused:
            chosen = refused[0]
        elif failed:
            raise worker_failed_error(", ".join(failed), "the change reached the other workers only")
        else:
            chosen = next((r for r in done if r.status_code == 201), done[0])
        return _whole_response(chosen)

    async def responses(self, request: Request) -> Response:
        """``POST /v1/responses``: queued as a chat request, not recorded. A stored response lives on the worker
        that made it: on a gateway of several workers, a follow-up naming ``previous_response_id`` goes straight to
        the worker that holds it (outside the queue; that worker's own capacity check applies), found by asking
        every online worker for it; none holds it: 404 naming ``previous_response_id``."""
        body = await self._read_body(request)
        parsed = self._parse_json(body)
        previous = parsed.get("previous_response_id") if isinstance(parsed, dict) else None
        if not isinstance(previous, str) or len(self.pool.workers) < 2:
            return await self.handle(request, "chat", recorded=False, body=body)
        self.apps.check("chat")
        replies = await self._ask_every_worker(request, "GET", f"{request.url.path}/{quote(previous, safe='')}",
                                               b"", 10.0)
        owner = next((w for w, r in replies if isinstance(r, httpx.Response) and r.is_success), None)
        if owner is None:
            raise APIError(404, f"previous_response_id: no worker holds a stored response {previous!r}",
                           param="previous_response_id", code="previous_response_not_found")
        try:
            upstream = await self.client.send(self.client.build_request(
                "POST", f"http://{owner.address}{_target(request)}", content=body,
                headers=request_headers(request.headers)), stream=True)
        except httpx.HTTPError as exc:
            self.on_worker_failure(owner.address)
            raise worker_failed_error(owner.address, f"{type(exc).__name__}: {exc}") from None
        response = _ProxiedResponse(upstream.aiter_raw(), upstream.aclose, status_code=upstream.status_code,
                                    headers={WORKER_HEADER: owner.address})
        response.raw_headers = [*response_headers(upstream.headers),
                                *((k, v) for k, v in response.raw_headers if k != b"content-type")]
        return response

    async def to_owner(self, request: Request) -> Response:
        """``GET`` / ``DELETE /v1/responses/{id}``: asked of every online worker at once; the answer of the one
        that stored the response, else the first refusal (404), else 502 naming the workers that did not answer."""
        replies = await self._ask_every_worker(request, request.method, _target(request), b"", 30.0)
        answered = [r for _, r in replies if isinstance(r, httpx.Response)]
        chosen = next((r for r in answered if r.is_success), None) or next(
            (r for r in answered if r.status_code < 500), None)
        if chosen is None:
            raise worker_failed_error(", ".join(w.address for w, _ in replies), "no worker answered")
        return _whole_response(chosen)

    async def _ask_every_worker(self, request: Request, method: str, target: str, body: bytes,
                                timeout_s: float) -> list[tuple[Worker, httpx.Response | str]]:
        """``method target`` sent to every online worker at once: each worker's reply, or what went wrong."""
        workers = [w for w in self.pool.workers if w.online]
        if not workers:
            raise _no_worker_error()

        async def send(worker: Worker) -> httpx.Response | str:
            try:
                return await self.client.request(method, f"http://{worker.address}{target}", content=body,
                                                 headers=request_headers(request.headers), timeout=timeout_s)
            except httpx.HTTPError as exc:
                return f"{type(exc).__name__}: {exc}"

        return list(zip(workers, await asyncio.gather(*(send(worker) for worker in workers)), strict=True))

    async def handle(self, request: Request, request_type: str, *, recorded: bool = True,
                     body: bytes | None = None) -> Response:
        """Proxy a model request through the queue; ``recorded``: it opens (or continues) a recorded session;
        ``body``: the request's body when the caller has read it already."""
        self.apps.check(request_type)
        if body is None:
            body = await self._read_body(request)
        parsed = self._parse_json(body) if request_type in ("chat", "speech") else None
        stream = bool(isinstance(parsed, dict) and parsed.get("stream") is True)
        queue_events = stream and request.headers.get(QUEUE_EVENTS_HEADER, "").lower() in ("1", "true", "yes")
        resumed = self._resume_session(request, request_type) if recorded else None
        transcript_for = self._chat_to_transcribe_for(request, request_type)
        try:
            ticket = self.pool.enqueue(request_type)
        except QueueFullError as exc:
            if resumed is not None:
                self.sessions.request_done(resumed)
            raise queue_full_error(exc) from None
        if transcript_for is not None:
            session_id = transcript_for.session_id
        else:
            session_id = resumed.session_id if resumed is not None else self.sessions.new_id(request_type)
        exchange = Exchange(self, request_type, ticket, session_id, resumed)
        exchange.transcript_for = transcript_for
        exchange.recorded = recorded
        headers = {SESSION_HEADER: session_id}
        if queue_events:
            return _ProxiedResponse(self._queued_stream(exchange, request, body, parsed), exchange.close,
                                    media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"})
        try:
            await self._wait_for_worker(exchange, request)
            upstream = await self._send_upstream(exchange, request, body, parsed)
        except _ClientGone:
            exchange.status = "cancelled"
            await exchange.close()
            return Response(status_code=499)  # nobody reads it: the client has gone
        except BaseException:
            await exchange.close()
            raise
        exchange.refused = 400 <= upstream.status_code < 500
        headers[WORKER_HEADER] = exchange.worker.address if exchange.worker else ""
        response = _ProxiedResponse(self._relay(exchange, upstream), exchange.close, status_code=upstream.status_code,
                                    headers=headers)
        response.raw_headers = [*response_headers(upstream.headers),
                                *((k, v) for k, v in response.raw_headers if k != b"content-type")]
        return response

    # -- steps -------------------------------------------------------------------------------------

    async def _read_body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise APIError(413, f"body: larger than the gateway's limit of {self.max_body_bytes} bytes",
                           param="body", code="body_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise APIError(413, f"body: larger than the gateway's limit of {self.max_body_bytes} bytes",
                               param="body", code="body_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    @staticmethod
    def _parse_json(body: bytes) -> Any:
        try:
            return json.loads(body)
        except ValueError:
            return None  # the worker answers the 400 that names the problem

    def _resume_session(self, request: Request, request_type: str) -> LiveSession | None:
        wanted = request.headers.get(SESSION_HEADER)
        if not wanted or request_type != "chat":
            return None
        try:
            validate_session_id(wanted)
        except InvalidSessionPath as exc:
            raise APIError(400, f"{SESSION_HEADER}: {exc}", param=SESSION_HEADER, code="invalid_session_id") from None
        return self.sessions.resume_chat(wanted)  # None: unknown or finished, so this turn starts a new session

    def _chat_to_transcribe_for(self, request: Request, request_type: str) -> LiveSession | None:
        """The open chat session a transcription request names: its transcript joins that chat's recording (the
        turn being answered, else the last one) instead of becoming a recording of its own."""
        wanted = request.headers.get(SESSION_HEADER)
        if not wanted or request_type != "transcription":
            return None
        try:
            validate_session_id(wanted)
        except InvalidSessionPath:
            return None
        return self.sessions.open_chat(wanted)

    async def _wait_for_worker(self, exchange: Exchange, request: Request) -> Worker:
        """Wait for the ticket's worker; a client that disconnects meanwhile gives its place back."""
        wait = QueueWait(self.pool, exchange.ticket)
        try:
            async with wait:
                async for _ in wait.updates(until=request.is_disconnected, poll_s=0.5):
                    pass  # a plain request is told nothing while it waits
        finally:
            if wait.worker is not None:
                exchange.worker = wait.worker  # closing the exchange releases it, however the wait ended
        if wait.cancelled:
            raise _cancelled_error()
        if wait.stopped or exchange.worker is None:
            raise _ClientGone
        self._start_session(exchange, request)
        return exchange.worker

    def _start_session(self, exchange: Exchange, request: Request) -> None:
        assert exchange.worker is not None
        if exchange.session is None and exchange.transcript_for is None and exchange.recorded:
            client = f"{request.client.host}:{request.client.port}" if request.client else None
            exchange.session = self.sessions.open(exchange.request_type, worker=exchange.worker.address,
                                                  client=client, session_id=exchange.session_id,
                                                  config={"path": request.url.path})

    async def _send_upstream(self, exchange: Exchange, request: Request, body: bytes, parsed: Any) -> httpx.Response:
        assert exchange.worker is not None
        make_tap(exchange, parsed)
        with contextlib.suppress(Exception):
            await record_upload(exchange, request, body)
        return await retry_at_capacity(lambda: self._connect_upstream(exchange, request, body),
                                       lambda upstream: self._refused_at_capacity(exchange, upstream))

    async def _connect_upstream(self, exchange: Exchange, request: Request, body: bytes) -> httpx.Response:
        """Send the request to the exchange's worker; one that refuses the connection, or drops it before any
        answer and then does not answer at all (it died: a killed worker's sockets stay open until its process has
        ended, so a request can reach it in that moment), is taken offline and the request waits, first in line,
        for another (up to ``_MAX_RECONNECTS`` times)."""
        assert exchange.worker is not None
        while True:
            address = exchange.worker.address
            url = f"http://{address}{_target(request)}"
            upstream_request = self.client.build_request(request.method, url, content=body,
                                                         headers=request_headers(request.headers))
            try:
                exchange.upstream = await self.client.send(upstream_request, stream=True)
            except httpx.ConnectError as exc:
                # the request never reached the worker: take it offline and give the request its turn back
                error, reason = f"ConnectError: {exc}", f"connection refused: {exc}"
            except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                # no answer came: a worker that no longer answers at all died with the request, which it can no
                # longer serve, so the request gets its turn back; one that still answers failed it: 502
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if await self._answers(address):
                    exchange.status, exchange.error = "failed", error
                    self.on_worker_failure(address)
                    raise worker_failed_error(address, error) from None
                reason = f"connection lost before an answer, then no answer: {error}"
            except httpx.HTTPError as exc:
                exchange.status, exchange.error = "failed", f"{type(exc).__name__}: {exc}"
                self.on_worker_failure(address)
                raise worker_failed_error(address, exchange.error) from None
            else:
                return exchange.upstream
            self.pool.mark_unreachable(address, reason)
            self.on_worker_failure(address)
            if exchange.reconnects >= _MAX_RECONNECTS:
                exchange.status, exchange.error = "failed", error
                raise worker_failed_error(address, exchange.error) from None
            exchange.reconnects += 1
            await self._requeue_at_front(exchange, request)

    async def _answers(self, address: str) -> bool:
        """Whether the worker at ``address`` answers a health check now (with any status)."""
        try:
            await self.client.get(f"http://{address}{HEALTH_PATH}", timeout=_PROBE_TIMEOUT_S)
        except httpx.HTTPError:
            return False
        return True

    @staticmethod
    async def _refused_at_capacity(exchange: Exchange, upstream: httpx.Response) -> bool:
        """Whether ``upstream`` is a ``worker_at_capacity`` refusal (then closed); another 429's body is kept in
        ``exchange.prefetched`` for the client."""
        if upstream.status_code != 429:
            return False
        assert exchange.worker is not None
        try:
            exchange.prefetched = await upstream.aread()
        except httpx.HTTPError as exc:
            exchange.status, exchange.error = "failed", f"{type(exc).__name__}: {exc}"
            raise worker_failed_error(exchange.worker.address, exchange.error) from None
        if not is_at_capacity(exchange.prefetched):
            return False
        exchange.prefetched = None
        await upstream.aclose()
        return True

    async def _requeue_at_front(self, exchange: Exchange, request: Request) -> None:
        """Give the exchange's worker back and wait, first in line, for another one."""
        assert exchange.worker is not None
        self.pool.release(exchange.worker, exchange.ticket)
        exchange.worker = None
        exchange.ticket = self.pool.enqueue(exchange.request_type, front=True)
        await self._wait_for_worker(exchange, request)

    async def _relay(self, exchange: Exchange, upstream: httpx.Response) -> AsyncIterator[bytes]:
        """The worker's body as it arrives, also fed to the tap; a worker lost mid-stream ends it with an error."""
        content_type = upstream.headers.get("content-type", "")
        is_sse = content_type.startswith("text/event-stream")
        record = recording_sink(exchange, upstream.status_code, content_type, is_sse)
        try:
            chunks = _once(exchange.prefetched) if exchange.prefetched is not None else upstream.aiter_raw()
            async for chunk in chunks:
                record(chunk)
                yield chunk
            record(None)
            if upstream.status_code >= 400:
                exchange.status = "failed"
        except httpx.HTTPError as exc:
            exchange.status, exchange.error = "failed", f"worker lost mid-response: {type(exc).__name__}"
            assert exchange.worker is not None
            self.on_worker_failure(exchange.worker.address)
            if is_sse:
                yield _sse(None, worker_failed_error(exchange.worker.address, exchange.error).body())
            else:
                raise

    async def _queued_stream(self, exchange: Exchange, request: Request, body: bytes,
                             parsed: Any) -> AsyncIterator[bytes]:
        """SSE for a chat request that asked for queue events: queued, updates, done, then the worker's stream."""
        wait = QueueWait(self.pool, exchange.ticket)
        try:
            async with wait:
                async for message in wait.updates():
                    yield _sse("queue", message)
        finally:
            if wait.worker is not None:
                exchange.worker = wait.worker  # even if the client went just as a worker was assigned
        if wait.cancelled or exchange.worker is None:
            yield _sse(None, _cancelled_error().body())
            return
        self._start_session(exchange, request)
        yield _sse("queue", {"type": QUEUE_DONE, "session_id": exchange.session_id,
                             "worker": exchange.worker.address})
        try:
            upstream = await self._send_upstream(exchange, request, body, parsed)
        except APIError as exc:
            yield _sse(None, exc.body())
            return
        if upstream.status_code != 200:
            exchange.refused = 400 <= upstream.status_code < 500
            error = await upstream.aread()
            try:
                yield _sse(None, json.loads(error))
            except ValueError:
                yield _sse(None, APIError(upstream.status_code, error.decode("utf-8", "replace")).body())
            exchange.status = "failed"
            return
        async for chunk in self._relay(exchange, upstream):
            yield chunk

def _cancelled_error() -> APIError:
    return APIError(503, "the queued request was cancelled", code="queue_cancelled")


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data
