"""Wait estimates from what is actually ahead: the sessions running on the slots (time left of each, by its type)
and the requests queued before the waiter (each with its own type's duration), served FIFO by the slots; and the
"starting" state while no worker is ready yet."""

from __future__ import annotations

import asyncio

import pytest

from omnipipe.gateway.eta import EtaEstimator, RunningSession
from omnipipe.gateway.pool import WorkerPool
from omnipipe.gateway.worker import Worker
from omnipipe.protocol.worker import WorkerState

BASELINES = {"chat": 10.0, "speech": 8.0, "transcription": 5.0, "voice": 60.0}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def running(request_type: str, elapsed_s: float) -> RunningSession:
    return RunningSession(request_type, elapsed_s)


# ---------------------------------------------------------------------------------------------- the estimate alone
def test_a_chat_twenty_seconds_into_a_typical_twenty_five_has_five_left() -> None:
    eta = EtaEstimator({"chat": 25.0})
    assert eta.remaining_s(running("chat", 20.0)) == pytest.approx(5.0)
    assert eta.estimate_waits([running("chat", 20.0)], ["chat"]) == [pytest.approx(5.0)]


def test_each_request_ahead_counts_with_its_own_type() -> None:
    eta = EtaEstimator(BASELINES)
    # one slot, a voice session 15 s into its 60: the queue is a chat, then a speech, then a voice request
    assert eta.estimate_waits([running("voice", 15.0)], ["chat", "speech", "voice", "transcription"]) == [
        pytest.approx(45.0), pytest.approx(55.0), pytest.approx(63.0), pytest.approx(123.0)]
    # the same queue behind a transcription 1 s into its 5: the waits follow the short session ahead
    assert eta.estimate_waits([running("transcription", 1.0)], ["chat", "speech"]) == [
        pytest.approx(4.0), pytest.approx(14.0)]


def test_the_queue_is_spread_over_the_slots_first_come_first_served() -> None:
    eta = EtaEstimator(BASELINES)
    # a voice session with 50 s left, a chat with 8 s left, and a free slot
    slots = [running("voice", 10.0), running("chat", 2.0), None]
    # chat -> free slot at 0 (busy until 10); voice -> chat's slot at 8; speech -> the first chat's slot at 10;
    # chat -> that slot again at 10 + 8
    assert eta.estimate_waits(slots, ["chat", "voice", "speech", "chat"]) == [
        pytest.approx(0.0), pytest.approx(8.0), pytest.approx(10.0), pytest.approx(18.0)]


def test_a_session_past_its_typical_duration_ends_any_moment() -> None:
    eta = EtaEstimator(BASELINES)
    assert eta.remaining_s(running("chat", 42.0)) == 0.0
    assert eta.estimate_waits([running("chat", 42.0)], ["voice", "chat"]) == [0.0, pytest.approx(60.0)]


def test_measured_durations_replace_the_baseline_per_type() -> None:
    eta = EtaEstimator(BASELINES, min_samples=2, alpha=0.5)
    for seconds in (4.0, 8.0):
        eta.observe("voice", seconds)  # voice now typically lasts 6 s; chat still uses its baseline
    assert eta.estimate_waits([running("voice", 1.0)], ["voice", "chat"]) == [pytest.approx(5.0), pytest.approx(11.0)]


def test_no_slot_at_all_has_no_estimate() -> None:
    with pytest.raises(ValueError):
        EtaEstimator(BASELINES).estimate_waits([], ["chat"])
    assert EtaEstimator(BASELINES).estimate_waits([None], []) == []


# ---------------------------------------------------------------------------------------------- in the pool
def ready_pool(*capacities: int, clock: FakeClock) -> WorkerPool:
    workers = [Worker(f"10.0.0.1:{22400 + i}", capacity=c) for i, c in enumerate(capacities)]
    pool = WorkerPool(workers, eta=EtaEstimator(BASELINES), clock=clock)
    for worker in workers:
        pool.apply_health(worker.address, WorkerState.IDLE, True)
    return pool


def test_pool_estimates_from_the_running_sessions_and_the_queue_ahead() -> None:
    async def main() -> None:
        clock = FakeClock()
        pool = ready_pool(2, clock=clock)
        voice = pool.enqueue("voice")
        clock.now += 5.0
        pool.enqueue("chat")
        clock.now += 3.0  # voice has run 8 s of 60, the chat 3 s of 10
        first, second, third = pool.enqueue("chat"), pool.enqueue("chat"), pool.enqueue("voice")
        assert [t.position for t in (first, second, third)] == [1, 2, 3]
        assert [t.estimated_wait_s for t in (first, second, third)] == [
            pytest.approx(7.0), pytest.approx(17.0), pytest.approx(27.0)]
        assert not any(t.starting for t in (first, second, third))
        clock.now += 20.0  # the chat ran over its typical 10 s: it may end any moment
        pool.refresh_estimates()
        assert [t.estimated_wait_s for t in (first, second, third)] == [
            pytest.approx(0.0), pytest.approx(10.0), pytest.approx(20.0)]
        assert voice.worker is not None
        pool.release(voice.worker, voice)  # the voice slot frees: `first` takes it, the rest move up
        assert first.worker is not None and first.estimated_wait_s == 0.0
        assert [t.estimated_wait_s for t in (second, third)] == [pytest.approx(0.0), pytest.approx(10.0)]

    asyncio.run(main())


def test_waiters_hear_starting_while_no_worker_is_ready_yet() -> None:
    async def main() -> None:
        clock = FakeClock()
        loading, failed = Worker("10.0.0.1:22400"), Worker("10.0.0.1:22401")
        pool = WorkerPool([loading, failed], eta=EtaEstimator(BASELINES), clock=clock)
        waiter = pool.enqueue("chat")  # neither worker has answered since the gateway started
        assert pool.starting and waiter.starting and waiter.estimated_wait_s is None
        pool.apply_health(failed.address, WorkerState.ERROR, True, reason="weights missing")
        pool.apply_health(loading.address, WorkerState.LOADING, True)
        assert pool.starting and waiter.starting and waiter.estimated_wait_s is None
        pool.apply_health(loading.address, WorkerState.IDLE, True)  # ready: the waiter is served
        assert not pool.starting and waiter.worker is loading
        behind = pool.enqueue("chat")
        assert not behind.starting and behind.estimated_wait_s == pytest.approx(10.0)
        pool.apply_health(loading.address, None, False)  # gone (it answered before): not "starting"
        assert not pool.starting and not behind.starting and behind.estimated_wait_s is None
        pool.apply_health(loading.address, WorkerState.LOADING, True)  # restarted, loading again
        assert pool.starting and behind.starting and behind.estimated_wait_s is None

    asyncio.run(main())
