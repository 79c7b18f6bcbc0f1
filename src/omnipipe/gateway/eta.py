"""Estimated waiting time from per-request-type moving averages of real session durations."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass
class _TypeStats:
    samples: int = 0
    ema_s: float | None = None


class EtaEstimator:
    """Per request type, an exponential moving average of observed durations.

    Until a type has ``min_samples`` observations its admin-set baseline is used (``default_s`` when no
    baseline is set).  Waiting time assumes a session of the waiter's type occupies each slot ahead.
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

    def estimate_wait_s(self, position: int, request_type: str, total_capacity: int) -> float:
        """Wait for the waiter at 1-based ``position`` when ``total_capacity`` slots serve the queue.

        Slots are assumed to turn over in waves, so positions 1..capacity wait one duration, the next
        ``capacity`` positions two, and so on.  Position 0 (already served) waits nothing; no capacity at
        all is treated as a single slot.
        """
        if position <= 0:
            return 0.0
        waves = math.ceil(position / max(total_capacity, 1))
        return waves * self.duration_s(request_type)

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
