"""The idle timeout of a realtime session (an extension; a worker's ``--idle-timeout-s``): a session that is not
paused and in which for that long nobody spoke, nothing was committed or typed and no answer ran is sent
``session.idle_warning`` ``{closes_in_s}`` before the end, then an ``error`` (code ``idle_timeout``), and is closed
(1000), so an open page nobody uses gives its worker slot back. Any activity restarts the count."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from omnipipe.protocol.realtime import IDLE_TIMEOUT, IDLE_WARNING_S, ServerEvent

if TYPE_CHECKING:
    from omnipipe.server.routes.realtime.events import Send, SendError

IDLE_POLL_S = 0.5  # how often the idle watch looks


class IdleWatch:
    """When the session last saw activity, and the task that closes it once it has been idle too long.
    ``timeout_s``: the server's idle timeout (None: never); ``busy``: whether the session is paused or answering
    (neither counts as idle); ``closed``: whether the session is closed; ``send`` and ``send_error``: the session's
    events; ``close``: close the session for a reason."""

    def __init__(self, timeout_s: float | None, *, busy: Callable[[], bool], closed: Callable[[], bool],
                 send: Send, send_error: SendError, close: Callable[[str], Awaitable[None]]) -> None:
        self.timeout_s = timeout_s
        self.busy = busy
        self.closed = closed
        self.send = send
        self.send_error = send_error
        self.close = close
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
        warned = False
        while not self.closed():
            if self.busy():  # a pause has its own timeout; an answer is activity
                self.touch()
            idle_s = time.monotonic() - self._last_activity
            left_s = self.timeout_s - idle_s
            if left_s <= 0:
                self._closing = True
                await self.send_error(f"nothing happened in the session for {self.timeout_s:g} s; closing it "
                                      "to free its place", code=IDLE_TIMEOUT)
                await self.close(IDLE_TIMEOUT)
                return
            if left_s <= IDLE_WARNING_S and not warned:
                warned = True
                await self.send(ServerEvent.SESSION_IDLE_WARNING, closes_in_s=round(left_s, 1))
            elif left_s > IDLE_WARNING_S:
                warned = False
            await asyncio.sleep(min(IDLE_POLL_S, max(left_s, 0.01)))
