"""Liveness: a stopped (SIGSTOP) stage is reported stalled past stall_report_s, killed and restarted past
stall_restart_s (its requests fail saying why), and a stage that resumes in time is simply reported again."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from omnipipe import AsyncOmni, RequestFailedError
from omnipipe.config.deploy_config import DeployConfigError, load_deploy
from omnipipe.engine.liveness import StageLiveness
from omnipipe.models.registry import get_pipeline
from tests.conftest import collect, state_is_idle, wait_until_idle
from tests.waiting import wait_for, wait_for_async

REPORT_S = 0.6
RESTART_S = 2.5
LIVENESS = {
    "heartbeat_interval_s": 0.1,
    "stages": {name: {"stall_report_s": REPORT_S, "stall_restart_s": RESTART_S,
                      "options": {"step_delay_ms": 10} if name == "thinker" else {"call_delay_ms": 10}}
               for name in ("thinker", "talker", "code2wav")},
}
PROMPT = "a prompt long enough to be caught in the middle of every stage " * 2


# ---------------------------------------------------------------------------------------------- the stall record
def test_silence_and_a_long_step_both_count_as_no_progress() -> None:
    record = StageLiveness(report_s=1.0, restart_s=5.0)
    now = record.last_beat
    assert record.check(now + 0.5) == "ok"
    assert record.check(now + 1.2) == "newly_stalled"  # silent for 1.2 s
    assert record.check(now + 1.3) == "stalled"
    record.beat(step_s=0.0)
    assert record.check(record.last_beat + 0.1) == "recovered"
    record.beat(step_s=4.0)  # alive, but one step has run 4 s
    assert record.check(record.last_beat + 0.5) == "newly_stalled"
    assert record.check(record.last_beat + 1.1) == "restart"
    assert record.stalls == 2


def test_a_stage_without_a_restart_bound_is_only_reported() -> None:
    record = StageLiveness(report_s=1.0, restart_s=None)
    assert record.check(record.last_beat + 3600) == "newly_stalled"


@pytest.mark.parametrize("stages, top, message", [
    ({"thinker": {"stall_report_s": 0.1}}, {}, "stages.thinker.stall_report_s: must be at least twice"),
    ({"thinker": {"stall_report_s": 5, "stall_restart_s": 5}}, {}, "stall_restart_s: must be above stall_report_s"),
    ({"talker": {"stall_restart_s": float("nan")}}, {}, "stages.talker.stall_restart_s: must be a number"),
    ({}, {"heartbeat_interval_s": 0}, "heartbeat_interval_s: must be a number >= 0.05"),
])
def test_liveness_bounds_are_validated(stages: dict, top: dict, message: str) -> None:
    with pytest.raises(DeployConfigError, match=message):
        load_deploy({"stages": stages, **top}, get_pipeline("toy"))


def test_no_restart_bound_is_allowed() -> None:
    config = load_deploy({"stages": {"thinker": {"stall_restart_s": None}}}, get_pipeline("toy"))
    assert config.stage("thinker").stall_restart_s is None


# ---------------------------------------------------------------------------------------------- real processes
async def _wait_for(engine: AsyncOmni, stage: str, states: set[str], timeout_s: float = 60) -> tuple[str, float]:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        health = engine.health()
        assert health is not None
        if health.stages[stage].state in states:
            return health.stages[stage].state, time.monotonic() - start
        await asyncio.sleep(0.02)
    raise AssertionError(f"stage {stage} never reached {states}: {engine.health()}")


def test_a_stopped_stage_is_reported_then_killed_and_restarted(harness_factory) -> None:
    harness = harness_factory("toy", LIVENESS)
    engine = harness.engine

    async def run() -> dict:
        assert engine.health().ok, engine.health()
        pid = (await engine.debug_state())["pids"]["talker"]
        error: BaseException | None = None
        stopped_at = None
        report = {}
        try:
            async for out in engine.generate(PROMPT, request_id="on-a-stopped-stage"):
                if out.modality == "audio" and stopped_at is None:
                    os.kill(pid, signal.SIGSTOP)
                    stopped_at = time.monotonic()
                    _, report["stalled_after_s"] = await _wait_for(engine, "talker", {"stalled"})
                    report["health"] = engine.health()
        except RequestFailedError as exc:
            error = exc
        report["error"] = error
        report["failed_after_s"] = time.monotonic() - stopped_at
        await _wait_for(engine, "talker", {"ok"})
        report["after"] = engine.health()
        report["outputs"] = await collect(engine, "after the stall")
        report["state"] = await wait_until_idle(engine)
        report["pid"] = pid
        return report

    report = harness.run(run())
    degraded = report["health"]
    assert not degraded.ok and degraded.stages["talker"].state == "stalled"
    assert any("stage 'talker' has made no progress" in p for p in degraded.problems), degraded.problems
    assert degraded.stages["thinker"].state == "ok"
    assert report["stalled_after_s"] >= REPORT_S - 0.2  # never before the bound (detection time is measured in
    # `omnipipe bench soak`; a slow machine only makes it later)
    error = report["error"]
    assert error is not None, "the request on the stopped stage must fail once the stage is killed"
    assert "stage 'talker' made no progress for" in str(error) and "was killed" in str(error)
    assert report["failed_after_s"] >= RESTART_S - 0.2
    after = report["after"]
    assert after.ok and after.stages["talker"].restarts == 1 and after.stages["talker"].pid != report["pid"]
    assert report["outputs"][-1].text == "AFTER THE STALL"
    assert state_is_idle(report["state"])


def test_a_stage_that_resumes_in_time_is_not_restarted(harness_factory) -> None:
    patient = {**LIVENESS, "stages": {name: {**settings, "stall_restart_s": 30.0}
                                      for name, settings in LIVENESS["stages"].items()}}
    harness = harness_factory("toy", patient)
    engine = harness.engine

    async def run() -> dict:
        pid = (await engine.debug_state())["pids"]["thinker"]
        task = asyncio.create_task(collect(engine, PROMPT, request_id="survives-a-pause"))

        async def under_way() -> bool:
            return "survives-a-pause" in (await engine.debug_state())["client_requests"]

        await wait_for_async(under_way, 30, "the request under way")
        os.kill(pid, signal.SIGSTOP)
        try:
            await _wait_for(engine, "thinker", {"stalled"})
            stalled = engine.health()
        finally:
            os.kill(pid, signal.SIGCONT)
        await _wait_for(engine, "thinker", {"ok"})
        outputs = await task
        return {"stalled": stalled, "after": engine.health(), "outputs": outputs, "pid": pid}

    report = harness.run(run())
    assert report["stalled"].stages["thinker"].state == "stalled"
    after = report["after"]
    assert after.ok and after.stages["thinker"].restarts == 0 and after.stages["thinker"].pid == report["pid"]
    assert after.stages["thinker"].stalls >= 1  # a machine busy enough to starve the heartbeat may add one
    assert report["outputs"][-1].text == PROMPT.upper()


def test_a_wedged_engine_loop_is_reported_without_waiting_on_it(toy) -> None:
    """health() reads the orchestrator's records from the caller's thread: while the orchestrator's own loop is
    blocked (here by a sleep scheduled on it) it still answers, and says the loop is not running."""
    engine = toy.engine
    orchestrator = engine.engine.orchestrator
    assert engine.health().ok
    orchestrator.loop.call_soon_threadsafe(time.sleep, 3.5)  # stays: the wedge itself

    def unhealthy() -> Any:
        health = engine.health()
        return None if health.ok else health

    health = wait_for(unhealthy, 3.0, "health said the loop is wedged")
    assert any("the engine loop has not run" in p for p in health.problems), health
    wait_for(lambda: engine.health().ok, 33, "health ok again once the loop runs")
