"""``omnipipe bench serve --save-result``: one JSON file per (max concurrency, rate) in the shape ``vllm bench serve``
writes (``vllm/benchmarks/serve.py``: ``main_async``'s ``result_json`` merged with ``benchmark``'s ``result``), so
vLLM's own tooling reads it.

The keys: ``date`` (``%Y%m%d-%H%M%S``), ``endpoint_type``, ``backend``, ``label``, ``model_id``, ``tokenizer_id``
(null: the client counts no tokens; they come from the server's usage), ``num_prompts``, ``request_rate`` (a
number or ``"inf"``), ``burstiness``, ``max_concurrency``, ``duration``, ``completed``, ``failed``,
``total_input_tokens``, ``total_output_tokens``, ``request_throughput``, ``request_goodput`` (null without
``--goodput``), ``output_throughput``, ``total_token_throughput``, ``latencies`` and ``queue_times`` (per request,
seconds), ``max_output_tokens_per_s``,
``max_concurrent_requests``, ``rtfx`` (seconds of input audio per second of the run), then for every selected
percentile metric ``mean_X_ms``, ``median_X_ms``, ``std_X_ms`` and ``pP_X_ms`` (``X``: ttft, tpot, itl, e2el, ttfp;
for rtf, a ratio, the same names without ``_ms``). With ``--save-detailed`` also the per-request lists
``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``start_times``, ``generated_texts``,
``errors`` (``""`` for a request that succeeded). omnipipe's own figures are under ``omnipipe``: the endpoint,
base URL, dataset, modalities, goodput bounds, the machine, the mean WER (transcriptions), and with
``--save-detailed`` the per-request ``ttfps``, ``rtfs``, ``audio_seconds`` and ``wers``.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from omnipipe.bench.report import mean, percentile_key
from omnipipe.bench.serve_endpoints import RequestResult

MS_METRICS = ("ttft", "tpot", "itl", "e2el", "ttfp")  # in milliseconds; rtf is a ratio


def stat_key(stat: str, metric: str) -> str:
    """``("mean", "ttft")`` -> ``"mean_ttft_ms"``; ``("p99", "rtf")`` -> ``"p99_rtf"``."""
    return f"{stat}_{metric}_ms" if metric in MS_METRICS else f"{stat}_{metric}"


def peak_output_tokens_per_s(results: list[RequestResult]) -> float:
    """The most text deltas received in one second of the run (as vLLM counts them: a token at the first delta and
    one after each inter-token gap, in 1 s buckets from the first request's start)."""
    done = [r for r in results if r.ok and r.ttft_s is not None]
    if not done:
        return 0.0
    origin = min(r.start_s for r in done)
    buckets: dict[int, int] = {}
    for r in done:
        moment = r.start_s + (r.ttft_s or 0.0)
        for gap in [0.0, *r.itl_s]:
            moment += gap
            buckets[int(moment - origin)] = buckets.get(int(moment - origin), 0) + 1
    return float(max(buckets.values()))


def peak_concurrency(results: list[RequestResult]) -> int:
    """The most requests in flight at once (half-open [start, end) intervals)."""
    events = sorted([(r.start_s, 1) for r in results if r.ok] + [(r.start_s + r.e2el_s, -1) for r in results if r.ok])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def vllm_result(row: dict[str, Any], results: list[RequestResult], meta: dict[str, Any], selected: list[str],
                percentiles: list[float], detailed: bool, date: str) -> dict[str, Any]:
    """The result of one (max concurrency, rate) run; ``row`` is its summary (``summarize_run``), whose figures the
    table prints."""
    done = [r for r in results if r.ok]
    duration = row["duration_s"]
    total_in = sum(r.input_tokens for r in done)
    total_out = sum(r.output_tokens for r in done)
    rate = row["request_rate"]
    out: dict[str, Any] = {
        "date": date, "endpoint_type": meta["backend"], "backend": meta["backend"], "label": meta["label"],
        "model_id": meta["model"], "tokenizer_id": None, "num_prompts": row["prompts"],
        **{k: v for k, v in meta["metadata"].items()},
        "request_rate": "inf" if rate is None else rate, "burstiness": meta["burstiness"],
        "max_concurrency": row["max_concurrency"],
        "duration": duration, "completed": row["completed"], "failed": row["failed"],
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": row["throughput_rps"], "request_goodput": row["goodput_rps"],
        "output_throughput": total_out / duration if duration > 0 else 0.0,
        "total_token_throughput": (total_in + total_out) / duration if duration > 0 else 0.0,
        "latencies": [r.e2el_s for r in results], "queue_times": [r.queue_s for r in results],
        "max_output_tokens_per_s": peak_output_tokens_per_s(results),
        "max_concurrent_requests": peak_concurrency(results),
        "rtfx": sum(r.input_audio_s for r in done) / duration if duration > 0 else 0.0,
    }
    if detailed:
        out.update({
            "input_lens": [r.input_tokens for r in results],
            "output_lens": [r.output_tokens if r.ok else 0 for r in results],
            "ttfts": [r.ttft_s or 0.0 for r in results], "itls": [list(r.itl_s) for r in results],
            "start_times": [r.start_s for r in results],
            "generated_texts": [r.text for r in results], "errors": [r.error or "" for r in results],
        })
    for metric in selected:
        stats = row[metric] or {}  # a metric no request produced: 0.0, as vLLM writes it
        for stat in ("mean", "median", "std", *(percentile_key(p) for p in percentiles)):
            out[stat_key(stat, metric)] = float(stats.get(stat, 0.0))
    wers = [r.wer for r in done if r.wer is not None]
    extra: dict[str, Any] = {key: meta[key] for key in ("endpoint", "base_url", "dataset", "modalities", "goodput",
                                                        "max_tokens", "machine")}
    extra["mean_wer"] = mean(wers) if wers else None
    if detailed:
        extra.update({"ttfps": [r.ttfp_s for r in results], "rtfs": [r.rtf for r in results],
                      "audio_seconds": [r.audio_s for r in results], "wers": [r.wer for r in results]})
    out["omnipipe"] = extra
    return out


def result_path(result_dir: str | None, result_filename: str | None, label: str, rate: float | None,
                concurrency: int, model: str, date: str) -> Path:
    """vLLM's default name, ``{label}-{rate}qps-concurrency{N}-{model}-{date}.json``, unless a name is given."""
    name = result_filename or (f"{label}-{float('inf') if rate is None else float(rate)}qps-concurrency{concurrency}-"
                               f"{model.split('/')[-1]}-{date}.json")
    return Path(result_dir) / name if result_dir else Path(name)


def write_result(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def now_stamp() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S")
