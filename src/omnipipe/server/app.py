"""The OpenAI-compatible HTTP server: one FastAPI app around one ``EnginePool``.

The main pipeline starts loading when the server starts; until it is ready ``/health`` answers 503
``{"status": "loading", "state": "LOADING", ...}`` and the model endpoints answer 503 with ``Retry-After``.
``/health`` also reports the worker protocol's fields (docs/gateway.md; ``WorkerHealth`` in ``protocol/worker.py``):
``state`` (``LOADING``, ``IDLE``, ``BUSY``, ``DUPLEX_ACTIVE``, ``DUPLEX_PAUSED``, ``ERROR``), ``models``,
``active_sessions``, ``capacity`` (``null``: unlimited) and ``sessions`` ``{http, realtime, paused}``; with ``error``
when the main pipeline failed to start. ``companions`` gives each companion pipeline's status; while one the server
preloads (``ServerConfig.preload_companions``) is still loading, ``/health`` says loading too (a companion that
failed to load does not: its endpoint answers 503 naming the failure).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse

from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.protocol.errors import APIError
from omnipipe.protocol.header_limits import HeaderLimits
from omnipipe.protocol.http_version import HTTPVersionCheck
from omnipipe.protocol.openai import ErrorResponse, ModelCard, ModelList
from omnipipe.protocol.worker import HEALTH_PATH, MODELS_PATH, CompanionHealthReply, WorkerHealth
from omnipipe.server.capacity import SessionLimiter, SessionTracker
from omnipipe.server.engines import EnginePool, EngineSlot, ServerConfig
from omnipipe.server.errors import install_error_handlers
from omnipipe.server.guard import RequestGuard
from omnipipe.server.prometheus import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from omnipipe.server.prometheus import ServerMetrics
from omnipipe.server.response_store import ResponseStore
from omnipipe.server.routes import chat, images, realtime, responses, speech, transcription, voices
from omnipipe.server.spoken_answers import SpokenAnswers

logger = logging.getLogger(__name__)


def create_app(config: ServerConfig, on_engine_failure: Callable[[str], None] | None = None) -> FastAPI:
    """Build the app. ``on_engine_failure(message)`` is called if the main pipeline cannot start and
    ``config.exit_on_engine_failure`` is set; otherwise the server keeps answering ``/health`` with state ``ERROR``.
    """
    pool = EnginePool(config)
    metrics = ServerMetrics(pool.model_name, entry_stages={name: slot.pipeline.stages[0].name
                                                           for name, slot in pool.slots.items()})
    sessions = SessionTracker(config.capacity)
    started = int(time.time())
    app = FastAPI(title="omnipipe", version="0.1.0", lifespan=_lifespan(pool, config, on_engine_failure),
                  description="OpenAI-compatible API for omnipipe's multi-stage omni models.")
    app.state.pool = pool
    app.state.metrics = metrics
    app.state.spoken_answers = SpokenAnswers()
    app.state.response_store = ResponseStore()
    app.state.sessions = sessions
    install_error_handlers(app)
    app.include_router(chat.router)
    app.include_router(responses.router)
    app.include_router(speech.router)
    app.include_router(voices.router)
    app.include_router(transcription.router)
    app.include_router(realtime.router)
    app.include_router(images.router)
    _add_model_routes(app, pool, started)
    _add_health_routes(app, pool, config, sessions, metrics)
    _add_middleware(app, config, sessions, metrics)
    return app


def _lifespan(pool: EnginePool, config: ServerConfig, on_engine_failure: Callable[[str], None] | None
              ) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the main pipeline starts loading (and the preloaded companions) with the server, and
    every pipeline is shut down with it; a main pipeline that fails to start is reported."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = pool.main.start_in_background()
        pool.start_preloaded()

        def report(done: asyncio.Task[Any]) -> None:
            if done.cancelled() or done.exception() is None:
                return
            message = pool.main.error or "the engine failed to start"
            if not config.exit_on_engine_failure:
                logger.error("the engine failed to start; still answering /health with state ERROR: %s", message)
            elif on_engine_failure is not None:
                on_engine_failure(message)

        task.add_done_callback(report)
        try:
            yield
        finally:
            await pool.shutdown()

    return lifespan


def _add_model_routes(app: FastAPI, pool: EnginePool, started: int) -> None:
    """``/v1/models`` and ``/v1/models/{model_id}``: the model ids the pool serves, with their modalities."""

    def card(name: str, pipeline: PipelineSpec) -> ModelCard:
        return ModelCard(id=name, created=started, input_modalities=list(pipeline.input_modalities),
                         output_modalities=list(pipeline.output_modalities), conversation=pipeline.takes_history)

    @app.get(MODELS_PATH, response_model=ModelList)
    async def list_models() -> ModelList:
        return ModelList(data=[card(name, pipeline) for name, pipeline in pool.model_pipelines()])

    @app.get(MODELS_PATH + "/{model_id:path}", response_model=ModelCard, responses={404: {"model": ErrorResponse}})
    async def retrieve_model(model_id: str) -> ModelCard:
        for name, pipeline in pool.model_pipelines():
            if name == model_id:
                return card(name, pipeline)
        raise APIError(404, f"model: {model_id!r} does not exist (models: {', '.join(pool.model_ids())})",
                       param="model", code="model_not_found")


def _add_health_routes(app: FastAPI, pool: EnginePool, config: ServerConfig, sessions: SessionTracker,
                       metrics: ServerMetrics) -> None:
    """``/health`` (the worker protocol's), ``/metrics`` (Prometheus) and ``/debug/state``."""
    preloaded = set(config.preload_companions)

    def companion_health(endpoint: str, slot: EngineSlot) -> CompanionHealthReply:
        reply: CompanionHealthReply = {"pipeline": slot.name, "status": slot.status, "preloaded": endpoint in preloaded}
        if slot.error:
            reply["error"] = slot.error
        return reply

    @app.get(HEALTH_PATH)
    async def health() -> JSONResponse:
        slot = pool.main
        status = slot.status if slot.status != "idle" else "loading"
        engine_health = slot.engine.health() if slot.status == "ready" and slot.engine is not None else None
        if engine_health is not None and not engine_health.ok:
            status = "degraded"
        if status == "ready" and pool.preloading():
            status = "loading"
        body: WorkerHealth = {"status": status, "state": sessions.state(status).name, "pipeline": slot.name,
                             "models": pool.model_ids(), "active_sessions": sessions.active,
                             "capacity": sessions.capacity, "sessions": sessions.counts(),
                             "companions": {endpoint: companion_health(endpoint, companion)
                                            for endpoint, companion in pool.companions().items()}}
        if engine_health is not None:
            body["stages"] = engine_health.stages_dict()  # type: ignore[typeddict-item]  # same keys
            body["problems"] = engine_health.problems
        if slot.error:
            body["error"] = slot.error
        elif status == "degraded":
            body["error"] = "; ".join(engine_health.problems if engine_health else [])
        return JSONResponse(body, status_code=200 if status == "ready" else 503)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(await pool.debug_states()), media_type=PROMETHEUS_CONTENT_TYPE)

    @app.get("/debug/state")
    async def debug_state(request: Request) -> JSONResponse:
        return JSONResponse({"engines": await pool.debug_states()})


def _add_middleware(app: FastAPI, config: ServerConfig, sessions: SessionTracker, metrics: ServerMetrics) -> None:
    """Session counting inside the request guard inside the header limits, inside CORS (when configured), inside the
    HTTP version check."""
    # added first, so it runs inside the guard: refused (401/413/415) requests are never counted as sessions
    app.add_middleware(SessionLimiter, tracker=sessions)  # type: ignore
    app.add_middleware(RequestGuard, api_key=config.api_key, max_body_bytes=config.max_body_bytes,  # type: ignore
                       metrics=metrics)
    app.add_middleware(HeaderLimits)  # type: ignore  # nothing reads a request beyond the limits
    if config.cors_origins:  # outside the guard: a browser's preflight carries no API key, every answer needs them
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins),  # type: ignore
                           allow_methods=list(config.cors_methods), allow_headers=list(config.cors_headers),
                           allow_credentials=config.cors_credentials)
    app.add_middleware(HTTPVersionCheck)  # type: ignore  # outermost: a request in an unknown HTTP version gets 505
