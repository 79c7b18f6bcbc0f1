"""Estimated waiting time from per-request-type moving averages of real session durations.

A waiter's estimate comes from what is actually ahead of it: the sessions running on the worker slots (each with the
time its type typically lasts, less how long it has run) and the requests queued before it (each with its own type's
typical duration), served first come, first served by the slots (``EtaEstimator.estimate_waits``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RunningSession:
    """A session holding a worker slot: its request type and how long it has run."""

    request_type: str
    elapsed_s: float


@dataclass
class _TypeStats:
    samples: int = 0
    ema_s: float | None = None


class EtaEstimator:
    """Per request type, an exponential moving average of observed durations.

    Until a type has ``min_samples`` observations its admin-set baseline is used (``default_s`` when no
    baseline is set).  ``estimate_waits`` turns the sessions running and the requests queued into waits.
    """

    def __init__(
        self,
        baselines: Mapping[str, float] | None = None,
        *,
        alpha: float = 0.2,
        min_samples: int = 5,
        default_s: float = 30.0,
    ) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {min_samples}")
        if default_s < 0:
            raise ValueError(f"default_s must be >= 0, got {default_s}")
        self.alpha = alpha
        self.min_samples = min_samples
        self.default_s = default_s
        self._baselines: dict[str, float] = {}
        self._stats: dict[str, _TypeStats] = {}
        for request_type, seconds in (baselines or {}).items():
            self.set_baseline(request_type, seconds)

    def set_baseline(self, request_type: str, seconds: float) -> None:
        """Set the duration assumed for ``request_type`` until enough samples exist."""
        if seconds < 0:
            raise ValueError(f"baseline must be >= 0, got {seconds}")
        self._baselines[request_type] = float(seconds)

    def observe(self, request_type: str, duration_s: float) -> None:
        """Fold one real session duration into the average for ``request_type``."""
        if duration_s < 0 or math.isnan(duration_s):
            raise ValueError(f"duration must be >= 0, got {duration_s}")
        stats = self._stats.setdefault(request_type, _TypeStats())
        stats.samples += 1
        if stats.ema_s is None:
            stats.ema_s = float(duration_s)
        else:
            stats.ema_s = self.alpha * duration_s + (1.0 - self.alpha) * stats.ema_s

    def samples(self, request_type: str) -> int:
        """How many durations have been observed for ``request_type``."""
        stats = self._stats.get(request_type)
        return stats.samples if stats else 0

    def duration_s(self, request_type: str) -> float:
        """Expected session duration: the moving average once warmed up, else the baseline."""
        stats = self._stats.get(request_type)
        if stats is not None and stats.ema_s is not None and stats.samples >= self.min_samples:
            return stats.ema_s
        return self._baselines.get(request_type, self.default_s)

    def remaining_s(self, session: RunningSession) -> float:
        """How long a running session has left: its type's duration less how long it has run; a session already
        past its type's duration counts as ending any moment (0)."""
        return max(0.0, self.duration_s(session.request_type) - max(0.0, session.elapsed_s))

    def estimate_waits(self, slots: Sequence[RunningSession | None], waiting: Sequence[str]) -> list[float]:
        """The wait of each queued request (``waiting``: their types, front of the queue first) for a free slot.

        ``slots`` is every worker slot that serves the queue: the session running in it, or ``None`` when it is free.
        A simulation of the FIFO: each request in turn takes the slot that frees first and holds it for its type's
        duration. The first request waits for the earliest slot, the next for the earliest after that, and so on.
        Without any slot nothing is ever served: ``ValueError``.
        """
        if not slots:
            raise ValueError("no worker slot serves the queue: a wait cannot be estimated")
        free_at = [0.0 if session is None else self.remaining_s(session) for session in slots]
        heapq.heapify(free_at)
        waits = []
        for request_type in waiting:
            start = heapq.heappop(free_at)
            waits.append(start)
            heapq.heappush(free_at, start + self.duration_s(request_type))
        return waits

    def snapshot(self) -> dict[str, dict[str, float | int | None]]:
        """Per request type: baseline, sample count, moving average, the duration in use, and whether that is the
        measured average (``measured``: at least ``min_samples`` sessions) rather than the baseline."""
        types = sorted(set(self._baselines) | set(self._stats))
        return {
            t: {
                "baseline_s": self._baselines.get(t),
                "samples": self.samples(t),
                "ema_s": self._stats[t].ema_s if t in self._stats else None,
                "duration_s": self.duration_s(t),
                "min_samples": self.min_samples,
                "measured": self.samples(t) >= self.min_samples,  # duration_s is the average, not the baseline
            }
            for t in types
        }
