"""Which runnable requests a stage step serves first: oldest first, or the stream whose playback runs dry soonest.

The stage option ``schedule`` (``stages.<name>.options.schedule``) picks the policy:

- ``fifo`` (default): arrival order, as a stage always served.
- ``deadline``: earliest playback deadline first. A request's deadline is when the audio it has produced so far
  (``RunnerOutput.playback_s``, summed over its outputs in this stage) has all played, counting from its first
  such output: ``first output + seconds produced``. A request with no playback yet has its arrival as deadline:
  the user has been waiting for its first audio since then, so it comes before any stream with audio buffered,
  and such requests go in arrival order. Ties go by arrival. A runner that does not say what its outputs carry
  leaves every deadline at the arrival: the order is then FIFO.

Only a stage whose outputs are (nearly) audio says what they carry: the default family's talker (frames) and
decoder (samples). A thinker's tokens become audio only once a whole spoken piece has reached the talker, so an
estimate there (tried: 0.3 s a token, with ``defer_slack_s`` 1.5) deferred streams whose first audio had not
sounded yet: end of speech -> first audio at 4 sessions went from p50 2.5 s (fifo) to 4.5 s, one bench run each on
the 2-core box. ``fifo`` stays the default until ``deadline`` measures better.

With ``deadline``, ``defer_slack_s`` (seconds, default none) lets a step leave out the requests whose slack
(deadline minus now) exceeds it while a more urgent one is runnable: for a runner that runs a batch request by
request, the urgent one's output then leaves after its own work, not after everyone's. Nothing starves: slack
shrinks as time passes, so a deferred request's turn comes at the latest when its slack falls to the threshold,
and without an urgent request every runnable one runs as long as there is room.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput

SCHEDULES = ("fifo", "deadline")
Clock = Callable[[], float]


@dataclass
class Playback:
    """What one request's outputs in this stage carried: when the first left, and how many seconds in all."""

    first_output_s: float
    seconds: float


class ServiceOrder:
    """Orders a stage's runnable requests by the ``schedule`` option; schedulers record each output here."""

    def __init__(self, options: dict[str, Any] | None = None, clock: Clock = time.perf_counter) -> None:
        options = options or {}
        schedule = options.get("schedule", "fifo")
        if schedule not in SCHEDULES:
            raise ValueError(f"options.schedule: must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
        self.by_deadline = schedule == "deadline"
        self.defer_slack_s = _deadline_seconds(options, "defer_slack_s", self.by_deadline)
        self.clock = clock
        self.playback: dict[str, Playback] = {}

    def record(self, request: StageRequest, output: RunnerOutput) -> None:
        """Count the playback an output of ``request`` carries (none when its runner does not say). Its playback
        starts with the first output that carries some."""
        seconds = output.playback_s
        if not seconds:
            return
        playback = self.playback.get(request.request_id)
        if playback is None:
            self.playback[request.request_id] = Playback(self.clock(), seconds)
        else:
            playback.seconds += seconds

    def forget(self, request_id: str) -> None:
        self.playback.pop(request_id, None)

    def deadline_s(self, request: StageRequest) -> float:
        """When ``request``'s playback runs dry (its arrival while it has none)."""
        playback = self.playback.get(request.request_id)
        return request.arrival_s if playback is None else playback.first_output_s + playback.seconds

    def order(self, requests: Iterable[StageRequest]) -> list[StageRequest]:
        """``requests`` (given oldest first) in the order to serve them: as given for ``fifo``, most urgent first
        for ``deadline``."""
        if not self.by_deadline:
            return list(requests)
        return sorted(requests, key=lambda request: (self.deadline_s(request), request.arrival_s))

    def pick(self, requests: Iterable[StageRequest], room: int) -> list[StageRequest]:
        """Up to ``room`` of ``requests`` for one step, in serving order; with ``defer_slack_s``, those with more
        slack than it stay out while a more urgent one is among them."""
        ordered = self.order(requests)[:max(room, 0)]
        if self.defer_slack_s is None or not ordered:
            return ordered
        now = self.clock()
        urgent = [request for request in ordered if self.deadline_s(request) - now <= self.defer_slack_s]
        return urgent or ordered


def _deadline_seconds(options: dict[str, Any], key: str, by_deadline: bool) -> float | None:
    """A ``deadline`` knob in seconds (None when unset), checked: a number >= 0, and only with ``deadline``."""
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"options.{key}: must be a number of seconds >= 0, got {value!r}")
    if not by_deadline:
        raise ValueError(f"options.{key}: only with options.schedule 'deadline'")
    return float(value)
