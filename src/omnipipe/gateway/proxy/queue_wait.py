"""Waiting for a worker, shared by the HTTP and realtime proxies: a place in the queue with position updates, and
the retry of a worker's ``worker_at_capacity`` refusal just after it was assigned.

The queue messages (``queued``, ``queue_update``; the proxies add ``queue_done``) go to realtime clients as JSON
events and to chat clients that ask for them as ``event: queue`` SSE events (docs/gateway.md). Each carries the
place, the estimated wait (``None`` when no worker slot serves the queue) and whether the service is starting
(workers loading). A client counts the estimate down itself; an update comes when the place or the starting state
changes, or when the pool's estimate has drifted ``RESYNC_S`` or more from that countdown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, Self, TypeVar

from omnipipe.gateway.pool import Ticket, WorkerPool
from omnipipe.gateway.worker import Worker

QUEUED = "queued"
QUEUE_UPDATE = "queue_update"
QUEUE_DONE = "queue_done"
CAPACITY_RETRY_S = 3.0
"""How long after the first try a worker's ``worker_at_capacity`` refusal is retried."""
_CAPACITY_RETRY_PAUSE_S = 0.05
RESYNC_S = 1.0
"""How far the pool's estimate may drift from the client's countdown of the last one sent before an update."""
T = TypeVar("T")


class QueueWait:
    """``async with QueueWait(pool, ticket) as wait``: ``wait.updates()`` waits for the ticket's worker.

    It ends served (a worker), ``cancelled`` (the ticket was withdrawn: admin, ``DELETE /api/queue``, shutdown) or
    ``stopped`` (the caller's ``until`` said so: the client left). Leaving the block stops waiting; ``wait.worker``
    is then the worker the ticket got however the wait ended (one assigned just as the client left included), so
    the caller releases it.
    """

    def __init__(self, pool: WorkerPool, ticket: Ticket) -> None:
        self.pool = pool
        self.ticket = ticket
        self.worker: Worker | None = None
        self.cancelled = False
        self.stopped = False
        self._changed = asyncio.Event()
        self._remove_listener: Callable[[], None] | None = None
        self._waiter: asyncio.Future[Worker] | None = None

    async def __aenter__(self) -> Self:
        self._remove_listener = self.pool.add_listener(self._changed.set)
        self._waiter = asyncio.ensure_future(self.pool.wait(self.ticket))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._remove_listener is not None:
            self._remove_listener()
        waiter = self._waiter
        if waiter is None:
            return
        if not waiter.done():
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
        if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            self.worker = waiter.result()

    def _place(self) -> dict[str, Any]:
        """The place now; the estimate, made at the pool's last change, counted down to now."""
        wait = self.ticket.estimated_wait_s
        if wait is not None and self.ticket.estimated_at is not None:
            wait = max(0.0, wait - (self.pool.now() - self.ticket.estimated_at))
        return {"position": self.ticket.position, "estimated_wait_s": None if wait is None else round(wait, 1),
                "starting": self.ticket.starting}

    def _worth_sending(self, now: dict[str, Any], last: dict[str, Any], elapsed_s: float) -> bool:
        """Whether ``now`` differs from the client's view of ``last``, counted down for ``elapsed_s``."""
        if (now["position"], now["starting"]) != (last["position"], last["starting"]):
            return True
        if now["estimated_wait_s"] is None or last["estimated_wait_s"] is None:
            return (now["estimated_wait_s"] is None) != (last["estimated_wait_s"] is None)
        counted_down = max(0.0, last["estimated_wait_s"] - elapsed_s)
        return abs(now["estimated_wait_s"] - counted_down) >= RESYNC_S

    async def updates(self, *, until: Callable[[], Awaitable[bool]] | None = None, wake: asyncio.Event | None = None,
                      poll_s: float | None = None) -> AsyncIterator[dict[str, Any]]:
        """Yield ``queued`` at once, then ``queue_update`` whenever the place or the starting state changes or the
        estimate drifts from its countdown, until a worker is assigned or the ticket is withdrawn; or until
        ``until()`` is true, asked whenever ``wake`` is set, the queue changes, or ``poll_s`` has passed."""
        assert self._waiter is not None, "use QueueWait in 'async with'"
        waiter = self._waiter
        self._changed.clear()  # cleared just before each read of the place: a change made meanwhile is not lost
        last = self._place()
        sent_at = self.pool.now()
        yield {"type": QUEUED, **last, "ticket_id": self.ticket.ticket_id}
        while not waiter.done():
            helpers = [asyncio.ensure_future(self._changed.wait())]
            if wake is not None:
                helpers.append(asyncio.ensure_future(wake.wait()))
            try:
                await asyncio.wait({waiter, *helpers}, timeout=poll_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for helper in helpers:
                    helper.cancel()
            if waiter.done():
                break
            if until is not None and await until():
                self.stopped = True
                return
            self._changed.clear()
            now = self._place()
            if self._worth_sending(now, last, self.pool.now() - sent_at):
                last, sent_at = now, self.pool.now()
                yield {"type": QUEUE_UPDATE, **now}
        if waiter.cancelled():
            self.cancelled = True
        else:
            self.worker = waiter.result()


async def retry_at_capacity(attempt: Callable[[], Awaitable[T]], refused: Callable[[T], Awaitable[bool]],
                            window_s: float = CAPACITY_RETRY_S) -> T:
    """``await attempt()``, again while ``await refused(result)`` says the worker answered ``worker_at_capacity``
    (``refused`` closes what that attempt opened), for up to ``window_s`` after the first try.

    A worker counts a session until it has processed its end, a moment after the gateway released it; a refusal in
    that moment is not the worker being full. After ``window_s`` the refusal is returned as it is.
    """
    deadline = asyncio.get_running_loop().time() + window_s
    while True:
        result = await attempt()
        if asyncio.get_running_loop().time() >= deadline or not await refused(result):
            return result
        await asyncio.sleep(_CAPACITY_RETRY_PAUSE_S)
