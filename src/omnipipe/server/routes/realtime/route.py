"""``WS /v1/realtime``'s handshake: the API key (a bearer token; refused before accept, HTTP 403), the dialect the
client asked for, a place among the server's sessions and the main pipeline (or an ``error`` event and close 1013),
then the session until either side closes. A server whose main pipeline transcribes live
(``ServingTraits.live_transcriber``) makes every session a transcription session (``transcription_session.py``),
GA only: a beta connection to it is refused (1008), the beta dialect's ``transcription_session.update`` not
offered."""

from __future__ import annotations

import contextlib
import hmac
import json

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketState

from omnipipe.protocol.realtime import GA, ServerEvent, negotiate_dialect
from omnipipe.protocol.worker import CLOSE_POLICY, CLOSE_TRY_AGAIN, REALTIME_PATH
from omnipipe.server.capacity import SessionTracker, at_capacity_error
from omnipipe.server.engines import EnginePool
from omnipipe.server.errors import APIError
from omnipipe.server.prometheus import ServerMetrics
from omnipipe.server.routes.realtime.events import new_event_id
from omnipipe.server.routes.realtime.session import RealtimeSession

ENDPOINT = REALTIME_PATH
router = APIRouter()


def _authorized(websocket: WebSocket, api_key: str | None) -> bool:
    if api_key is None:
        return True
    scheme, _, token = (websocket.headers.get("authorization") or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


@router.websocket(ENDPOINT)
async def realtime(websocket: WebSocket) -> None:
    pool: EnginePool = websocket.app.state.pool
    metrics: ServerMetrics = websocket.app.state.metrics
    if not _authorized(websocket, pool.config.api_key):
        await websocket.close(code=CLOSE_POLICY)  # before accept: the handshake is answered 403
        metrics.count_request(ENDPOINT, 403)
        return
    dialect, subprotocol = negotiate_dialect(websocket.headers)
    await websocket.accept(subprotocol=subprotocol)
    metrics.count_request(ENDPOINT, 101)
    tracker: SessionTracker = websocket.app.state.sessions
    handle = tracker.open("realtime")
    if handle is None:
        await _refuse(websocket, at_capacity_error(tracker.capacity))
        return
    try:
        try:
            engine, pipeline = await pool.engine_for(_endpoint(pool, dialect))
        except APIError as exc:
            await _refuse(websocket, exc)
            return
        session = RealtimeSession(websocket, engine, pipeline, pool, metrics, handle, dialect)
        await session.run()
        if websocket.application_state != WebSocketState.DISCONNECTED and \
                websocket.client_state != WebSocketState.DISCONNECTED:
            with contextlib.suppress(Exception):  # already gone
                await websocket.close()
    finally:
        handle.close()


def _endpoint(pool: EnginePool, dialect: str) -> str:
    """The endpoint whose pipeline serves the session: the transcription pipeline on a server whose main pipeline
    transcribes live (GA only, else an APIError), else the chat one."""
    main = pool.main.pipeline
    if not main.serving.live_transcriber:
        return "chat"
    if dialect != GA:
        raise APIError(400, f"pipeline {main.name!r} serves transcription sessions in the GA dialect only "
                       "(session.type transcription); the beta dialect's transcription_session.update is not "
                       "offered: connect without OpenAI-Beta: realtime=v1", param="OpenAI-Beta",
                       code="unsupported_dialect")
    return "transcription"


async def _refuse(websocket: WebSocket, exc: APIError) -> None:
    """An ``error`` event, then close: 1013 (try again later) for 429/503, else 1008."""
    with contextlib.suppress(Exception):  # already gone
        await websocket.send_text(json.dumps({"type": ServerEvent.ERROR, "event_id": new_event_id(), "error": {
            "type": exc.type, "code": exc.code, "message": exc.message, "param": exc.param, "event_id": None}}))
        await websocket.close(code=CLOSE_TRY_AGAIN if exc.status in (429, 503) else CLOSE_POLICY)
