"""The admin API (``/api/admin/...``): workers, queue, running and recorded sessions, share links, ETA baselines,
apps, cleanup. Every route needs the admin token as ``Authorization: Bearer TOKEN`` or ``X-Admin-Token: TOKEN``."""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
from typing import Any

from fastapi import APIRouter, Depends, Request

from omnipipe.gateway.config import REQUEST_TYPES
from omnipipe.gateway.pool import WorkerPool
from omnipipe.gateway.shares import ShareNotFound
from omnipipe.protocol.errors import APIError


def require_admin(request: Request) -> None:
    token: str | None = request.app.state.config.admin_token
    if token is None:
        raise APIError(401, "the admin API is disabled: start the gateway with --admin-token", code="admin_disabled")
    given = request.headers.get("x-admin-token")
    if given is None:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        given = value.strip() if scheme.lower() == "bearer" else None
    if not given:
        raise APIError(401, "admin token required (Authorization: Bearer TOKEN)", code="admin_token_required",
                       headers={"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise APIError(401, "admin token refused", code="admin_token_invalid", headers={"WWW-Authenticate": "Bearer"})


router = APIRouter(prefix="/api/admin", dependencies=[Depends(require_admin)])


async def _json_object(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise APIError(400, "body: not valid JSON", param="body", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "body: expected a JSON object", param="body")
    return body


@router.get("/workers")
async def workers(request: Request) -> list[dict[str, Any]]:
    pool = request.app.state.pool
    now = pool.now()
    return [{"address": w.address, "state": w.state.name, "online": w.online, "capacity": w.capacity,
             "active_sessions": w.active_sessions, "reason": w.health_reason,
             "last_ok_s_ago": None if w.last_ok_at is None else round(now - w.last_ok_at, 1)}
            for w in pool.workers]


@router.get("/queue")
async def queue(request: Request) -> list[dict[str, Any]]:
    pool = request.app.state.pool
    pool.refresh_estimates()  # the running sessions have run on since the last change
    now = pool.now()
    return [{"ticket_id": t.ticket_id, "request_type": t.request_type, "position": t.position,
             "estimated_wait_s": None if t.estimated_wait_s is None else round(t.estimated_wait_s, 1),
             "starting": t.starting, "waited_s": round(now - t.enqueued_at, 1)}
            for t in pool.waiting_tickets()]


def cancel_ticket(pool: WorkerPool, ticket_id: str) -> dict[str, str]:
    """Withdraw a waiting request (for the admin, and for its own client); 404 if it is not waiting."""
    if not pool.cancel(ticket_id):
        raise APIError(404, f"ticket_id: no waiting request {ticket_id!r}", param="ticket_id", code="not_found")
    return {"cancelled": ticket_id}


@router.delete("/queue/{ticket_id}")
async def cancel(ticket_id: str, request: Request) -> dict[str, str]:
    return cancel_ticket(request.app.state.pool, ticket_id)


@router.get("/sessions")
async def running_sessions(request: Request) -> list[dict[str, Any]]:
    return [s.summary() for s in request.app.state.sessions.running()]


@router.get("/recordings")
async def recordings(request: Request) -> list[dict[str, Any]]:
    summaries = await asyncio.to_thread(request.app.state.store.list_sessions)
    return [{"session_id": s.session_id, "type": s.type, "created_at": s.created_at, "ended_at": s.ended_at,
             "status": s.status, "size_bytes": s.size_bytes} for s in summaries]


@router.get("/shares")
async def shares(request: Request) -> list[dict[str, Any]]:
    return [share.summary() for share in request.app.state.shares.list_shares()]


@router.delete("/shares/{share_id}")
async def revoke_share(share_id: str, request: Request) -> dict[str, Any]:
    try:
        share = await asyncio.to_thread(request.app.state.shares.revoke, share_id)
    except ShareNotFound:
        raise APIError(404, f"share_id: no share {share_id!r}", param="share_id", code="not_found") from None
    return share.summary()


@router.get("/eta")
async def eta(request: Request) -> dict[str, Any]:
    return request.app.state.pool.eta.snapshot()


@router.put("/eta")
async def set_eta(request: Request) -> dict[str, Any]:
    body = await _json_object(request)
    baselines = body.get("baselines")
    if not isinstance(baselines, dict):
        raise APIError(400, "baselines: expected an object {request_type: seconds}", param="baselines")
    for name, seconds in baselines.items():
        if name not in REQUEST_TYPES:
            raise APIError(400, f"baselines.{name}: unknown request type (types: {', '.join(REQUEST_TYPES)})",
                           param=f"baselines.{name}")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                or seconds < 0:
            raise APIError(400, f"baselines.{name}: expected a number of seconds >= 0, got {seconds!r}",
                           param=f"baselines.{name}")
    pool = request.app.state.pool
    for name, seconds in baselines.items():
        pool.eta.set_baseline(name, float(seconds))
    pool.refresh_estimates()
    return pool.eta.snapshot()


@router.get("/apps")
async def apps(request: Request) -> dict[str, bool]:
    return request.app.state.apps.snapshot()


@router.put("/apps")
async def set_apps(request: Request) -> dict[str, bool]:
    return request.app.state.apps.update(await _json_object(request))


@router.post("/cleanup")
async def cleanup(request: Request) -> dict[str, Any]:
    from omnipipe.gateway.recording.cleanup import cleanup_sessions

    state = request.app.state
    started = time.monotonic()
    report = await asyncio.to_thread(cleanup_sessions, state.store, retention_days=state.config.retention_days,
                                     max_storage_gb=state.config.max_storage_gb, protect=state.sessions.ids())
    return {**report.to_dict(), "seconds": round(time.monotonic() - started, 3)}
