"""Liveness: whether each stage and the orchestrator itself are making progress.

A stage's heartbeat thread (``stage/heartbeat.py``) reports every ``heartbeat_interval_s`` that the process lives
and how long its current step has run. From that the orchestrator's watchdog knows, per stage, how long it has
made no progress: the time since the last beat (a stopped or wedged process sends none), or the current step's
run time so far (a process alive but stuck in one step). Past the stage's ``stall_report_s`` the stage is
``stalled`` (reported in ``/health`` and the metrics); past ``stall_restart_s`` the watchdog kills it, and the
stage is then handled like any dead stage (its requests fail naming it and why, it is restarted).

``EngineHealth`` is what ``AsyncOmni.health()`` returns: a snapshot read from the orchestrator's thread without
waiting on its loop, so a wedged loop is reported instead of hanging the caller.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

StageState = Literal["ok", "stalled", "restarting", "down"]
LOOP_STALL_S = 2.0  # an orchestrator loop that has not ticked for this long (or 4 watchdog periods) is reported


@dataclass
class StageLiveness:
    report_s: float
    restart_s: float | None
    last_beat: float = field(default_factory=time.monotonic)
    step_s: float = 0.0  # the current step's run time at the last beat (0: between steps)
    stalled_since: float | None = None
    stalls: int = 0  # how many times this stage was reported stalled
    killed_for: str | None = None  # why the watchdog killed the stage, until it has been replaced

    def reset(self) -> None:
        """A (re)started stage is ready: it starts with a clean record."""
        self.last_beat = time.monotonic()
        self.step_s = 0.0
        self.stalled_since = None
        self.killed_for = None

    def beat(self, step_s: float) -> None:
        self.last_beat = time.monotonic()
        self.step_s = step_s

    def no_progress_s(self, now: float) -> float:
        silence = now - self.last_beat
        return self.step_s + silence if self.step_s > 0 else silence

    def check(self, now: float) -> Literal["ok", "stalled", "recovered", "newly_stalled", "restart"]:
        """Update the stall record at ``now``; what changed decides what the watchdog logs or does."""
        idle_for = self.no_progress_s(now)
        if self.restart_s is not None and idle_for >= self.restart_s and self.killed_for is None:
            return "restart"
        if idle_for >= self.report_s:
            if self.stalled_since is None:
                self.stalled_since = now - idle_for
                self.stalls += 1
                return "newly_stalled"
            return "stalled"
        if self.stalled_since is not None:
            self.stalled_since = None
            return "recovered"
        return "ok"


@dataclass
class StageHealth:
    state: StageState
    pid: int | None
    restarts: int
    heartbeat_age_s: float | None  # None while the stage is not up
    no_progress_s: float | None
    stalls: int
    problem: str | None = None


@dataclass
class EngineHealth:
    ok: bool
    loop_age_s: float  # since the orchestrator's loop last ran its watchdog
    stages: dict[str, StageHealth]
    problems: list[str]

    def stages_dict(self) -> dict[str, dict[str, Any]]:
        """Each stage as JSON (``protocol.worker.StageHealthReply``)."""
        return {name: {"state": s.state, "pid": s.pid, "restarts": s.restarts,
                       "heartbeat_age_s": None if s.heartbeat_age_s is None else round(s.heartbeat_age_s, 3),
                       "no_progress_s": None if s.no_progress_s is None else round(s.no_progress_s, 3),
                       "stalls": s.stalls}
                for name, s in self.stages.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "loop_age_s": round(self.loop_age_s, 3), "problems": list(self.problems),
                "stages": self.stages_dict()}
