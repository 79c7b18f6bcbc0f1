"""FIFO assignment of requests to workers, with a single dispatch point.

Every waiting request holds an ``asyncio.Future`` that resolves to its ``Worker``.  Assignment happens
only in ``WorkerPool._dispatch_next``, which runs whenever a request arrives, a worker is released, a
waiter cancels or a health reply arrives, and which counts the session on the worker in the same step as
it chooses it.  All methods except ``wait`` are synchronous and must run on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from omnipipe.gateway.eta import EtaEstimator, RunningSession
from omnipipe.gateway.worker import Worker
from omnipipe.protocol.worker import BLOCKED_STATES, BUSY_STATES, WorkerState


class QueueFullError(Exception):
    """The queue already holds ``max_queue`` waiters; retry after about ``retry_after_s`` seconds."""

    def __init__(self, max_queue: int, retry_after_s: float) -> None:
        super().__init__(f"queue is full ({max_queue} waiting); retry after ~{retry_after_s:.0f}s")
        self.max_queue = max_queue
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class Ticket:
    """One request's place in the pool; ``future`` resolves to the assigned worker.

    ``position`` is 1-based while waiting and 0 once assigned; it, ``estimated_wait_s`` and ``starting`` are kept
    current by the pool. ``estimated_wait_s`` is ``None`` when no worker slot serves the queue (``starting`` says
    whether that is because the workers are still loading); ``estimated_at`` is the pool's time it was made at.
    """

    ticket_id: str
    request_type: str
    future: asyncio.Future[Worker]
    enqueued_at: float
    position: int = 0
    estimated_wait_s: float | None = 0.0
    estimated_at: float | None = None
    starting: bool = False
    worker: Worker | None = None
    assigned_at: float | None = None
    released: bool = field(default=False, repr=False)

    @property
    def waiting(self) -> bool:
        """Still queued: neither assigned nor cancelled."""
        return not self.future.done()


@dataclass(frozen=True)
class QueuePosition:
    """A waiter's place, as sent to clients in queue updates."""

    ticket_id: str
    request_type: str
    position: int
    estimated_wait_s: float | None
    starting: bool


class WorkerPool:
    """Workers plus a FIFO of waiting requests; at most ``max_queue`` requests wait at once.

    A worker is offline after ``offline_after_failures`` consecutive failed health checks and is never
    chosen while offline.  Among workers with room, the least loaded, then least recently assigned, wins.
    """

    def __init__(
        self,
        workers: Iterable[Worker] = (),
        *,
        max_queue: int = 100,
        eta: EtaEstimator | None = None,
        offline_after_failures: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if offline_after_failures < 1:
            raise ValueError(f"offline_after_failures must be >= 1, got {offline_after_failures}")
        self.max_queue = max_queue
        self.eta = eta if eta is not None else EtaEstimator()
        self.offline_after_failures = offline_after_failures
        self._clock = clock
        self._workers: dict[str, Worker] = {}
        self._queue: OrderedDict[str, Ticket] = OrderedDict()
        self._running: dict[str, Ticket] = {}  # assigned and not yet released, by ticket id
        self._listeners: list[Callable[[], None]] = []
        for worker in workers:
            self._add(worker)

    def now(self) -> float:
        """The pool's clock (monotonic seconds), for timestamps compared with the pool's own."""
        return self._clock()

    # -- workers -----------------------------------------------------------------------------------

    @property
    def workers(self) -> tuple[Worker, ...]:
        """Registered workers, in registration order."""
        return tuple(self._workers.values())

    def worker(self, address: str) -> Worker:
        """The worker at ``address``; ``KeyError`` if unknown."""
        return self._workers[address]

    def add_worker(self, worker: Worker) -> None:
        """Register a worker; it is chosen once it has room (normally after a healthy IDLE reply)."""
        self._add(worker)
        self._dispatch_next()

    def _add(self, worker: Worker) -> None:
        if worker.address in self._workers:
            raise ValueError(f"worker {worker.address} is already registered")
        self._workers[worker.address] = worker

    @property
    def total_capacity(self) -> int:
        """Session slots on workers that are online and not loading or failed."""
        return sum(w.capacity for w in self._workers.values() if w.state not in BLOCKED_STATES)

    @property
    def starting(self) -> bool:
        """The service is starting: no worker can take a session yet, and at least one is on its way (it reports
        ``LOADING``, or has not answered a health check since the gateway started)."""
        if self.total_capacity > 0:
            return False
        return any((w.online and w.health_state is WorkerState.LOADING) or w.last_ok_at is None
                   for w in self._workers.values())

    def running_sessions(self) -> list[Ticket]:
        """The tickets holding a worker now (assigned, not yet released), oldest first."""
        return sorted(self._running.values(), key=lambda t: t.assigned_at or 0.0)

    # -- queue -------------------------------------------------------------------------------------

    @property
    def queue_length(self) -> int:
        """Requests currently waiting."""
        return sum(1 for t in self._queue.values() if t.waiting)

    def enqueue(self, request_type: str, *, front: bool = False) -> Ticket:
        """Take a place for ``request_type``; served at once when nobody waits and a worker has room.

        Raises ``QueueFullError`` when the request would have to wait and ``max_queue`` requests already
        do.  ``front=True`` puts the request at the head of the queue, past the limit (a request whose
        worker could not be reached gets its turn back).  Must be called with the event loop running.
        """
        loop = asyncio.get_running_loop()
        waiting = self.queue_length
        if not front and (waiting or self._pick_worker() is None) and waiting >= self.max_queue:
            raise QueueFullError(self.max_queue, self._retry_after_s(request_type))
        ticket = Ticket(uuid.uuid4().hex, request_type, loop.create_future(), self._clock())
        ticket.future.add_done_callback(functools.partial(self._on_future_done, ticket.ticket_id))
        self._queue[ticket.ticket_id] = ticket
        if front:
            self._queue.move_to_end(ticket.ticket_id, last=False)
        self._dispatch_next()
        return ticket

    def cancel_all(self) -> int:
        """Withdraw every waiting request (the gateway is stopping); returns how many."""
        waiting = [t.ticket_id for t in self.waiting_tickets()]
        return sum(self.cancel(ticket_id) for ticket_id in waiting)

    def cancel(self, ticket_id: str) -> bool:
        """Withdraw a waiting request; ``False`` if it is unknown or already assigned."""
        ticket = self._queue.pop(ticket_id, None)
        if ticket is None:
            return False
        if not ticket.future.cancel():
            return False
        self._dispatch_next()
        return True

    async def wait(self, ticket: Ticket) -> Worker:
        """Await the ticket's worker; if the waiting task is cancelled, the place or worker is given back."""
        try:
            return await asyncio.shield(ticket.future)
        except asyncio.CancelledError:
            if ticket.future.done() and not ticket.future.cancelled():
                self.release(ticket.future.result(), ticket)
            else:
                self.cancel(ticket.ticket_id)
            raise

    def release(self, worker: Worker | str, ticket: Ticket | None = None) -> None:
        """End one session on ``worker`` and serve the next waiter.

        With ``ticket`` the session's duration feeds the estimate for its request type, and releasing the
        same ticket twice is a no-op.
        """
        target = self._workers[worker] if isinstance(worker, str) else worker
        if self._workers.get(target.address) is not target:
            raise KeyError(f"worker {target.address} is not registered in this pool")
        now = self._clock()
        if ticket is not None:
            if ticket.worker is not target:
                raise ValueError(f"ticket {ticket.ticket_id} is not assigned to worker {target.address}")
            if ticket.released:
                return
            ticket.released = True
            self._running.pop(ticket.ticket_id, None)
            if ticket.assigned_at is not None:
                self.eta.observe(ticket.request_type, max(0.0, now - ticket.assigned_at))
        else:  # no ticket named: the session that has held this worker longest ends
            oldest = next((t for t in self.running_sessions() if t.worker is target), None)
            if oldest is not None:
                del self._running[oldest.ticket_id]
        target.release(now)
        self._dispatch_next()

    def waiting_tickets(self) -> list[Ticket]:
        """The waiting tickets, front of the queue first."""
        return [t for t in self._queue.values() if t.waiting]

    def positions(self) -> list[QueuePosition]:
        """Every waiter's current place and estimated wait, front of the queue first."""
        return [
            QueuePosition(t.ticket_id, t.request_type, t.position, t.estimated_wait_s, t.starting)
            for t in self._queue.values()
            if t.waiting
        ]

    # -- health ------------------------------------------------------------------------------------

    def apply_health(
        self,
        address: str,
        reply_state: WorkerState | None,
        ok: bool,
        *,
        reason: str | None = None,
        probe_started_at: float | None = None,
        capacity: int | None = None,
    ) -> None:
        """Fold one health check of ``address`` into the pool.

        ``ok=False`` (no answer) counts a failure and takes the worker offline after
        ``offline_after_failures`` of them.  An answer brings the worker online with ``reply_state``.
        Sessions the gateway holds are never freed by a reply: a stale IDLE changes nothing while the
        gateway has the worker busy.  A busy reply to a probe started before the gateway's last release
        on that worker is stale too and is ignored.  ``capacity``, when the worker reports one, replaces
        the worker's capacity (sessions already held stay held).
        """
        worker = self._workers[address]
        now = self._clock()
        worker.health_reason = reason
        if not ok:
            worker.consecutive_failures += 1
            if worker.consecutive_failures >= self.offline_after_failures:
                worker.online = False
            self._refresh_positions()
            return
        if reply_state is None or reply_state is WorkerState.OFFLINE:
            raise ValueError(f"an answered health check needs a reported state, got {reply_state!r}")
        if capacity is not None:
            if capacity < 1:
                raise ValueError(f"a reported capacity must be >= 1, got {capacity}")
            worker.capacity = capacity
        worker.consecutive_failures = 0
        worker.online = True
        worker.last_ok_at = now
        stale_busy = (
            reply_state in BUSY_STATES
            and worker.active_sessions == 0
            and probe_started_at is not None
            and worker.last_released_at is not None
            and probe_started_at < worker.last_released_at
        )
        if not stale_busy:
            worker.health_state = reply_state
        self._dispatch_next()

    def mark_unreachable(self, address: str, reason: str) -> None:
        """A connection to ``address`` failed: take it offline now, until a health check answers again."""
        worker = self._workers[address]
        worker.consecutive_failures = max(worker.consecutive_failures, self.offline_after_failures)
        worker.online = False
        worker.health_reason = reason
        self._refresh_positions()

    # -- dispatch ----------------------------------------------------------------------------------

    def _pick_worker(self) -> Worker | None:
        candidates = [w for w in self._workers.values() if w.has_room]
        if not candidates:
            return None
        return min(candidates, key=lambda w: (w.active_sessions, w.last_assigned_at or float("-inf")))

    def _dispatch_next(self) -> None:
        """The only place requests get workers: serve the queue head while some worker has room."""
        while self._queue:
            ticket_id, ticket = next(iter(self._queue.items()))
            if not ticket.waiting:
                del self._queue[ticket_id]
                continue
            worker = self._pick_worker()
            if worker is None:
                break
            del self._queue[ticket_id]
            now = self._clock()
            worker.mark_busy(now)
            ticket.worker = worker
            ticket.assigned_at = now
            ticket.position = 0
            ticket.estimated_wait_s = 0.0
            ticket.starting = False
            self._running[ticket.ticket_id] = ticket
            ticket.future.set_result(worker)
        self._refresh_positions()

    def refresh_estimates(self) -> None:
        """Recompute every waiter's estimate (e.g. after the ETA baselines changed)."""
        self._refresh_positions()

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` whenever waiters' positions or estimates are recomputed; returns a remover."""
        self._listeners.append(callback)
        return functools.partial(self._remove_listener, callback)

    def _remove_listener(self, callback: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(callback)

    def _slots(self) -> list[RunningSession | None]:
        """Every slot that serves the queue (workers online and not loading or failed): the session in it, or
        ``None`` when free."""
        now = self._clock()
        held: dict[str, list[RunningSession]] = {}
        for ticket in self.running_sessions():
            if ticket.worker is not None and ticket.assigned_at is not None:
                held.setdefault(ticket.worker.address, []).append(
                    RunningSession(ticket.request_type, now - ticket.assigned_at))
        slots: list[RunningSession | None] = []
        for worker in self._workers.values():
            if worker.state in BLOCKED_STATES:
                continue
            sessions = held.get(worker.address, [])
            slots += sessions
            slots += [None] * max(0, worker.capacity - len(sessions))
        return slots

    def _retry_after_s(self, request_type: str) -> float:
        """When the full queue's head is expected to be served (a place frees then): when the first slot frees; the
        type's duration when no slot serves the queue."""
        slots = self._slots()
        return self.eta.estimate_waits(slots, [request_type])[0] if slots else self.eta.duration_s(request_type)

    def _refresh_positions(self) -> None:
        waiting = [t for t in self._queue.values() if t.waiting]
        starting = self.starting
        now = self._clock()
        slots = self._slots()
        waits: list[float | None]
        if waiting and slots:
            waits = list(self.eta.estimate_waits(slots, [t.request_type for t in waiting]))
        else:
            waits = [None] * len(waiting)
        for position, (ticket, wait) in enumerate(zip(waiting, waits, strict=True), start=1):
            ticket.position = position
            ticket.estimated_wait_s = wait
            ticket.estimated_at = now
            ticket.starting = starting
        for callback in tuple(self._listeners):
            callback()

    def _on_future_done(self, ticket_id: str, future: asyncio.Future[Worker]) -> None:
        """A waiter's future was cancelled directly (e.g. its awaiting task was): drop it and move on."""
        if future.cancelled() and self._queue.pop(ticket_id, None) is not None:
            self._dispatch_next()
