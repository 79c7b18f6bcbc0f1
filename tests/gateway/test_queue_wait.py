"""The queue wait shared by both proxies: position messages, the three ways a wait ends, and the capacity retry."""

from __future__ import annotations

import asyncio

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
