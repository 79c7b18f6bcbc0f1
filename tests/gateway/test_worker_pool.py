"""Worker pool: FIFO dispatch, capacity, cancellation, queue limits, health handling and wait estimates."""

from __future__ import annotations

import asyncio
import random

import pytest

from omnipipe.gateway.eta import EtaEstimator
from omnipipe.gateway.pool import QueueFullError, Ticket, WorkerPool
from omnipipe.gateway.worker import Worker
from omnipipe.protocol.worker import WorkerState


class FakeClock:
    """A settable clock so durations are exact."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ready_pool(*capacities: int, **kwargs: object) -> WorkerPool:
    """A pool of workers at 10.0.0.1:22400.. that have all answered IDLE."""
    workers = [Worker(f"10.0.0.1:{22400 + i}", capacity=c) for i, c in enumerate(capacities)]
    pool = WorkerPool(workers, **kwargs)  # type: ignore[arg-type]
    for w in workers:
        pool.apply_health(w.address, WorkerState.IDLE, True)
    return pool


def served(ticket: Ticket) -> bool:
    return ticket.future.done() and not ticket.future.cancelled()


def test_fifo_order_on_a_single_worker() -> None:
    async def main() -> None:
        pool = ready_pool(1)
        tickets = [pool.enqueue("chat") for _ in range(4)]
        order: list[int] = []
        for _ in range(4):
            i = next(i for i, t in enumerate(tickets) if served(t) and i not in order)
            order.append(i)
            assert sum(served(t) for t in tickets) == len(order)
            pool.release(tickets[i].future.result(), tickets[i])
        assert order == [0, 1, 2, 3]
        assert pool.queue_length == 0 and pool.workers[0].active_sessions == 0

    asyncio.run(main())


def test_worker_not_chosen_before_its_first_healthy_idle_reply() -> None:
    async def main() -> None:
        pool = WorkerPool([Worker("gpu0:22400")])
        t = pool.enqueue("chat")
        assert not served(t) and t.position == 1
        pool.apply_health("gpu0:22400", WorkerState.LOADING, True)
        assert not served(t)
        pool.apply_health("gpu0:22400", WorkerState.IDLE, True)
        assert served(t) and t.position == 0 and t.worker is pool.worker("gpu0:22400")

    asyncio.run(main())


def test_capacity_above_one_takes_several_sessions() -> None:
    async def main() -> None:
        pool = ready_pool(3)
        tickets = [pool.enqueue("duplex") for _ in range(4)]
        worker = pool.workers[0]
        assert [served(t) for t in tickets] == [True, True, True, False]
        assert worker.active_sessions == 3 and not worker.has_room
        # The worker reports BUSY for the gateway's own sessions; that must not block the freed slot.
        pool.apply_health(worker.address, WorkerState.DUPLEX_ACTIVE, True)
        pool.release(worker, tickets[1])
        assert served(tickets[3]) and worker.active_sessions == 3

    asyncio.run(main())


def test_least_loaded_worker_is_chosen() -> None:
    async def main() -> None:
        pool = ready_pool(2, 2)
        a, b = pool.enqueue("chat"), pool.enqueue("chat")
        assert a.worker is not b.worker

    asyncio.run(main())


def test_cancel_while_queued_moves_those_behind_up_and_never_serves_the_cancelled() -> None:
    async def main() -> None:
        pool = ready_pool(1)
        head = pool.enqueue("chat")
        w1, w2, w3 = (pool.enqueue("chat") for _ in range(3))
        assert [w1.position, w2.position, w3.position] == [1, 2, 3]
        assert pool.cancel(w1.ticket_id)
        assert w1.future.cancelled()
        assert [p.ticket_id for p in pool.positions()] == [w2.ticket_id, w3.ticket_id]
        assert [w2.position, w3.position] == [1, 2]
        assert not pool.cancel(w1.ticket_id)  # already gone
        assert not pool.cancel(head.ticket_id)  # assigned, not queued
        pool.release(head.worker or pool.workers[0], head)
        assert served(w2) and not served(w3) and w3.position == 1

    asyncio.run(main())


def test_cancelling_the_awaiting_task_removes_the_waiter() -> None:
    async def main() -> None:
        pool = ready_pool(1)
        head = pool.enqueue("chat")
        queued = pool.enqueue("chat")
        behind = pool.enqueue("chat")
        task = asyncio.create_task(pool.wait(queued))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert queued.future.cancelled()
        assert [p.ticket_id for p in pool.positions()] == [behind.ticket_id]
        pool.release(pool.workers[0], head)
        assert served(behind)

    asyncio.run(main())


def test_directly_cancelled_future_is_skipped_by_dispatch() -> None:
    async def main() -> None:
        pool = ready_pool(1)
        head = pool.enqueue("chat")
        dead = pool.enqueue("chat")
        alive = pool.enqueue("chat")
        dead.future.cancel()
        pool.release(pool.workers[0], head)  # dispatch runs before the done-callback cleanup
        assert served(alive) and dead.worker is None
        await asyncio.sleep(0)
        assert pool.positions() == []

    asyncio.run(main())


def test_cancel_after_assignment_in_wait_gives_the_worker_back() -> None:
    async def main() -> None:
        pool = ready_pool(1)
        head = pool.enqueue("chat")
        queued = pool.enqueue("chat")
        task = asyncio.create_task(pool.wait(queued))
        await asyncio.sleep(0)
        pool.release(pool.workers[0], head)  # resolves queued's future ...
        task.cancel()  # ... but its task is cancelled before it resumes
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.workers[0].active_sessions == 0
        assert served(pool.enqueue("chat"))

    asyncio.run(main())


def test_queue_full_raises_with_retry_hint() -> None:
    async def main() -> None:
        clock = FakeClock()
        pool = ready_pool(1, max_queue=2, eta=EtaEstimator({"chat": 12.0}), clock=clock)
        pool.enqueue("chat")
        pool.enqueue("chat")
        pool.enqueue("chat")
        clock.now += 5.0  # the running chat has 7 s left: then the head of the queue is served
        with pytest.raises(QueueFullError) as info:
            pool.enqueue("chat")
        assert info.value.max_queue == 2 and info.value.retry_after_s == pytest.approx(7.0)
        assert pool.queue_length == 2

    asyncio.run(main())


def test_max_queue_zero_still_serves_when_a_worker_is_free() -> None:
    async def main() -> None:
        pool = ready_pool(1, max_queue=0)
        assert served(pool.enqueue("chat"))
        with pytest.raises(QueueFullError):
            pool.enqueue("chat")

    asyncio.run(main())


def test_offline_worker_is_skipped_and_restored_worker_triggers_dispatch() -> None:
    async def main() -> None:
        pool = ready_pool(1, 1)
        a, b = pool.workers
        pool.apply_health(a.address, None, False, reason="timeout")
        assert a.state is WorkerState.OFFLINE and a.health_reason == "timeout"
        first = pool.enqueue("chat")
        assert first.worker is b
        second = pool.enqueue("chat")
        assert not served(second) and second.position == 1
        pool.apply_health(a.address, WorkerState.IDLE, True)
        assert second.worker is a and a.active_sessions == 1

    asyncio.run(main())


def test_offline_after_consecutive_failures() -> None:
    async def main() -> None:
        pool = ready_pool(1, offline_after_failures=2)
        w = pool.workers[0]
        pool.apply_health(w.address, None, False)
        assert w.online
        pool.apply_health(w.address, WorkerState.IDLE, True)
        pool.apply_health(w.address, None, False)
        assert w.online and w.consecutive_failures == 1
        pool.apply_health(w.address, None, False)
        assert not w.online
        t = pool.enqueue("chat")
        assert not served(t)

    asyncio.run(main())


def test_error_and_loading_workers_are_not_chosen() -> None:
    async def main() -> None:
        pool = ready_pool(1)
        w = pool.workers[0]
        pool.apply_health(w.address, WorkerState.ERROR, True, reason="cuda oom")
        t = pool.enqueue("chat")
        assert not served(t)
        pool.apply_health(w.address, WorkerState.LOADING, True)
        assert not served(t)
        pool.apply_health(w.address, WorkerState.IDLE, True)
        assert served(t)

    asyncio.run(main())


def test_stale_idle_reply_does_not_free_a_busy_worker() -> None:
    async def main() -> None:
        pool = ready_pool(1)
        w = pool.workers[0]
        holder = pool.enqueue("chat")
        waiter = pool.enqueue("chat")
        pool.apply_health(w.address, WorkerState.IDLE, True)  # stale: the worker has not seen the session yet
        assert w.active_sessions == 1 and not served(waiter) and waiter.position == 1
        pool.release(w, holder)
        assert served(waiter) and w.active_sessions == 1

    asyncio.run(main())


def test_busy_reply_without_gateway_sessions_blocks_until_idle() -> None:
    async def main() -> None:
        pool = ready_pool(1)
        w = pool.workers[0]
        pool.apply_health(w.address, WorkerState.BUSY, True)  # occupied by something the gateway did not assign
        t = pool.enqueue("chat")
        assert not served(t)
        pool.apply_health(w.address, WorkerState.IDLE, True)
        assert served(t)

    asyncio.run(main())


def test_busy_reply_to_a_probe_sent_before_release_is_ignored() -> None:
    async def main() -> None:
        clock = FakeClock()
        pool = ready_pool(1, clock=clock)
        w = pool.workers[0]
        holder = pool.enqueue("chat")
        probe_sent = clock.now
        clock.now += 5
        pool.release(w, holder)
        pool.apply_health(w.address, WorkerState.BUSY, True, probe_started_at=probe_sent)
        assert w.has_room and served(pool.enqueue("chat"))

    asyncio.run(main())


def test_release_is_idempotent_per_ticket_and_checks_ownership() -> None:
    async def main() -> None:
        pool = ready_pool(1, 1)
        t = pool.enqueue("chat")
        other = next(w for w in pool.workers if w is not t.worker)
        with pytest.raises(ValueError):
            pool.release(other, t)
        assert t.worker is not None
        pool.release(t.worker, t)
        pool.release(t.worker, t)
        assert t.worker.active_sessions == 0
        with pytest.raises(RuntimeError):
            pool.release(t.worker)
        with pytest.raises(KeyError):
            pool.release(Worker("elsewhere:1"))

    asyncio.run(main())


def test_eta_uses_baseline_until_min_samples_then_ema() -> None:
    eta = EtaEstimator({"chat": 10.0}, alpha=0.5, min_samples=3, default_s=99.0)
    assert eta.duration_s("chat") == 10.0 and eta.duration_s("duplex") == 99.0
    eta.observe("chat", 4.0)
    eta.observe("chat", 8.0)
    assert eta.duration_s("chat") == 10.0 and eta.samples("chat") == 2
    eta.observe("chat", 6.0)  # 4 -> 6 -> 6
    assert eta.duration_s("chat") == pytest.approx(6.0)
    eta.observe("chat", 10.0)
    assert eta.duration_s("chat") == pytest.approx(8.0)
    eta.set_baseline("chat", 50.0)  # a warmed-up average wins over the baseline
    assert eta.duration_s("chat") == pytest.approx(8.0)
    with pytest.raises(ValueError):
        eta.observe("chat", -1.0)


def test_pool_feeds_real_durations_into_eta() -> None:
    async def main() -> None:
        clock = FakeClock()
        pool = ready_pool(1, clock=clock, eta=EtaEstimator({"chat": 60.0}, min_samples=2, alpha=0.5))
        for duration in (10.0, 20.0):
            t = pool.enqueue("chat")
            clock.now += duration
            assert t.worker is not None
            pool.release(t.worker, t)
        assert pool.eta.duration_s("chat") == pytest.approx(15.0)
        pool.enqueue("chat")
        waiter = pool.enqueue("chat")
        assert waiter.estimated_wait_s == pytest.approx(15.0)

    asyncio.run(main())


def test_six_waiters_on_capacity_two_get_positions_and_are_served_in_order() -> None:
    async def main() -> None:
        pool = ready_pool(1, 1, eta=EtaEstimator({"chat": 10.0}), clock=FakeClock())
        tickets = [pool.enqueue("chat") for _ in range(6)]
        assert [t.position for t in tickets] == [0, 0, 1, 2, 3, 4]
        assert [t.estimated_wait_s for t in tickets] == [0.0, 0.0, 10.0, 10.0, 20.0, 20.0]
        snapshot = pool.positions()
        assert [p.ticket_id for p in snapshot] == [t.ticket_id for t in tickets[2:]]
        assert [p.position for p in snapshot] == [1, 2, 3, 4]
        order: list[int] = []
        for i, t in enumerate(tickets):
            t.future.add_done_callback(lambda f, i=i: order.append(i))
        await asyncio.sleep(0)
        holding = [tickets[0], tickets[1]]
        # Free slots in an odd order: the second worker first, then the first twice.
        for pick in (1, 0, 0, 1):
            t = holding.pop(pick)
            assert t.worker is not None
            pool.release(t.worker, t)
            holding.append(next(x for x in tickets if served(x) and x not in holding and not x.released))
        await asyncio.sleep(0)
        assert order == [0, 1, 2, 3, 4, 5]

    asyncio.run(main())


class _Churn:
    """300 clients on three workers whose health flaps: each queues, and may withdraw (DELETE), be cancelled
    with its task, or be served and give its worker back; what each came to is noted."""

    def __init__(self) -> None:
        self.rng = random.Random(1234)
        self.pool = ready_pool(1, 2, 3, max_queue=1000)
        self.workers = self.pool.workers
        self.enqueued: list[str] = []
        self.served_order: list[str] = []
        self.outcomes: dict[str, str] = {}
        self.tickets: list[Ticket] = []

    def check(self) -> None:
        for w in self.workers:
            assert 0 <= w.active_sessions <= w.capacity
        for w in self.workers:
            held = sum(1 for t in self.tickets if t.worker is w and not t.released)
            assert w.active_sessions == held

    async def client(self, n: int) -> None:
        rng, pool, outcomes = self.rng, self.pool, self.outcomes
        await asyncio.sleep(0)
        for _ in range(rng.randrange(3)):
            await asyncio.sleep(0)
        t = pool.enqueue(rng.choice(["chat", "duplex"]))
        self.enqueued.append(t.ticket_id)
        self.tickets.append(t)
        t.future.add_done_callback(lambda f, tid=t.ticket_id: None if f.cancelled() else self.served_order.append(tid))
        outcomes[t.ticket_id] = "waiting"
        try:
            if n % 5 == 0:
                # Leave via DELETE after a while, unless already served.
                for _ in range(rng.randrange(5)):
                    await asyncio.sleep(0)
                if pool.cancel(t.ticket_id):
                    outcomes[t.ticket_id] = "cancelled"
                    assert t.worker is None
                    return
            worker = await pool.wait(t)
        except asyncio.CancelledError:
            outcomes[t.ticket_id] = "left"
            if t.worker is not None:
                pool.release(t.worker, t)
            else:
                pool.cancel(t.ticket_id)
            raise
        outcomes[t.ticket_id] = "holding"
        try:
            self.check()
            for _ in range(rng.randrange(6)):
                await asyncio.sleep(0)
            outcomes[t.ticket_id] = "done"
        finally:
            pool.release(worker, t)  # a session handler always gives its worker back
        self.check()

    async def flapper(self) -> None:
        for _ in range(60):
            w = self.rng.choice(self.workers)
            if self.rng.random() < 0.3:
                self.pool.apply_health(w.address, None, False)
            else:
                self.pool.apply_health(w.address, self.rng.choice([WorkerState.IDLE, WorkerState.BUSY]), True)
            self.check()
            await asyncio.sleep(0)
        for w in self.workers:
            self.pool.apply_health(w.address, WorkerState.IDLE, True)

    async def run(self) -> None:
        tasks = [asyncio.create_task(self.client(n)) for n in range(300)]
        leavers = self.rng.sample(tasks, 20)
        flap = asyncio.create_task(self.flapper())
        for _ in range(5):
            await asyncio.sleep(0)
        for task in leavers:
            task.cancel()
        results = await asyncio.gather(*tasks, flap, return_exceptions=True)
        for r in results:
            assert r is None or isinstance(r, asyncio.CancelledError), r
        await asyncio.sleep(0)

    def assert_settled(self) -> None:
        outcomes, served_order = self.outcomes, self.served_order
        assert self.pool.queue_length == 0 and self.pool.positions() == []
        assert all(w.active_sessions == 0 for w in self.workers)
        # Every waiter was served and released, withdrew, or left with its task; none is stuck.
        assert set(outcomes.values()) <= {"done", "cancelled", "left", "holding"}
        assert all(t.released for t in self.tickets if outcomes[t.ticket_id] in ("done", "holding"))
        assert all(t.future.done() for t in self.tickets)
        assert all(tid not in served_order for tid, v in outcomes.items() if v == "cancelled")
        # Service was strictly in arrival order.
        assert served_order == [tid for tid in self.enqueued if tid in set(served_order)]
        assert sum(v == "done" for v in outcomes.values()) > 200


def test_concurrent_enqueue_release_cancel_never_over_assigns_or_loses_waiters() -> None:
    async def main() -> None:
        churn = _Churn()
        await churn.run()
        churn.assert_settled()

    asyncio.run(main())
