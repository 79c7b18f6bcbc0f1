"""The worker protocol: what an ``omnipipe worker`` and the gateway in front of it both speak (docs/gateway.md).

The server (``omnipipe.server``) produces it and the gateway (``omnipipe.gateway``) reads it; both import it from
here, and neither imports the other. Imports nothing heavy.

- ``GET /health`` answers ``WorkerHealth`` (200 when the worker can serve, 503 while loading, degraded or failed);
  ``state`` is a ``WorkerState`` name other than ``OFFLINE`` (``ERROR`` while degraded).
- Beyond its capacity a worker answers HTTP 429 with the OpenAI error code ``AT_CAPACITY`` and ``Retry-After``,
  or refuses a realtime WebSocket with an ``error`` event of that code and close ``CLOSE_TRY_AGAIN``.
- The WebSocket close codes below are the ones the worker and the gateway send on ``/v1/realtime``.
"""

from __future__ import annotations

from enum import Enum
from typing import TypedDict

# -- paths both ends use ----------------------------------------------------------------------------------------
HEALTH_PATH = "/health"
MODELS_PATH = "/v1/models"
CHAT_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"
SPEECH_PATH = "/v1/audio/speech"
VOICES_PATH = "/v1/audio/voices"
TRANSCRIPTION_PATH = "/v1/audio/transcriptions"
REALTIME_PATH = "/v1/realtime"
IMAGES_PATH = "/v1/images/generations"

DEFAULT_MAX_BODY_BYTES = 32 << 20
"""Default limit on a request body (and a realtime session's uncommitted input audio), worker and gateway alike."""


# -- states -------------------------------------------------------------------------------------------------------
class WorkerState(str, Enum):  # noqa: UP042 - a StrEnum would change what str() and format() of a state give
    """States a worker reports from its /health endpoint, plus the gateway-only ``OFFLINE``."""

    LOADING = "loading"
    IDLE = "idle"
    BUSY = "busy"
    DUPLEX_ACTIVE = "duplex_active"
    DUPLEX_PAUSED = "duplex_paused"
    ERROR = "error"
    OFFLINE = "offline"


BUSY_STATES = frozenset({WorkerState.BUSY, WorkerState.DUPLEX_ACTIVE, WorkerState.DUPLEX_PAUSED})
"""Reported states meaning the worker is serving a session."""

BLOCKED_STATES = frozenset({WorkerState.LOADING, WorkerState.ERROR, WorkerState.OFFLINE})
"""Reported states in which a worker takes no new sessions at all."""


class SessionCounts(TypedDict):
    http: int
    realtime: int
    paused: int


class StageHealthReply(TypedDict):
    """One stage in ``/health``: ``state`` is ok, stalled, restarting or down."""

    state: str
    pid: int | None
    restarts: int
    heartbeat_age_s: float | None
    no_progress_s: float | None
    stalls: int


class CompanionHealthReply(TypedDict, total=False):
    """One companion pipeline in ``/health`` (by endpoint: ``speech``, ``transcription``): its ``status`` is idle
    (starts on first use), loading, ready or failed (with ``error``); ``preloaded``: started with the worker."""

    pipeline: str
    status: str
    preloaded: bool
    error: str


class WorkerHealth(TypedDict, total=False):
    """The JSON of a worker's ``GET /health``; ``error`` when the main pipeline failed to start or is degraded
    (a stage stalled, restarting or down, or the engine loop not running: ``problems`` lists each). ``status`` stays
    "loading" until the companions the worker preloads have loaded too (``companions``), so a gateway sends it
    sessions only once their first turn is served at full speed."""

    status: str  # "loading" | "ready" | "degraded" | "failed"
    state: str  # a WorkerState name (never OFFLINE)
    pipeline: str
    models: list[str]
    active_sessions: int
    capacity: int | None  # None: no limit (plain ``omnipipe serve``)
    sessions: SessionCounts
    stages: dict[str, StageHealthReply]  # once the engine has started
    problems: list[str]
    companions: dict[str, CompanionHealthReply]
    error: str


def parse_health(body: object) -> tuple[WorkerState, str | None, int | None]:
    """The state, failure reason and capacity a worker's ``/health`` JSON reports.

    Raises ``ValueError`` for a reply that is not the worker protocol (e.g. a plain ``omnipipe serve``
    of an older version, or something else listening on the port).
    """
    if not isinstance(body, dict) or not isinstance(body.get("state"), str):
        raise ValueError("health reply has no 'state' field")
    try:
        state = WorkerState[body["state"].upper()]
    except KeyError:
        raise ValueError(f"health reply has an unknown state {body['state']!r}") from None
    if state is WorkerState.OFFLINE:
        raise ValueError("a worker cannot report itself OFFLINE")
    reason = body.get("error") if isinstance(body.get("error"), str) else None
    capacity = body.get("capacity")
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
        capacity = None
    return state, reason, capacity


# -- capacity -----------------------------------------------------------------------------------------------------
AT_CAPACITY = "worker_at_capacity"
"""OpenAI error ``code`` of a worker's refusal beyond its capacity (HTTP 429, or the realtime ``error`` event)."""


def is_at_capacity(body: str | bytes) -> bool:
    """Whether a worker's refusal (an HTTP error body or a realtime event, as sent) carries ``AT_CAPACITY``."""
    needle = f'"{AT_CAPACITY}"'
    return needle.encode() in body if isinstance(body, bytes) else needle in body


# -- WebSocket close codes on /v1/realtime (RFC 6455) ---------------------------------------------------------------
CLOSE_NORMAL = 1000
"""The session ended: the client closed, or the worker closed a session paused past its pause timeout."""
CLOSE_GOING_AWAY = 1001
"""The peer is going away (e.g. a server shutting down); the gateway treats it like ``CLOSE_NORMAL``."""
CLOSE_ABNORMAL = 1006
"""Never sent: what a WebSocket library reports when the connection dropped without a close frame."""
CLOSE_POLICY = 1008
"""Refused for good: a handshake without the API key or from another origin, a disabled app, a refusal that
retrying will not fix."""
CLOSE_TOO_BIG = 1009
"""The gateway: the client sent more than it may hold while queued."""
CLOSE_INTERNAL = 1011
"""The gateway: the worker failed (mid-session or at connect), or the gateway itself failed."""
CLOSE_TRY_AGAIN = 1013
"""Try again later: the worker is at capacity (``AT_CAPACITY``) or still loading; the gateway's queue is full or
the client's place in it was cancelled."""
