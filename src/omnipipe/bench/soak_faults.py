"""The soak's faults (a stage SIGKILLed or SIGSTOPped, ``up``'s worker SIGKILLed): injected one at a time while
the load runs, healed (probe requests until one completes), and measured from the signal: detection, restart, ok
again, first answer, recovery."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from omnipipe.bench.soak_health import HEALTH_POLL_S, HealthSample, HealthWatch, StatePidWatch, stage_pids
from omnipipe.bench.soak_load import COMPLETED, Outcome, Progress
from omnipipe.bench.soak_processes import ProcessWatch

PROBE_PAUSE_S = (0.2, 2.0)  # between probes that did not complete: from, doubling up to
STOP_REPORT_GRACE_S = 2.0  # a stop nothing reported by this long after it ended counts as undetected
GIVEN_UP_AFTER_S = 5.0  # a stage down (not restarting) this long has been given up by the server
SERVING_WORKER_STATES = ("IDLE", "BUSY", "DUPLEX_ACTIVE", "DUPLEX_PAUSED")

KILL, STOP, KILL_WORKER = "SIGKILL", "SIGSTOP", "SIGKILL worker"


@dataclass
class Fault:
    kind: str  # KILL, STOP or KILL_WORKER
    target: str  # a stage name, or a worker's name
    stop_s: float = 0.0
    pid: int | None = None
    at: float | None = None
    under_load: bool = False
    error: str | None = None  # why it could not be done
    detected_s: float | None = None
    restarted_s: float | None = None
    ok_again_s: float | None = None
    answered_s: float | None = None
    recovered_s: float | None = None
    resume: asyncio.Task[None] | None = None  # the SIGCONT of a SIGSTOP

    @property
    def label(self) -> str:
        return f"{STOP} {self.stop_s:g} s" if self.kind == STOP else self.kind


@dataclass
class Rig:
    """The target: where requests go, where stage faults are watched, and how pids are found."""

    url: str  # requests (the server, or the gateway)
    headers: dict[str, str]
    stage_url: str  # the server whose stages faults hit (the first worker behind a gateway)
    engine: str  # its main pipeline (the key in /debug/state)
    client: httpx.AsyncClient  # monitoring (not the load's)
    stage_health: HealthWatch
    gateway_health: HealthWatch | None = None
    state_pids: StatePidWatch | None = None
    processes: ProcessWatch | None = None

    def stage_pid_samples(self, stage: str) -> list[tuple[float, int | None]]:
        """Every observation of the stage's pid: from /health's stages, else from /debug/state."""
        from_health = [(s.t, (s.stages.get(stage) or {}).get("pid")) for s in self.stage_health.samples
                       if s.stages is not None and stage in s.stages]
        if from_health:
            return from_health
        return [(t, pids.get(stage)) for t, pids in (self.state_pids.samples if self.state_pids else [])]

    async def current_pid(self, fault: Fault) -> int | None:
        if fault.kind == KILL_WORKER:
            assert self.processes is not None
            return self.processes.workers_now().get(fault.target)
        sample = self.stage_health.latest()
        if sample is not None and sample.stages is not None and fault.target in sample.stages:
            return sample.stages[fault.target].get("pid")
        return (await stage_pids(self.client, self.stage_url, self.headers, self.engine)).get(fault.target)

    def healthy(self, fault: Fault, sample: HealthSample) -> bool:
        if fault.kind == KILL_WORKER:
            return (sample.workers or {}).get(fault.target.removeprefix("worker ")) in SERVING_WORKER_STATES
        if sample.stages is not None and fault.target in sample.stages:
            return sample.stages[fault.target].get("state") == "ok"
        return sample.code == 200

    def down(self, fault: Fault) -> str | None:
        """A stage the server gave up (down, not restarting, for ``GIVEN_UP_AFTER_S``): no request can complete, the
        fault will not heal. (A stage is also down for a moment between its death and its restart.)"""
        samples = self.health_samples(fault)
        if fault.kind == KILL_WORKER or not samples or samples[-1].stages is None:
            return None
        since = samples[-1].t - GIVEN_UP_AFTER_S
        if samples[0].t > since:
            return None
        down = {name for name, info in samples[-1].stages.items() if info.get("state") == "down"}
        for sample in reversed(samples):
            if sample.t < since or not down:
                break
            down &= {name for name, info in (sample.stages or {}).items() if info.get("state") == "down"}
        return min(down) if down else None

    def describe(self, fault: Fault, sample: HealthSample) -> str:
        if fault.kind == KILL_WORKER:
            return f"gateway: {(sample.workers or {}).get(fault.target.removeprefix('worker '))}"
        stage = (sample.stages or {}).get(fault.target)
        down = self.down(fault)
        if down is not None and down != fault.target:
            return f"stage {down!r} is down"
        return f"state {stage.get('state')}" if stage else f"/health {sample.code}"

    def health_samples(self, fault: Fault) -> list[HealthSample]:
        watch = self.gateway_health if fault.kind == KILL_WORKER and self.gateway_health else self.stage_health
        return watch.samples

    def per_stage_health(self) -> bool:
        return any(s.stages is not None for s in self.stage_health.samples)

    def pid_samples(self, fault: Fault) -> list[tuple[float, int | None]]:
        if fault.kind == KILL_WORKER:
            assert self.processes is not None
            return [(t, pids.get(fault.target)) for t, pids in self.processes.worker_pids]
        return self.stage_pid_samples(fault.target)


def measure(rig: Rig, fault: Fault, outcomes: Sequence[Outcome], until: float = math.inf) -> None:
    """Detection, restart, ok again and recovery of ``fault``, in seconds from the signal, from what was seen
    between the signal and ``until`` (the next fault)."""
    if fault.at is None:
        return
    t0 = fault.at
    samples = [s for s in rig.health_samples(fault) if t0 <= s.t < until]
    unhealthy = next((s.t for s in samples if not rig.healthy(fault, s)), None)
    new_pid = next((t for t, pid in rig.pid_samples(fault)
                    if t0 <= t < until and pid is not None and pid != fault.pid), None)
    detected = unhealthy
    if fault.kind != KILL_WORKER and not rig.per_stage_health() and new_pid is not None:
        detected = new_pid if detected is None else min(detected, new_pid)  # /health tells nothing per stage
    fault.detected_s = None if detected is None else detected - t0
    fault.restarted_s = None if new_pid is None else new_pid - t0
    fault.ok_again_s = None
    if detected is not None:
        after = max(detected, new_pid or detected)
        fault.ok_again_s = next((s.t - t0 for s in samples if s.t >= after and rig.healthy(fault, s)), None)
    after_fault = [o for o in outcomes if t0 <= o.started < until]
    answers = [o.answered for o in after_fault if o.answered is not None]
    fault.answered_s = min(answers) - t0 if answers else None
    done = [o.ended for o in after_fault if o.kind == COMPLETED]
    fault.recovered_s = min(done) - t0 if done else None


def plan_faults(kill_stages: Sequence[str], stop_stage: str | None, stop_s: float, worker: str | None) -> list[Fault]:
    faults = [Fault(KILL, stage) for stage in kill_stages]
    if stop_stage is not None and stop_s > 0:
        faults.append(Fault(STOP, stop_stage, stop_s=stop_s))
    if worker is not None:
        faults.append(Fault(KILL_WORKER, worker))
    return faults


def fault_share(requests: int, faults: int) -> int:
    """Requests held back per fault until it is done."""
    return requests // (faults + 1)


async def run_faults(rig: Rig, faults: list[Fault], progress: Progress, concurrency: int,
                     probe: Callable[[], Awaitable[Outcome]], probes: list[Outcome], recovery_timeout_s: float,
                     rng: random.Random) -> None:
    """The faults one by one, spread over the load: fault k comes once the requests before its held-back share went
    out and some are in flight (plus 0.3-1.5 s, so that streams are under way), and only once the fault before it
    healed: a probe request completed and ``/health`` healthy again. Each fault releases its share."""
    share = fault_share(progress.total, len(faults))
    try:
        for index, fault in enumerate(faults):
            due = progress.total - share * (len(faults) - index)
            while not progress.done and not (progress.dispatched >= due and progress.in_flight > 0):
                if progress.in_flight == 0 and progress.dispatched >= progress.allowed:
                    progress.release(progress.allowed + max(1, min(concurrency, share)))  # some load for the fault
                await asyncio.sleep(0.05)
            if progress.in_flight:
                await asyncio.sleep(rng.uniform(0.3, 1.5))
            try:
                if await target_ready(rig, fault, time.perf_counter() + recovery_timeout_s):
                    fault.under_load = progress.in_flight > 0
                    await inject(rig, fault)
            finally:
                progress.release(progress.total - share * (len(faults) - index - 1))
            if fault.at is not None:
                await heal(rig, fault, probe, probes, fault.at + recovery_timeout_s)
    finally:
        progress.release(progress.total)


async def target_ready(rig: Rig, fault: Fault, deadline: float) -> bool:
    """Wait until ``/health`` shows the fault's target healthy (a stage may still be busy with a fault the server
    found by itself); ``fault.error`` if it does not get there by ``deadline``."""
    since = time.perf_counter()
    while time.perf_counter() < deadline:
        samples = rig.health_samples(fault)
        if samples and samples[-1].t > since and rig.healthy(fault, samples[-1]):
            return True
        if rig.down(fault):
            break
        await asyncio.sleep(HEALTH_POLL_S)
    samples = rig.health_samples(fault)
    seen = rig.describe(fault, samples[-1]) if samples else "no /health answer"
    fault.error = f"{fault.target} not healthy before the fault ({seen})"
    return False


async def inject(rig: Rig, fault: Fault) -> None:
    """Send the fault's signal to its process (a SIGSTOP is followed by a SIGCONT later); ``fault.error`` if not."""
    try:
        fault.pid = await rig.current_pid(fault)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        fault.error = f"no pid: {type(exc).__name__}: {exc}"
        return
    if fault.pid is None:
        fault.error = "no pid for it"
        return
    try:
        fault.at = time.perf_counter()
        os.kill(fault.pid, signal.SIGSTOP if fault.kind == STOP else signal.SIGKILL)
    except OSError as exc:  # not on this machine, or gone
        fault.error = f"{type(exc).__name__}: {exc}"
        fault.at = None
        return
    if fault.kind == STOP:
        fault.resume = asyncio.create_task(resume_later(fault.pid, fault.stop_s))


async def heal(rig: Rig, fault: Fault, probe: Callable[[], Awaitable[Outcome]], probes: list[Outcome],
               deadline: float) -> None:
    """Wait (bounded) until the fault healed: a probe request sent after it completed (probes are sent until one
    does), the stopped process continued, the fault seen by ``/health`` (a killed process replaced) and ``/health``
    healthy again after that. A stop that nothing reported by the time it ended is taken as undetected."""
    assert fault.at is not None
    pause = PROBE_PAUSE_S[0]
    while time.perf_counter() < deadline:
        outcome = await probe()
        probes.append(outcome)
        if outcome.kind == COMPLETED or rig.down(fault):
            break
        await asyncio.sleep(pause)
        pause = min(2 * pause, PROBE_PAUSE_S[1])
    if fault.resume is not None:
        await fault.resume
    undetected_after = time.perf_counter() + STOP_REPORT_GRACE_S
    while time.perf_counter() < deadline:
        measure(rig, fault, probes)
        replaced = fault.kind == STOP or fault.restarted_s is not None
        if fault.detected_s is not None and replaced and fault.ok_again_s is not None:
            return
        if fault.kind == STOP and fault.detected_s is None and time.perf_counter() > undetected_after:
            return
        if rig.down(fault):
            return
        await asyncio.sleep(0.05)


async def resume_later(pid: int, after_s: float) -> None:
    await asyncio.sleep(after_s)
    with contextlib.suppress(ProcessLookupError):  # the server replaced the stopped process meanwhile
        os.kill(pid, signal.SIGCONT)
