"""Server metrics in the Prometheus text format: requests by endpoint and status, latency histograms, and what
every stage holds right now (from the engines' debug state)."""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from typing import Any

from omnipipe.api.outputs import RequestMetrics

_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.help_text = help_text
        self.buckets = buckets
        self.series: dict[tuple[tuple[str, str], ...], tuple[list[int], list[float]]] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        counts, totals = self.series.setdefault(key, ([0] * (len(self.buckets) + 1), [0.0]))
        counts[bisect.bisect_left(self.buckets, value)] += 1
        totals[0] += value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} histogram"]
        for key, (counts, totals) in sorted(self.series.items()):
            cumulative = 0
            for bound, count in zip((*self.buckets, float("inf")), counts):
                cumulative += count
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f"{self.name}_bucket{_labels(key + (('le', le),))} {cumulative}")
            lines.append(f"{self.name}_sum{_labels(key)} {totals[0]}")
            lines.append(f"{self.name}_count{_labels(key)} {cumulative}")
        return lines


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: tuple[tuple[str, str], ...]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}" if pairs else ""


class ServerMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str]] = Counter()
        self.e2e = Histogram("omnipipe_request_e2e_seconds", "request in -> final output", _SECONDS_BUCKETS)
        self.ttft = Histogram("omnipipe_request_ttft_seconds", "request in -> first text", _SECONDS_BUCKETS)
        self.ttfp = Histogram("omnipipe_request_ttfp_seconds", "request in -> first audio", _SECONDS_BUCKETS)
        self.rtf = Histogram("omnipipe_request_rtf", "E2E / audio duration", _RTF_BUCKETS)

    def count_request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, str(status))] += 1

    def observe(self, endpoint: str, metrics: RequestMetrics | None) -> None:
        if metrics is None:
            return
        with self._lock:
            self.e2e.observe(metrics.e2e_s, endpoint=endpoint)
            if metrics.ttft_s is not None:
                self.ttft.observe(metrics.ttft_s, endpoint=endpoint)
            if metrics.ttfp_s is not None:
                self.ttfp.observe(metrics.ttfp_s, endpoint=endpoint)
            if metrics.rtf is not None:
                self.rtf.observe(metrics.rtf, endpoint=endpoint)

    def render(self, engines: dict[str, dict[str, Any]]) -> str:
        """``engines``: pipeline name -> {"status": ..., "state": debug_state or None}."""
        lines = ["# HELP omnipipe_requests_total HTTP requests by endpoint and status",
                 "# TYPE omnipipe_requests_total counter"]
        with self._lock:
            for (endpoint, status), count in sorted(self.requests.items()):
                lines.append(f"omnipipe_requests_total{_labels((('endpoint', endpoint), ('status', status)))} {count}")
            for histogram in (self.e2e, self.ttft, self.ttfp, self.rtf):
                lines += histogram.render()
        lines += ["# HELP omnipipe_engine_ready 1 when the pipeline's engine has loaded",
                  "# TYPE omnipipe_engine_ready gauge"]
        for name, info in sorted(engines.items()):
            lines.append(f"omnipipe_engine_ready{_labels((('pipeline', name),))} {int(info['status'] == 'ready')}")
        lines += ["# HELP omnipipe_stage_requests requests a stage holds right now",
                  "# TYPE omnipipe_stage_requests gauge"]
        for name, info in sorted(engines.items()):
            state = info.get("state") or {}
            for stage, held in sorted((state.get("stages") or {}).items()):
                count = len(held.get("requests") or [])
                lines.append(f"omnipipe_stage_requests{_labels((('pipeline', name), ('stage', stage)))} {count}")
        lines += self._liveness(engines)
        return "\n".join(lines) + "\n"

    @staticmethod
    def _liveness(engines: dict[str, dict[str, Any]]) -> list[str]:
        """Per stage: up (ok) or not, stalled, heartbeat age, restarts and stalls so far; per engine: loop age."""
        gauges = {
            "omnipipe_stage_up": ("gauge", "1 when the stage is running and making progress"),
            "omnipipe_stage_stalled": ("gauge", "1 while the stage makes no progress past its stall_report_s"),
            "omnipipe_stage_heartbeat_age_seconds": ("gauge", "since the stage's last heartbeat"),
            "omnipipe_stage_restarts_total": ("counter", "restarts of the stage (after a death or a stall)"),
            "omnipipe_stage_stalls_total": ("counter", "times the stage was reported stalled"),
            "omnipipe_engine_loop_age_seconds": ("gauge", "since the engine loop last ran its watchdog"),
        }
        values: dict[str, list[str]] = {metric: [] for metric in gauges}
        for name, info in sorted(engines.items()):
            health = info.get("health")
            if not health:
                continue
            values["omnipipe_engine_loop_age_seconds"].append(
                f"omnipipe_engine_loop_age_seconds{_labels((('pipeline', name),))} {health['loop_age_s']}")
            for stage, report in sorted(health["stages"].items()):
                labels = _labels((("pipeline", name), ("stage", stage)))
                values["omnipipe_stage_up"].append(f"omnipipe_stage_up{labels} {int(report['state'] == 'ok')}")
                values["omnipipe_stage_stalled"].append(
                    f"omnipipe_stage_stalled{labels} {int(report['state'] == 'stalled')}")
                if report["heartbeat_age_s"] is not None:
                    values["omnipipe_stage_heartbeat_age_seconds"].append(
                        f"omnipipe_stage_heartbeat_age_seconds{labels} {report['heartbeat_age_s']}")
                values["omnipipe_stage_restarts_total"].append(
                    f"omnipipe_stage_restarts_total{labels} {report['restarts']}")
                values["omnipipe_stage_stalls_total"].append(f"omnipipe_stage_stalls_total{labels} {report['stalls']}")
        lines: list[str] = []
        for metric, (kind, help_text) in gauges.items():
            lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}", *values[metric]]
        return lines
