"""What every part of a realtime session may use of the session (``SessionCore``, a Protocol ``RealtimeSession``
satisfies): its connection, engine, pipeline, engine pool, metrics, settings and dialect, whether it is closed, and
the one way events are sent. A part that also reaches another part says so in a narrow Protocol of its own module
(a part below it by its class, one above it by the few members it uses), so the parts never import the session."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fastapi import WebSocket

    from omnipipe.api.async_omni import AsyncOmni
    from omnipipe.config.pipeline_spec import PipelineSpec
    from omnipipe.server.engines import EnginePool
    from omnipipe.server.prometheus import ServerMetrics
    from omnipipe.server.realtime_settings import Settings


class SessionCore(Protocol):
    """A realtime session as each of its parts sees it."""

    ws: WebSocket
    engine: AsyncOmni
    pipeline: PipelineSpec
    pool: EnginePool
    metrics: ServerMetrics
    settings: Settings
    dialect: str
    session_id: str
    closed: bool

    async def send(self, type_: str, **fields: Any) -> None:
        """Send a server event (renamed for the beta dialect; nothing once the session is closed)."""

    async def send_error(self, message: str, *, param: str | None = None, code: str | None = None,
                         type_: str = "invalid_request_error", client_event_id: str | None = None) -> None:
        """Send an ``error`` event."""
