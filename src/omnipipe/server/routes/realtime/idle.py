"""The idle timeout of a realtime session (an extension; a worker's ``--idle-timeout-s``): a session that is not
paused and in which for that long nobody spoke, nothing was committed or typed and no answer ran is sent
``session.idle_warning`` ``{closes_in_s}`` before the end, then an ``error`` (code ``idle_timeout``), and is closed
(1000), so an open page nobody uses gives its worker slot back. Any activity restarts the count."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Protocol

from omnipipe.protocol.realtime import IDLE_TIMEOUT, IDLE_WARNING_S, ServerEvent
from omnipipe.protocol.worker import CLOSE_NORMAL
from omnipipe.server.routes.realtime.core import SessionCore

if TYPE_CHECKING:
    from omnipipe.server.routes.realtime.pause import SessionPause

IDLE_POLL_S = 0.5  # how often the idle watch looks


class _Responses(Protocol):
    """The session's responses (``response.Responses``): a running answer is activity."""

    @property
    def running(self) -> bool: ...


class IdleSession(SessionCore, Protocol):
    """What the idle watch uses of its session: whether it is paused or answering (neither counts as idle)."""

    pause: SessionPause

    @property
    def responses(self) -> _Responses: ...


class IdleWatch:
    """When the session last saw activity, and the task that closes it once it has been idle too long."""

    def __init__(self, session: IdleSession) -> None:
        self.session = session
        self.timeout_s = session.pool.config.idle_timeout_s  # None: never
        self._last_activity = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._closing = False  # the watch is closing the session (it must not be cancelled mid-close)

    def touch(self) -> None:
        """Something happened in the session (speech, a commit, an item, an answer): the idle count restarts."""
        self._last_activity = time.monotonic()

    def start(self) -> None:
        if self.timeout_s is not None:
            self._task = asyncio.create_task(self._watch(), name="omnipipe-realtime-idle")

    async def stop(self) -> None:
        if self._task is not None:
            if not self._closing:
                self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        assert self.timeout_s is not None
        session = self.session
        warned = False
        while not session.closed:
            if session.pause.paused or session.responses.running:  # a pause has its own timeout; an answer is activity
                self.touch()
            idle_s = time.monotonic() - self._last_activity
            left_s = self.timeout_s - idle_s
            if left_s <= 0:
                self._closing = True
                await session.send_error(f"nothing happened in the session for {self.timeout_s:g} s; closing it "
                                         "to free its place", code=IDLE_TIMEOUT)
                session.closed = True
                with contextlib.suppress(Exception):  # already gone
                    await session.ws.close(code=CLOSE_NORMAL, reason=IDLE_TIMEOUT)
                return
            if left_s <= IDLE_WARNING_S and not warned:
                warned = True
                await session.send(ServerEvent.SESSION_IDLE_WARNING, closes_in_s=round(left_s, 1))
            elif left_s > IDLE_WARNING_S:
                warned = False
            await asyncio.sleep(min(IDLE_POLL_S, max(left_s, 0.01)))
