"""Per-request metrics, measured where the caller sees the outputs (same definitions as the benchmarks)."""

from __future__ import annotations

import time
from typing import Any

from omnipipe.api.outputs import RequestMetrics


class RequestClock:
    """Timestamps one request's outputs as they reach the caller."""

    def __init__(self) -> None:
        self.start_s = time.perf_counter()
        self.text_times_s: list[float] = []
        self.num_tokens = 0
        self.first_audio_s: float | None = None
        self.audio_samples = 0
        self.sample_rate_hz: int | None = None

    def on_text(self, num_tokens: int) -> None:
        self.text_times_s.append(time.perf_counter() - self.start_s)
        self.num_tokens += max(1, num_tokens)

    def on_audio(self, num_samples: int, sample_rate_hz: int | None) -> None:
        if self.first_audio_s is None:
            self.first_audio_s = time.perf_counter() - self.start_s
        self.audio_samples += num_samples
        self.sample_rate_hz = sample_rate_hz or self.sample_rate_hz

    def hops(self, plan: list[str], stages: dict[str, dict[str, Any]], end_s: float) -> dict[str, float]:
        """The request's path split into hops, for stages run one after another: caller -> first stage (this
        clock's start to the stage taking the Submit off its socket), each stage -> the next (the finished output
        about to be encoded to the next stage's Submit taken off its socket, via the orchestrator), last stage ->
        caller (to ``end_s``, the done event in the caller's hands). Stamps are ``perf_counter`` values of
        different processes: comparable on one machine only. Empty if a stage lacks its stamps or the stages
        overlapped (a stage received its Submit before the previous one finished: async chunk)."""
        points: list[tuple[str, float, float]] = []
        for name in plan:
            metrics = stages.get(name, {})
            arrived, sent = metrics.get("arrived_at_s"), metrics.get("sent_at_s")
            if not isinstance(arrived, float) or not isinstance(sent, float):
                return {}
            points.append((name, arrived, sent))
        hops: dict[str, float] = {}
        previous, left_at = "caller", self.start_s
        for name, arrived, sent in [*points, ("caller", end_s, end_s)]:
            if arrived < left_at:
                return {}
            hops[f"{previous}->{name}"] = arrived - left_at
            previous, left_at = name, sent
        return hops

    def finish(self, stages: dict[str, dict[str, Any]], edges: dict[str, dict[str, Any]],
               plan: list[str] | None = None) -> RequestMetrics:
        end_s = time.perf_counter()
        e2e = end_s - self.start_s
        times = self.text_times_s
        itl = [b - a for a, b in zip(times, times[1:], strict=False)]
        tpot = (times[-1] - times[0]) / (self.num_tokens - 1) if len(times) > 1 and self.num_tokens > 1 else None
        duration = self.audio_samples / self.sample_rate_hz if self.sample_rate_hz else 0.0
        return RequestMetrics(
            e2e_s=e2e, ttft_s=times[0] if times else None, tpot_s=tpot, itl_s=itl, ttfp_s=self.first_audio_s,
            audio_duration_s=duration, rtf=(e2e / duration) if duration > 0 else None,
            num_output_tokens=self.num_tokens, stages=stages, edges=edges,
            num_prompt_tokens=sum(int(m.get("prompt_tokens", 0)) for m in stages.values()),
            # a prompt's tokens found in a prefix cache, where they count as prompt tokens (a talker's prompt is made
            # of the thinker's; what it shares is in its stage's figures, not the request's usage)
            num_cached_tokens=sum(int(m.get("cached_prompt_tokens", 0)) for m in stages.values()
                                  if int(m.get("prompt_tokens", 0))),
            hops_s=self.hops(plan, stages, end_s) if plan else {},
        )


def format_request_metrics(metrics: RequestMetrics) -> str:
    """A readable table of one request's metrics (what ``omnipipe generate --stats`` prints)."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.1f} ms"

    summary = metrics.summary()
    rows = [
        ("E2E", ms(metrics.e2e_s)),
        ("TTFT (first text)", ms(metrics.ttft_s)),
        ("TPOT (per token)", ms(metrics.tpot_s)),
        ("ITL (mean)", ms(summary["itl_mean_s"])),
        ("TTFP (first audio)", ms(metrics.ttfp_s)),
        ("audio", f"{metrics.audio_duration_s:.2f} s"),
        ("RTF", "-" if metrics.rtf is None else f"{metrics.rtf:.3f}"),
        ("prompt tokens", str(metrics.num_prompt_tokens)),
        ("  cached", str(metrics.num_cached_tokens)),
        ("output tokens", str(metrics.num_output_tokens)),
    ]
    lines = ["request", *(f"  {name:<20} {value}" for name, value in rows), "stages"]
    lines.append(f"  {'stage':<12} {'input wait':>10} {'queue':>10} {'compute':>10} {'units':>7} {'max batch':>9}")
    for stage, m in metrics.stages.items():
        lines.append(f"  {stage:<12} {ms(m.get('input_wait_s')):>10} {ms(m.get('queue_s')):>10} "
                     f"{ms(m.get('compute_s')):>10} "
                     f"{m.get('units', 0):>7} {m.get('max_batch_size', 0):>9}")
    if metrics.edges:
        lines.append("edges")
        lines.append(f"  {'edge':<22} {'chunks':>6} {'bytes':>10} {'transfer':>10}")
        for edge, m in metrics.edges.items():
            lines.append(f"  {edge:<22} {m.get('chunks', 0):>6} {m.get('bytes', 0):>10} {ms(m.get('transfer_s')):>10}")
    return "\n".join(lines)
