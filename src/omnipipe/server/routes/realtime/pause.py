"""Pausing a realtime session (an extension): ``session.pause`` cancels a response in progress and clears the
uncommitted input audio and camera frames; while paused, appended audio and frames are dropped unread and
``response.create`` is refused. A pause longer than the server's pause timeout closes the session (``error`` code
``pause_timeout``, then 1000)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, Protocol

from omnipipe.protocol.realtime import PAUSE_TIMEOUT, ServerEvent
from omnipipe.protocol.worker import CLOSE_NORMAL
from omnipipe.server.routes.realtime.core import SessionCore

if TYPE_CHECKING:
    from omnipipe.server.capacity import Session


class _Turn(Protocol):
    """The turn (``turn.TurnController``): a pause cancels its answer and drops its uncommitted audio."""

    async def session_paused(self) -> None: ...


class _Frames(Protocol):
    """The camera frames (``frames.CameraFrames``), which a pause drops."""

    def clear(self) -> None: ...


class PauseSession(SessionCore, Protocol):
    """What a pause uses of its session: its place in the server's session count (``handle``) and the parts a pause
    stops."""

    handle: Session | None

    @property
    def turn(self) -> _Turn: ...

    @property
    def frames(self) -> _Frames: ...


class SessionPause:
    """Whether the session is paused, and the timer that closes it when a pause lasts too long."""

    def __init__(self, session: PauseSession) -> None:
        self.session = session
        self.paused = False
        self.timeout_s = session.pool.config.pause_timeout_s
        self._timer: asyncio.Task[None] | None = None
        self._timing_out = False

    async def on_pause(self, _: Any) -> None:
        """Pause (idempotent), answered with ``session.paused`` ``{pause_timeout_s}``."""
        session = self.session
        if not self.paused:
            self.paused = True
            if session.handle is not None:
                session.handle.pause()
            await session.turn.session_paused()
            session.frames.clear()
            self._timer = asyncio.create_task(self._time_out(), name="omnipipe-realtime-pause")
        await session.send(ServerEvent.SESSION_PAUSED, pause_timeout_s=self.timeout_s)

    async def on_resume(self, _: Any) -> None:
        """Resume (idempotent), answered with ``session.resumed``."""
        session = self.session
        if self.paused:
            await self.stop_timer()
            self.paused = False
            if session.handle is not None:
                session.handle.resume()
        await session.send(ServerEvent.SESSION_RESUMED)

    async def _time_out(self) -> None:
        session = self.session
        await asyncio.sleep(self.timeout_s)
        self._timing_out = True
        await session.send_error(f"the session was paused for more than {self.timeout_s:g} s; closing it",
                                 code=PAUSE_TIMEOUT)
        session.closed = True
        with contextlib.suppress(Exception):  # already gone
            await session.ws.close(code=CLOSE_NORMAL, reason=PAUSE_TIMEOUT)

    async def stop_timer(self) -> None:
        """Stop the pause timer (one already closing the session is left to finish)."""
        timer, self._timer = self._timer, None
        if timer is None:
            return
        if not self._timing_out:
            timer.cancel()
        await asyncio.gather(timer, return_exceptions=True)
