"""Server metrics for Prometheus, through ``prometheus_client``, named and labelled the way vLLM's are
(``omnipipe:time_to_first_token_seconds{model_name=...}``, ``omnipipe:num_requests_running``, ...), so a dashboard
written for vLLM finds the same series by swapping the prefix.

- Per request (observed when a request finishes): E2E, TTFT, TPOT, ITL, TTFP, RTF histograms; generated tokens
  and seconds of audio counters; prompt tokens looked up in the prefix cache and found there
  (``prefix_cache_queries`` / ``prefix_cache_hits``, in tokens, as vLLM counts them); HTTP requests by endpoint
  and status.
- Per realtime turn: end of the user's speech (the commit, or server VAD's speech_stopped) -> the answer's first
  audio, labelled by what ended the turn (``turn_end``: ``commit`` or ``server_vad``).
- Per scrape, from the engines (``EngineCollector``): requests running and waiting, what every stage holds, and
  each stage's liveness (up, stalled, heartbeat age, restarts, stalls) and the engine loop's age.
- The process itself (resident memory, CPU seconds, open fds, ...), from ``prometheus_client``'s collectors.

Every series carries ``model_name`` (the served model name); stage series also ``pipeline`` and ``stage``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from omnipipe.api.outputs import RequestMetrics

PREFIX = "omnipipe:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)
_TURN_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)  # a person's pause: ~0.2-1 s


class EngineCollector:
    """Series read from the engines at scrape time (``update`` is called with ``EnginePool.debug_states()``)."""

    def __init__(self, model_name: str, entry_stages: dict[str, str]) -> None:
        """``entry_stages``: pipeline -> the stage a request starts in (its waiting count is the queue)."""
        self.model_name = model_name
        self.entry_stages = entry_stages
        self.engines: dict[str, dict[str, Any]] = {}

    def update(self, engines: dict[str, dict[str, Any]]) -> None:
        self.engines = engines

    def collect(self) -> Iterator[Metric]:
        model = self.model_name
        ready = GaugeMetricFamily(f"{PREFIX}engine_ready", "1 when the pipeline's engine has loaded",
                                  labels=["model_name", "pipeline"])
        running = GaugeMetricFamily(f"{PREFIX}num_requests_running", "requests being worked on by some stage",
                                    labels=["model_name", "pipeline"])
        waiting = GaugeMetricFamily(f"{PREFIX}num_requests_waiting",
                                    "requests not yet scheduled by their first stage",
                                    labels=["model_name", "pipeline"])
        stage_labels = ["model_name", "pipeline", "stage"]
        held = GaugeMetricFamily(f"{PREFIX}stage_requests", "requests a stage holds right now", labels=stage_labels)
        queued_at = GaugeMetricFamily(f"{PREFIX}stage_requests_waiting", "requests a stage has not admitted yet "
                                      "(no room in its batch or its KV cache)", labels=stage_labels)
        kv_usage = GaugeMetricFamily(f"{PREFIX}stage_kv_cache_usage", "share of a batched stage's KV cache blocks "
                                     "reserved by its requests", labels=stage_labels)
        up = GaugeMetricFamily(f"{PREFIX}stage_up", "1 when the stage is running and making progress",
                               labels=stage_labels)
        stalled = GaugeMetricFamily(f"{PREFIX}stage_stalled", "1 while the stage makes no progress past its "
                                    "stall_report_s", labels=stage_labels)
        beat_age = GaugeMetricFamily(f"{PREFIX}stage_heartbeat_age_seconds", "since the stage's last heartbeat",
                                     labels=stage_labels)
        restarts = CounterMetricFamily(f"{PREFIX}stage_restarts", "restarts of the stage (after a death or a stall)",
                                       labels=stage_labels)
        stalls = CounterMetricFamily(f"{PREFIX}stage_stalls", "times the stage was reported stalled",
                                     labels=stage_labels)
        loop_age = GaugeMetricFamily(f"{PREFIX}engine_loop_age_seconds", "since the engine loop last ran its watchdog",
                                     labels=["model_name", "pipeline"])
        for pipeline, info in sorted(self.engines.items()):
            ready.add_metric([model, pipeline], float(info["status"] == "ready"))
            state = info.get("state") or {}
            stages = state.get("stages") or {}
            if state:
                entry = stages.get(self.entry_stages.get(pipeline, ""), {})
                queued = int(entry.get("waiting", 0))
                in_engine = len(state.get("client_requests", []))
                waiting.add_metric([model, pipeline], min(queued, in_engine))
                running.add_metric([model, pipeline], max(0, in_engine - queued))
            for stage, report in sorted(stages.items()):
                held.add_metric([model, pipeline, stage], len(report.get("requests") or []))
                queued_at.add_metric([model, pipeline, stage], int(report.get("waiting", 0)))
                kv = report.get("kv_cache")
                if kv and "blocks" in kv:  # a paged KV cache (the default thinker reports its prefix cache)
                    kv_usage.add_metric([model, pipeline, stage], kv["blocks_reserved"] / max(1, kv["blocks"]))
            health = info.get("health")
            if not health:
                continue
            loop_age.add_metric([model, pipeline], health["loop_age_s"])
            for stage, report in sorted(health["stages"].items()):
                labels = [model, pipeline, stage]
                up.add_metric(labels, float(report["state"] == "ok"))
                stalled.add_metric(labels, float(report["state"] == "stalled"))
                if report["heartbeat_age_s"] is not None:
                    beat_age.add_metric(labels, report["heartbeat_age_s"])
                restarts.add_metric(labels, report["restarts"])
                stalls.add_metric(labels, report["stalls"])
        yield from (ready, running, waiting, held, queued_at, kv_usage, up, stalled, beat_age, restarts, stalls,
                    loop_age)


class ServerMetrics:
    def __init__(self, model_name: str, entry_stages: dict[str, str]) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        labels = ["model_name", "endpoint"]
        self.requests = Counter(f"{PREFIX}http_requests", "HTTP requests by endpoint and status",
                                ["model_name", "endpoint", "status"], registry=self.registry)
        self.e2e = Histogram(f"{PREFIX}e2e_request_latency_seconds", "request in -> final output", labels,
                             buckets=_SECONDS_BUCKETS, registry=self.registry)
        self.ttft = Histogram(f"{PREFIX}time_to_first_token_seconds", "request in -> first text", labels,
                              buckets=_SECONDS_BUCKETS, registry=self.registry)
        self.tpot = Histogram(f"{PREFIX}time_per_output_token_seconds", "mean time per output token after the first",
                              labels, buckets=_TOKEN_BUCKETS, registry=self.registry)
        self.itl = Histogram(f"{PREFIX}inter_token_latency_seconds", "gaps between consecutive text outputs", labels,
                             buckets=_TOKEN_BUCKETS, registry=self.registry)
        self.ttfp = Histogram(f"{PREFIX}time_to_first_packet_seconds", "request in -> first audio", labels,
                              buckets=_SECONDS_BUCKETS, registry=self.registry)
        self.rtf = Histogram(f"{PREFIX}real_time_factor", "E2E / seconds of audio produced", labels,
                             buckets=_RTF_BUCKETS, registry=self.registry)
        self.tokens = Counter(f"{PREFIX}generation_tokens", "text tokens generated", labels, registry=self.registry)
        self.audio = Counter(f"{PREFIX}generation_audio_seconds", "seconds of audio generated", labels,
                             registry=self.registry)
        self.prefix_queries = Counter(f"{PREFIX}prefix_cache_queries", "prompt tokens looked up in the prefix cache",
                                      labels, registry=self.registry)
        self.prefix_hits = Counter(f"{PREFIX}prefix_cache_hits", "prompt tokens found in the prefix cache (their "
                                   "prefill spared)", labels, registry=self.registry)
        self.speech_end_to_first_audio = Histogram(
            f"{PREFIX}realtime_speech_end_to_first_audio_seconds", "realtime turn: end of the user's speech (commit, "
            "or the VAD's speech_stopped: turn_end server_vad or semantic_vad) -> the answer's first audio",
            ["model_name", "turn_end"],
            buckets=_TURN_BUCKETS, registry=self.registry)
        self.turn_transcriptions = Counter(
            f"{PREFIX}realtime_turn_transcriptions", "realtime spoken turns transcribed (once each)", ["model_name"],
            registry=self.registry)
        self.streamed_turns = Counter(
            f"{PREFIX}realtime_streamed_turns", "realtime spoken turns whose audio streamed into the pipeline while it "
            "was spoken (the thinker's audio features and encoder made as it came)", ["model_name"],
            registry=self.registry)
        self.speculative_starts = Counter(
            f"{PREFIX}realtime_speculative_starts", "answers started tentatively when the user paused, by outcome "
            "(released: the turn ended; dropped: the user went on)", ["model_name", "outcome"], registry=self.registry)
        self.spoken_answers = Counter(
            f"{PREFIX}realtime_spoken_answers", "realtime answers that sent audio", ["model_name"],
            registry=self.registry)
        self.underruns = Counter(
            f"{PREFIX}realtime_playback_underruns", "gaps in realtime answers' audio played at real-time pace from "
            "its first chunk (the next chunk came over 20 ms after the audio before it had played out)",
            ["model_name"], registry=self.registry)
        self.engines = EngineCollector(model_name, entry_stages)
        self.registry.register(self.engines)

    def count_request(self, endpoint: str, status: int) -> None:
        self.requests.labels(self.model_name, endpoint, str(status)).inc()

    def observe(self, endpoint: str, metrics: RequestMetrics | None) -> None:
        if metrics is None:
            return
        labels = (self.model_name, endpoint)
        self.e2e.labels(*labels).observe(metrics.e2e_s)
        if metrics.ttft_s is not None:
            self.ttft.labels(*labels).observe(metrics.ttft_s)
        if metrics.tpot_s is not None:
            self.tpot.labels(*labels).observe(metrics.tpot_s)
        for gap in metrics.itl_s:
            self.itl.labels(*labels).observe(gap)
        if metrics.ttfp_s is not None:
            self.ttfp.labels(*labels).observe(metrics.ttfp_s)
        if metrics.rtf is not None:
            self.rtf.labels(*labels).observe(metrics.rtf)
        self.tokens.labels(*labels).inc(metrics.num_output_tokens)
        self.audio.labels(*labels).inc(metrics.audio_duration_s)
        self.prefix_queries.labels(*labels).inc(metrics.num_prompt_tokens)
        self.prefix_hits.labels(*labels).inc(metrics.num_cached_tokens)

    def observe_speech_end_to_first_audio(self, seconds: float, turn_end: str) -> None:
        """One realtime turn's gap; ``turn_end`` is ``commit`` or ``server_vad``."""
        self.speech_end_to_first_audio.labels(self.model_name, turn_end).observe(seconds)

    def count_turn_transcription(self) -> None:
        self.turn_transcriptions.labels(self.model_name).inc()

    def count_streamed_turn(self) -> None:
        self.streamed_turns.labels(self.model_name).inc()

    def count_speculative_start(self, outcome: str) -> None:
        """``outcome``: ``released`` or ``dropped``."""
        self.speculative_starts.labels(self.model_name, outcome).inc()

    def observe_spoken_answer(self, underruns: int) -> None:
        """A realtime answer that sent audio, and the times its playback would have run dry."""
        self.spoken_answers.labels(self.model_name).inc()
        self.underruns.labels(self.model_name).inc(underruns)

    def render(self, engines: dict[str, dict[str, Any]]) -> bytes:
        """The exposition text; ``engines`` is ``EnginePool.debug_states()`` taken just before."""
        self.engines.update(engines)
        return generate_latest(self.registry)
