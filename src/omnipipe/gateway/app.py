"""The gateway: one FastAPI app in front of many workers (see docs/gateway.md for every route).

It loads no model. A ``WorkerPool`` assigns each request or realtime session to a worker in FIFO order, a
``HealthMonitor`` keeps the workers' states current, ``ModelProxy`` and ``RealtimeProxy`` relay the traffic,
``LiveSessions`` records it, and the admin API and web pages sit beside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse

from omnipipe.gateway import admin, pages
from omnipipe.gateway.apps import AppSwitches
from omnipipe.gateway.config import GatewayConfig
from omnipipe.gateway.eta import EtaEstimator
from omnipipe.gateway.health import HealthMonitor
from omnipipe.gateway.live_sessions import LiveSessions
from omnipipe.gateway.pool import WorkerPool
from omnipipe.gateway.proxy.http import ModelProxy
from omnipipe.gateway.proxy.realtime import RealtimeProxy
from omnipipe.gateway.recording.cleanup import PeriodicCleanup
from omnipipe.gateway.recording.store import SessionStore
from omnipipe.gateway.shares import ShareStore
from omnipipe.gateway.worker import Worker
from omnipipe.protocol.errors import APIError, install_api_error_handlers
from omnipipe.protocol.header_limits import HeaderLimits
from omnipipe.protocol.http_version import HTTPVersionCheck
from omnipipe.protocol.worker import (
    CHAT_PATH,
    MODELS_PATH,
    REALTIME_PATH,
    RESPONSES_PATH,
    SPEECH_PATH,
    TRANSCRIPTION_PATH,
    VOICES_PATH,
)

logger = logging.getLogger(__name__)
_IDLE_SWEEP_S = 30.0


def create_gateway_app(config: GatewayConfig) -> FastAPI:
    pool = WorkerPool((Worker(address) for address in config.workers), max_queue=config.max_queue,
                      eta=EtaEstimator(config.eta_baselines_s), offline_after_failures=config.offline_after_failures)
    store = SessionStore(config.data_dir)
    sessions = LiveSessions(store, record=config.record, chat_idle_s=config.chat_session_idle_s)
    apps = AppSwitches()
    # one client for every user: it must never keep cookies a worker sets
    client = httpx.AsyncClient(timeout=httpx.Timeout(connect=5.0, read=600.0, write=60.0, pool=None),
                               limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
                               cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])))
    monitor = HealthMonitor(pool, client, interval_s=config.health_interval_s, timeout_s=config.health_timeout_s)
    checks: set[asyncio.Task[None]] = set()

    def on_worker_failure(address: str) -> None:
        """A request to ``address`` failed at the connection level: check it now instead of at the next round."""
        task = asyncio.get_running_loop().create_task(monitor.check(address))
        checks.add(task)
        task.add_done_callback(checks.discard)

    proxy = ModelProxy(pool, client, sessions, apps, max_body_bytes=config.max_body_bytes,
                       on_worker_failure=on_worker_failure)
    realtime = RealtimeProxy(pool, sessions, apps, max_held_bytes=config.max_held_ws_bytes,
                             on_worker_failure=on_worker_failure)
    cleanup = PeriodicCleanup(store, config.retention_days, config.max_storage_gb,
                              interval_s=config.cleanup_interval_s, protect=sessions.ids)

    async def sweep_idle_chats() -> None:
        while True:
            await asyncio.sleep(_IDLE_SWEEP_S)
            sessions.sweep_idle()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await monitor.check_all()
        monitor.start()
        if config.record:
            await cleanup.start()
        sweeper = asyncio.create_task(sweep_idle_chats(), name="omnipipe-gateway-idle-chats")
        try:
            yield
        finally:
            pool.cancel_all()  # waiters get queue_cancelled rather than a cut connection
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await monitor.stop()
            if config.record:
                await cleanup.stop()
            await asyncio.to_thread(sessions.close_all)
            await client.aclose()

    app = FastAPI(title="omnipipe gateway", version="0.1.0", lifespan=lifespan,
                  description="FIFO queue, recordings and web pages in front of omnipipe workers.")
    app.state.config = config
    app.state.pool = pool
    app.state.store = store
    app.state.shares = ShareStore(config.data_dir)
    app.state.sessions = sessions
    app.state.apps = apps
    app.state.monitor = monitor
    _install_error_handlers(app)
    app.add_middleware(HeaderLimits)  # type: ignore
    app.add_middleware(HTTPVersionCheck)  # type: ignore  # outermost: a request in an unknown HTTP version gets 505
    app.include_router(admin.router)
    app.include_router(pages.router)

    @app.post(CHAT_PATH)
    async def chat(request: Request):  # type: ignore[no-untyped-def]
        return await proxy.handle(request, "chat")

    app.add_api_route(RESPONSES_PATH, proxy.responses, methods=["POST"])
    app.add_api_route(RESPONSES_PATH + "/{response_id}", proxy.to_owner, methods=["GET", "DELETE"])

    @app.post(SPEECH_PATH)
    async def speech(request: Request):  # type: ignore[no-untyped-def]
        return await proxy.handle(request, "speech")

    @app.post(TRANSCRIPTION_PATH)
    async def transcriptions(request: Request):  # type: ignore[no-untyped-def]
        return await proxy.handle(request, "transcription")

    @app.get(MODELS_PATH)
    @app.get(MODELS_PATH + "/{model_id:path}")
    @app.get(VOICES_PATH)
    async def catalog(request: Request):  # type: ignore[no-untyped-def]
        return await proxy.catalog(request)

    app.add_api_route(VOICES_PATH, proxy.to_every_worker, methods=["POST"])
    app.add_api_route(VOICES_PATH + "/{name}", proxy.to_every_worker, methods=["DELETE"])

    @app.websocket(REALTIME_PATH)
    async def realtime_session(ws: WebSocket) -> None:
        await realtime.handle(ws)

    @app.get("/api/queue")
    async def queue_status() -> dict[str, object]:
        available = [w for w in pool.workers if w.accepts_work]
        return {"queue_length": pool.queue_length, "capacity": pool.total_capacity, "starting": pool.starting,
                "workers": {"total": len(pool.workers), "available": len(available)}}

    @app.delete("/api/queue/{ticket_id}")
    async def leave_queue(ticket_id: str) -> dict[str, str]:
        return admin.cancel_ticket(pool, ticket_id)

    @app.get("/health")
    async def health() -> JSONResponse:
        workers = {w.address: w.state.name for w in pool.workers}
        serving = any(w.accepts_work for w in pool.workers)
        return JSONResponse({"status": "ok" if serving else "no_worker", "workers": workers,
                             "queue_length": pool.queue_length, "capacity": pool.total_capacity},
                            status_code=200 if serving else 503)

    return app


def _install_error_handlers(app: FastAPI) -> None:
    install_api_error_handlers(app)

    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected gateway error", exc_info=exc)
        return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error").response()

    app.add_exception_handler(Exception, unexpected)
