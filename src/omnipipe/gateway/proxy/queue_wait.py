"""Waiting for a worker, shared by the HTTP and realtime proxies: a place in the queue with position updates, and
the retry of a worker's ``worker_at_capacity`` refusal just after it was assigned.

The queue messages (``queued``, ``queue_update``; the proxies add ``queue_done``) go to realtime clients as JSON
events and to chat clients that ask for them as ``event: queue`` SSE events (docs/gateway.md).
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

    def _place(self) -> tuple[int, float]:
        return self.ticket.position, round(self.ticket.estimated_wait_s, 1)

    async def updates(self, *, until: Callable[[], Awaitable[bool]] | None = None, wake: asyncio.Event | None = None,
                      poll_s: float | None = None) -> AsyncIterator[dict[str, Any]]:
        """Yield ``queued`` at once, then ``queue_update`` whenever the place or the estimate changes, until a
        worker is assigned or the ticket is withdrawn; or until ``until()`` is true, asked whenever ``wake`` is set,
        the queue changes, or ``poll_s`` has passed."""
        assert self._waiter is not None, "use QueueWait in 'async with'"
        waiter = self._waiter
        self._changed.clear()  # cleared just before each read of the place: a change made meanwhile is not lost
        position, wait_s = last = self._place()
        yield {"type": QUEUED, "position": position, "estimated_wait_s": wait_s, "ticket_id": self.ticket.ticket_id}
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
            if now != last:
                last = now
                yield {"type": QUEUE_UPDATE, "position": now[0], "estimated_wait_s": now[1]}
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
