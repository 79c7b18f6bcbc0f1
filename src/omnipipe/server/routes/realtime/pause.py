"""Pausing a realtime session (an extension): ``session.pause`` cancels a response in progress and clears the
uncommitted input audio and camera frames; while paused, appended audio and frames are dropped unread and
``response.create`` is refused. A pause longer than the server's pause timeout closes the session (``error`` code
``pause_timeout``, then 1000)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from omnipipe.protocol.realtime import PAUSE_TIMEOUT, ServerEvent

if TYPE_CHECKING:
    from omnipipe.server.capacity import Session
    from omnipipe.server.routes.realtime.events import Send, SendError


class SessionPause:
    """Whether the session is paused, and the timer that closes it when a pause lasts too long. ``timeout_s``: the
    server's pause timeout; ``handle``: the session's place in the server's session count (paused with it);
    ``stop_input``: what a pause stops (the turn's answer and uncommitted audio, the camera frames); ``send`` and
    ``send_error``: the session's events; ``close``: close the session for a reason."""

    def __init__(self, timeout_s: float, handle: Session | None, *, stop_input: Callable[[], Awaitable[None]],
                 send: Send, send_error: SendError, close: Callable[[str], Awaitable[None]]) -> None:
        self.paused = False
        self.timeout_s = timeout_s
        self.handle = handle
        self.stop_input = stop_input
        self.send = send
        self.send_error = send_error
        self.close = close
        self._timer: asyncio.Task[None] | None = None
        self._timing_out = False

    async def on_pause(self, _: Any) -> None:
        """Pause (idempotent), answered with ``session.paused`` ``{pause_timeout_s}``."""
        if not self.paused:
            self.paused = True
            if self.handle is not None:
                self.handle.pause()
            await self.stop_input()
            self._timer = asyncio.create_task(self._time_out(), name="omnipipe-realtime-pause")
        await self.send(ServerEvent.SESSION_PAUSED, pause_timeout_s=self.timeout_s)

    async def on_resume(self, _: Any) -> None:
        """Resume (idempotent), answered with ``session.resumed``."""
        if self.paused:
            await self.stop_timer()
            self.paused = False
            if self.handle is not None:
                self.handle.resume()
        await self.send(ServerEvent.SESSION_RESUMED)

    async def _time_out(self) -> None:
        await asyncio.sleep(self.timeout_s)
        self._timing_out = True
        await self.send_error(f"the session was paused for more than {self.timeout_s:g} s; closing it",
                              code=PAUSE_TIMEOUT)
        await self.close(PAUSE_TIMEOUT)

    async def stop_timer(self) -> None:
        """Stop the pause timer (one already closing the session is left to finish)."""
        timer, self._timer = self._timer, None
        if timer is None:
            return
        if not self._timing_out:
            timer.cancel()
        await asyncio.gather(timer, return_exceptions=True)
