"""The queue wait shared by both proxies: position messages, the three ways a wait ends, and the capacity retry."""

from __future__ import annotations

import asyncio

from omnipipe.gateway.eta import EtaEstimator
from omnipipe.gateway.pool import WorkerPool
from omnipipe.gateway.proxy.queue_wait import QUEUE_UPDATE, QUEUED, QueueWait, retry_at_capacity
from omnipipe.gateway.worker import Worker
from omnipipe.protocol.worker import WorkerState


def one_busy_worker() -> tuple[WorkerPool, Worker]:
    worker = Worker("10.0.0.1:22400", capacity=1)
    pool = WorkerPool([worker])
    pool.apply_health(worker.address, WorkerState.IDLE, True)
    return pool, worker


def test_waiter_gets_queued_then_updates_then_the_worker() -> None:
    async def main() -> None:
        pool, worker = one_busy_worker()
        first = pool.enqueue("chat")
        ahead, ticket = pool.enqueue("chat"), pool.enqueue("chat")  # ticket is second in line
        messages = []
        async with QueueWait(pool, ticket) as wait:
            async for message in wait.updates():
                messages.append(message)
                if message["type"] == QUEUED:
                    pool.release(worker, first)  # `ahead` gets the worker: ticket moves up
                elif message["type"] == QUEUE_UPDATE:
                    pool.release(worker, ahead)  # now ticket gets it
        assert [m["type"] for m in messages] == [QUEUED, QUEUE_UPDATE]
        assert messages[0]["position"] == 2 and messages[1]["position"] == 1
        assert messages[0]["ticket_id"] == ticket.ticket_id
        assert wait.worker is worker and not wait.cancelled and not wait.stopped

    asyncio.run(main())


def test_withdrawn_ticket_ends_the_wait_cancelled() -> None:
    async def main() -> None:
        pool, _ = one_busy_worker()
        pool.enqueue("chat")
        ticket = pool.enqueue("chat")
        async with QueueWait(pool, ticket) as wait:
            async for _ in wait.updates():
                pool.cancel(ticket.ticket_id)
        assert wait.cancelled and wait.worker is None and not wait.stopped

    asyncio.run(main())


def test_client_gone_stops_the_wait_and_gives_the_place_back() -> None:
    async def main() -> None:
        pool, _ = one_busy_worker()
        pool.enqueue("chat")
        ticket = pool.enqueue("chat")
        gone = asyncio.Event()

        async def client_gone() -> bool:
            return gone.is_set()

        async with QueueWait(pool, ticket) as wait:
            async for _ in wait.updates(until=client_gone, wake=gone, poll_s=5.0):
                asyncio.get_running_loop().call_soon(gone.set)
        assert wait.stopped and not wait.cancelled and wait.worker is None
        assert not ticket.waiting and pool.queue_length == 0

    asyncio.run(main())


def test_worker_assigned_as_the_client_leaves_is_still_reported_for_release() -> None:
    async def main() -> None:
        pool, worker = one_busy_worker()
        first = pool.enqueue("chat")
        ticket = pool.enqueue("chat")
        async with QueueWait(pool, ticket) as wait:
            async for _ in wait.updates():
                pool.release(worker, first)  # assigned to ticket ...
                await asyncio.sleep(0)
                break  # ... just as the client goes
        assert wait.worker is worker

    asyncio.run(main())


def test_capacity_refusals_are_retried_within_the_window_only() -> None:
    async def main() -> None:
        answers = iter(["at_capacity", "at_capacity", "ok"])
        closed: list[str] = []

        async def attempt() -> str:
            return next(answers)

        async def refused(answer: str) -> bool:
            if answer == "at_capacity":
                closed.append(answer)
                return True
            return False

        assert await retry_at_capacity(attempt, refused) == "ok" and len(closed) == 2
        assert await retry_at_capacity(lambda: asyncio.sleep(0, "at_capacity"), refused, window_s=0.0) \
            == "at_capacity"

    asyncio.run(main())


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_updates_carry_the_estimate_and_come_only_when_it_leaves_the_countdown() -> None:
    """The client counts the last estimate down; the pool's estimate that follows the countdown sends nothing, one
    that leaves it (a changed duration, a slot that freed early) or a changed place sends an update."""
    async def main() -> None:
        clock = FakeClock()
        worker = Worker("10.0.0.1:22400", capacity=1)
        pool = WorkerPool([worker], eta=EtaEstimator({"voice": 60.0, "chat": 10.0}), clock=clock)
        pool.apply_health(worker.address, WorkerState.IDLE, True)
        voice = pool.enqueue("voice")
        clock.now += 20.0
        ticket = pool.enqueue("chat")
        messages: list[dict] = []

        async def client() -> None:
            async for message in wait.updates():
                messages.append(message)

        async def settle() -> None:
            for _ in range(20):
                await asyncio.sleep(0)

        async with QueueWait(pool, ticket) as wait:
            listening = asyncio.create_task(client())
            await settle()
            clock.now += 5.0
            pool.refresh_estimates()  # 35 s left, as the client's countdown says: nothing to send
            await settle()
            assert len(messages) == 1
            pool.eta.set_baseline("voice", 30.0)  # 5 s left now: the client is told
            pool.refresh_estimates()
            await settle()
            assert len(messages) == 2
            pool.release(worker, voice)
            await listening
        assert messages == [
            {"type": QUEUED, "position": 1, "estimated_wait_s": 40.0, "starting": False,
             "ticket_id": ticket.ticket_id},
            {"type": QUEUE_UPDATE, "position": 1, "estimated_wait_s": 5.0, "starting": False}]
        assert wait.worker is worker

    asyncio.run(main())


def test_a_waiter_is_told_when_the_service_is_starting_and_when_it_is_not_anymore() -> None:
    async def main() -> None:
        worker = Worker("10.0.0.1:22400", capacity=1)
        pool = WorkerPool([worker], eta=EtaEstimator({"chat": 10.0}), clock=FakeClock())
        first, ticket = pool.enqueue("chat"), pool.enqueue("chat")
        messages = []
        async with QueueWait(pool, ticket) as wait:
            async for message in wait.updates():
                messages.append(message)
                if len(messages) == 1:
                    pool.apply_health(worker.address, WorkerState.LOADING, True)  # still starting: no update
                    await asyncio.sleep(0)
                    pool.apply_health(worker.address, WorkerState.IDLE, True)  # `first` is served, ticket is next
                elif len(messages) == 2:
                    pool.release(worker, first)
        assert [(m["type"], m["position"], m["estimated_wait_s"], m["starting"]) for m in messages] == [
            (QUEUED, 2, None, True), (QUEUE_UPDATE, 1, 10.0, False)]

    asyncio.run(main())


def test_an_estimate_read_between_the_pools_changes_is_counted_down_to_now() -> None:
    """Between the pool's changes (a health check every 2 s) the waiter wakes on its own (``poll_s``): the estimate
    it reads then is the one made at the last change, counted down; it agrees with the client's countdown, so
    nothing is sent, however the wake-ups and the changes interleave."""
    async def main() -> None:
        clock = FakeClock()
        worker = Worker("10.0.0.1:22400", capacity=1)
        pool = WorkerPool([worker], eta=EtaEstimator({"voice": 60.0, "chat": 10.0}), clock=clock)
        pool.apply_health(worker.address, WorkerState.IDLE, True)
        voice = pool.enqueue("voice")
        ticket = pool.enqueue("chat")
        messages: list[dict] = []
        wake = asyncio.Event()

        async def client() -> None:
            async for message in wait.updates(wake=wake):
                messages.append(message)

        async def settle() -> None:
            for _ in range(20):
                await asyncio.sleep(0)

        async with QueueWait(pool, ticket) as wait:
            listening = asyncio.create_task(client())
            await settle()
            for step in range(10):
                clock.now += 0.7
                if step % 3 == 0:
                    pool.apply_health(worker.address, WorkerState.BUSY, True)  # a health check: estimates remade
                else:
                    wake.set()  # the waiter's own wake-up (its client's poll), nothing changed in the pool
                await settle()
                wake.clear()
            assert [m["type"] for m in messages] == [QUEUED]
            pool.release(worker, voice)
            await listening
        assert messages[0]["estimated_wait_s"] == 60.0

    asyncio.run(main())
