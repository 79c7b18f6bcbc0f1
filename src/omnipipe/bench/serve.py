"""``omnipipe bench serve``: load on a running server, as ``vllm bench serve`` measures it, on the endpoints an
omni-modal server has (chat with spoken answers, speech, transcription, realtime).

    omnipipe bench serve --base-url http://127.0.0.1:8091 --num-prompts 50 --max-concurrency 1,4,10

For each max concurrency, ``--num-prompts`` requests run with at most that many in flight; each one measures, from
the client's side (``bench/serve_endpoints.py`` says how per endpoint): E2EL (request sent -> answer complete),
TTFT (first text), TPOT (time per output token after the first, with the token count from the server's usage),
ITL (gaps between text deltas), TTFP (first audio), RTF (E2EL / seconds of audio received), and the request
throughput (completed requests / wall time). ``--endpoint`` picks the endpoint (default /v1/chat/completions);
``--dataset`` what is sent (``bench/serve_datasets.py``: random, a file, or spoken questions).

Arrivals are closed-loop by default (every request is ready at once; the concurrency bounds them). With
``--request-rate R[,R...]`` (requests per second) they are open-loop: request i is sent at the i-th arrival of a
gamma process with shape ``--burstiness`` (1: Poisson; lower: burstier) and mean gap 1/R, as ``vllm bench serve``
does, and every concurrency level runs at every rate. ``--goodput ttft:500 ttfp:800 rtf:1`` adds the rate of
completed requests that met every bound (ms for ttft/tpot/ttfp/e2el, a ratio for rtf).

``--percentile-metrics`` and ``--metric-percentiles`` choose the rows of the percentile table (mean, median, std
and each percentile); ``--save-result`` writes each run as ``vllm bench serve`` does (``bench/serve_result.py``).

To compare async chunk on and off, run two servers on two ports, the second with ``--no-async-chunk``, and run
this benchmark against each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from omnipipe.bench.report import format_table, machine_info, mean, percentile_key, summarize, write_json
from omnipipe.bench.serve_datasets import SPOKEN, BenchPrompt, load_dataset, load_prompts
from omnipipe.bench.serve_endpoints import (
    ENDPOINTS,
    Endpoint,
    RequestOptions,
    RequestResult,
    default_metrics,
    measured,
    send,
)
from omnipipe.bench.serve_result import now_stamp, result_path, vllm_result, write_result
from omnipipe.protocol.worker import CHAT_PATH, SPEECH_PATH, TRANSCRIPTION_PATH

METRICS = ("ttft", "tpot", "itl", "e2el", "ttfp", "rtf")
LABELS = {"ttft": "TTFT (ms)", "tpot": "TPOT (ms)", "itl": "ITL (ms)", "e2el": "E2EL (ms)", "ttfp": "TTFP (ms)",
          "rtf": "RTF"}
GOODPUT_METRICS = ("ttft", "tpot", "ttfp", "e2el", "rtf")


def _words(values: str) -> list[str]:
    return [v.strip() for v in values.split(",") if v.strip()]


def parse_percentile_metrics(value: str | None, endpoint: Endpoint, audio: bool) -> list[str]:
    """``--percentile-metrics``: names among ``METRICS`` that ``endpoint`` measures; ValueError naming the flag."""
    if value is None:
        return list(default_metrics(endpoint, audio))
    names = _words(value)
    if not names:
        raise ValueError("--percentile-metrics: a comma-separated list, e.g. ttft,tpot,itl")
    for name in names:
        if name not in METRICS:
            raise ValueError(f"--percentile-metrics: {name!r} is not one of {', '.join(METRICS)}")
        if name not in measured(endpoint, audio):
            raise ValueError(f"--percentile-metrics: {name!r} is not measured on {endpoint.path}"
                             f"{' with --text-only' if not audio else ''} (it measures "
                             f"{', '.join(measured(endpoint, audio))})")
    return list(dict.fromkeys(names))


def parse_metric_percentiles(value: str) -> list[float]:
    """``--metric-percentiles``: ``"50,90,99"`` -> ``[50.0, 90.0, 99.0]``; ValueError naming the flag."""
    try:
        out = [float(v) for v in _words(value)]
    except ValueError:
        raise ValueError(f"--metric-percentiles: comma-separated numbers, e.g. 50,90,99, got {value!r}") from None
    if not out or not all(0 <= p <= 100 for p in out):
        raise ValueError(f"--metric-percentiles: every percentile is within [0, 100], got {value!r}")
    return list(dict.fromkeys(out))


def meets(result: RequestResult, goodput: dict[str, float]) -> bool:
    """Whether a completed request met every bound (ms, or a ratio for rtf); a missing figure does not."""
    for name, bound in goodput.items():
        value = getattr(result, "rtf" if name == "rtf" else f"{name}_s")
        if value is None or (value if name == "rtf" else value * 1000.0) > bound:
            return False
    return True


def parse_goodput(items: Sequence[str], measures: Sequence[str] = METRICS) -> dict[str, float]:
    """``["ttft:500", "rtf:1"]`` -> ``{"ttft": 500.0, "rtf": 1.0}`` (``e2e`` is ``e2el``); ValueError naming what is
    wrong, also a metric the endpoint does not measure."""
    out: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition(":")
        name = "e2el" if name == "e2e" else name
        if name not in GOODPUT_METRICS:
            raise ValueError(f"--goodput: {item!r}: the metric is one of {', '.join(GOODPUT_METRICS)}")
        if name not in measures:
            raise ValueError(f"--goodput: {item!r}: this endpoint does not measure {name}")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"--goodput: {item!r}: expected NAME:NUMBER, e.g. ttft:500") from None
        if not out[name] > 0:
            raise ValueError(f"--goodput: {item!r}: the bound must be > 0")
    return out


def arrival_times(count: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """When each request is sent, from the start (s): all at 0 for an infinite rate, else a gamma process."""
    if rate == float("inf"):
        return [0.0] * count
    rng = random.Random(seed)
    now, out = 0.0, []
    for _ in range(count):
        out.append(now)
        now += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return out


def summarize_run(concurrency: int, results: list[RequestResult], wall_s: float, rate: float = float("inf"),
                  goodput: dict[str, float] | None = None, percentiles: Sequence[float] = (99,)) -> dict[str, Any]:
    """One run's row: counts, throughputs, and per metric its stats (ms except RTF; None where none was measured)."""
    done = [r for r in results if r.ok]
    values: dict[str, list[float]] = {name: [] for name in METRICS}
    for r in done:
        values["itl"].extend(r.itl_s)
        for name in ("ttft", "tpot", "e2el", "ttfp"):
            value = getattr(r, f"{name}_s")
            if value is not None:
                values[name].append(value)
        if r.rtf is not None:
            values["rtf"].append(r.rtf)
    wers = [r.wer for r in done if r.wer is not None]
    row: dict[str, Any] = {
        "max_concurrency": concurrency, "request_rate": None if rate == float("inf") else rate,
        "prompts": len(results), "completed": len(done),
        "failed": len(results) - len(done), "duration_s": wall_s,
        "throughput_rps": len(done) / wall_s if wall_s > 0 else 0.0,
        "output_tokens_total": sum(r.output_tokens for r in done),
        "output_tokens_per_s": sum(r.output_tokens for r in done) / wall_s if wall_s > 0 else 0.0,
        "audio_s_mean": mean([r.audio_s for r in done]) if done else 0.0,
        "wer_mean": mean(wers) if wers else None,
        "errors": sorted({r.error for r in results if r.error})[:5],
        "goodput_rps": (sum(meets(r, goodput) for r in done) / wall_s if wall_s > 0 else 0.0) if goodput else None,
    }
    for name, series in values.items():
        row[name] = summarize(series, 1.0 if name == "rtf" else 1000.0, percentiles) if series else None
    return row


async def run_level(endpoint: Endpoint, options: RequestOptions, prompts: list[BenchPrompt], concurrency: int,
                    rate: float = float("inf"), burstiness: float = 1.0, seed: int = 0,
                    progress: bool = False) -> tuple[list[RequestResult], float]:
    """Every prompt through ``endpoint`` with at most ``concurrency`` in flight; the results and the wall time."""
    limits = httpx.Limits(max_connections=concurrency + 1, max_keepalive_connections=concurrency + 1)
    bar = tqdm(total=len(prompts), disable=not progress, file=sys.stderr,
               desc=f"max concurrency {concurrency}, rate {rate:g}")
    async with httpx.AsyncClient(base_url=options.base_url, headers=options.headers, timeout=options.timeout_s,
                                 limits=limits) as client:
        gate = asyncio.Semaphore(concurrency)
        arrivals = arrival_times(len(prompts), rate, burstiness, seed)
        start = time.perf_counter()

        async def limited(prompt: BenchPrompt, arrival_s: float) -> RequestResult:
            await asyncio.sleep(max(0.0, start + arrival_s - time.perf_counter()))
            arrived = time.perf_counter()
            async with gate:
                queued = time.perf_counter() - arrived
                result = await send(endpoint, client, prompt, options)
            result.queue_s = queued
            bar.update(1)
            return result

        try:
            results = await asyncio.gather(*(limited(p, a) for p, a in zip(prompts, arrivals, strict=True)))
        finally:
            bar.close()
        wall = time.perf_counter() - start
    return list(results), wall


def _rate(row: dict[str, Any]) -> float | str:
    return "inf" if row["request_rate"] is None else row["request_rate"]


def main_headers(metrics: Sequence[str], wer: bool) -> list[str]:
    """The summary table's columns: the means of what the endpoint measures (E2EL first)."""
    means = [f"Mean {LABELS[m]}" for m in ("e2el", *(m for m in METRICS if m in metrics and m != "e2el"))]
    return ["Max_Concurrency", "Rate (req/s)", "Completed", "Failed", *means, *(["Mean WER"] if wer else []),
            "req/s", "Output tok/s", "Goodput (req/s)"]


def percentile_headers(percentiles: Sequence[float]) -> list[str]:
    return ["Max_Concurrency", "Rate (req/s)", "Metric", "Mean", "Median", "Std",
            *(percentile_key(p).upper() for p in percentiles)]


def format_report(rows: list[dict[str, Any]], metrics: Sequence[str], selected: Sequence[str],
                  percentiles: Sequence[float], wer: bool = False) -> str:
    """The summary table (means), the percentile table (a row per run and selected metric), the failures."""
    shown = ("e2el", *(m for m in METRICS if m in metrics and m != "e2el"))
    main = format_table(main_headers(metrics, wer), [
        [r["max_concurrency"], _rate(r), r["completed"], r["failed"],
         *(r[m]["mean"] if r.get(m) else None for m in shown), *([r["wer_mean"]] if wer else []),
         r["throughput_rps"], r["output_tokens_per_s"], r["goodput_rps"]] for r in rows])
    stats = ("mean", "median", "std", *(percentile_key(p) for p in percentiles))
    detail = format_table(percentile_headers(percentiles), [
        [r["max_concurrency"], _rate(r), LABELS[m], *((r[m] or {}).get(s) for s in stats)]
        for r in rows for m in selected])
    lines = [main, "", detail]
    for r in rows:
        if r["failed"]:
            lines.append(f"max concurrency {r['max_concurrency']}, rate {_rate(r)}: {r['failed']} of {r['prompts']} "
                         f"requests failed: {'; '.join(r['errors'])}")
    return "\n".join(lines)


def _served_model(base_url: str, headers: dict[str, str], timeout_s: float) -> str:
    response = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=timeout_s)
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise ValueError(f"{base_url}/v1/models lists no models")
    return str(models[0]["id"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnipipe bench serve", description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[2:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8091", help="the server (default: %(default)s)")
    parser.add_argument("--endpoint", default=CHAT_PATH, choices=list(ENDPOINTS),
                        help="what to load (default: %(default)s)")
    parser.add_argument("--model", default=None, help="model name to send (default: the first of /v1/models)")
    parser.add_argument("--api-key", default=os.environ.get("OMNIPIPE_API_KEY"),
                        help="sent as 'Authorization: Bearer KEY' (default: $OMNIPIPE_API_KEY)")
    parser.add_argument("--num-prompts", type=int, default=50, help="requests per concurrency level and rate")
    parser.add_argument("--max-concurrency", default="1,4,10", help="comma-separated levels (default: %(default)s)")
    parser.add_argument("--dataset", default=None,
                        help="'random' (built-in questions, seeded order), 'spoken' (the same, as speech the server "
                        "reads aloud once, cached) or a file: one prompt per line, or JSON lines with a 'prompt' "
                        "field (default: spoken for /v1/audio/transcriptions and /v1/realtime, else random)")
    parser.add_argument("--spoken-cache-dir", type=Path, default=None,
                        help="where the spoken questions are kept (default: $OMNIPIPE_CACHE/bench-spoken)")
    parser.add_argument("--seed", type=int, default=0, help="order of the random and spoken datasets, arrivals")
    parser.add_argument("--max-tokens", type=int, default=40, help="answer length limit (chat max_tokens, realtime "
                        "max_response_output_tokens; default: %(default)s)")
    parser.add_argument("--text-only", action="store_true",
                        help="ask for text answers only (chat, realtime: no TTFP/RTF)")
    parser.add_argument("--warmup", type=int, default=1, help="requests sent (and not measured) first")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--request-rate", default="inf",
                        help="comma-separated arrival rates in requests/s ('inf': all at once; default: %(default)s)")
    parser.add_argument("--burstiness", type=float, default=1.0,
                        help="gamma shape of the gaps between arrivals (1: Poisson; default: %(default)s)")
    parser.add_argument("--goodput", nargs="+", default=[], metavar="NAME:BOUND",
                        help="service-level bounds for goodput, e.g. ttft:500 ttfp:800 rtf:1 (ms; rtf a ratio)")
    parser.add_argument("--percentile-metrics", default=None,
                        help="comma-separated metrics of the percentile table among ttft,tpot,itl,e2el,ttfp,rtf "
                        "(default: ttft,tpot,itl, plus ttfp with spoken answers; speech: ttfp,rtf,e2el; "
                        "transcriptions: ttft,itl,e2el)")
    parser.add_argument("--metric-percentiles", default="99",
                        help="comma-separated percentiles of those metrics, e.g. 50,90,99 (default: %(default)s)")
    parser.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    parser.add_argument("--json", help="also write the figures here (omnipipe's form: every run as a row)")
    parser.add_argument("--save-result", action="store_true",
                        help="write each run as vllm bench serve does (one JSON file per concurrency and rate)")
    parser.add_argument("--save-detailed", action="store_true",
                        help="with --save-result: also the per-request lists (ttfts, itls, generated_texts, ...)")
    parser.add_argument("--result-dir", default=None, help="directory of the result files (default: the current one)")
    parser.add_argument("--result-filename", default=None,
                        help="the result file's name (one run only; default: "
                        "{label}-{rate}qps-concurrency{N}-{model}-{date}.json)")
    parser.add_argument("--label", default=None, help="the result's label and file name prefix (default: the "
                        "backend name vLLM gives the endpoint, e.g. openai-chat)")
    parser.add_argument("--metadata", nargs="*", default=[], metavar="KEY=VALUE",
                        help="added to each result file, as vllm bench serve's --metadata")
    return parser


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace, endpoint: Endpoint) -> dict[str, Any]:
    """Everything the arguments say, checked; a usage error (exit 2) naming the flag otherwise."""
    try:
        levels = [int(c) for c in args.max_concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error("--max-concurrency: comma-separated integers, e.g. 1,4,10")
    if not levels or min(levels) < 1:
        parser.error("--max-concurrency: every level must be >= 1")
    if args.num_prompts < 1 or args.max_tokens < 1 or args.warmup < 0 or args.timeout <= 0:
        parser.error("--num-prompts and --max-tokens must be >= 1, --warmup >= 0, --timeout > 0")
    try:
        rates = [float(r) for r in args.request_rate.split(",") if r.strip()]
    except ValueError:
        parser.error("--request-rate: comma-separated numbers or 'inf', e.g. 0.5,1,inf")
    if not rates or not all(r > 0 for r in rates):
        parser.error("--request-rate: every rate must be > 0 (or 'inf')")
    if not (args.burstiness > 0 and args.burstiness < float("inf")):
        parser.error("--burstiness: must be a number > 0")
    dataset = args.dataset or (SPOKEN if endpoint.spoken else "random")
    if endpoint.spoken and dataset != SPOKEN:
        parser.error(f"--dataset: {endpoint.path} takes spoken questions: use --dataset spoken")
    if endpoint.path in (SPEECH_PATH, TRANSCRIPTION_PATH) and args.text_only:
        parser.error(f"--text-only: {endpoint.path} has no choice of answer modalities")
    if endpoint.path == SPEECH_PATH and dataset == SPOKEN:
        parser.error(f"--dataset: {SPEECH_PATH} reads text aloud: use random or a file, not spoken")
    if args.result_filename and len(levels) * len(rates) > 1:
        parser.error("--result-filename: names one result file, and this run has "
                     f"{len(levels) * len(rates)} (concurrency, rate) pairs; leave it out for one file each")
    metadata: dict[str, str] = {}
    for item in args.metadata:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"--metadata: {item!r}: expected KEY=VALUE")
        metadata[key.strip()] = value.strip()
    audio = not args.text_only and endpoint.path != TRANSCRIPTION_PATH
    try:
        selected = parse_percentile_metrics(args.percentile_metrics, endpoint, audio)
        percentiles = parse_metric_percentiles(args.metric_percentiles)
        goodput = parse_goodput(args.goodput, measured(endpoint, audio))
        load_prompts(dataset, args.num_prompts, args.seed)  # a file dataset: read and checked before any request
    except ValueError as exc:
        parser.error(str(exc))
    return {"levels": levels, "rates": rates, "dataset": dataset, "audio": audio, "selected": selected,
            "percentiles": percentiles, "goodput": goodput, "metadata": metadata}


def _modalities(endpoint: Endpoint, audio: bool) -> list[str]:
    if endpoint.path == SPEECH_PATH:
        return ["audio"]
    return ["text", "audio"] if audio else ["text"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    endpoint = ENDPOINTS[args.endpoint]
    checked = _check(parser, args, endpoint)
    audio, selected, percentiles, goodput = (checked["audio"], checked["selected"], checked["percentiles"],
                                             checked["goodput"])
    base_url = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        model = args.model or _served_model(base_url, headers, 30.0)
    except (httpx.HTTPError, ValueError) as exc:
        print(f"omnipipe bench serve: cannot reach {base_url}: {exc}", file=sys.stderr)
        return 1
    try:
        with httpx.Client(base_url=base_url, headers=headers, timeout=args.timeout) as client:
            prompts = load_dataset(checked["dataset"], args.num_prompts, args.seed, client, model,
                                   args.spoken_cache_dir)
    except ValueError as exc:
        parser.error(str(exc))
    except RuntimeError as exc:
        print(f"omnipipe bench serve: {exc}", file=sys.stderr)
        return 1
    options = RequestOptions(model, args.max_tokens, audio, headers, base_url, args.timeout)
    if args.warmup:
        asyncio.run(run_level(endpoint, options, prompts[:1] * args.warmup, 1))
    runs = [(level, rate, *asyncio.run(run_level(endpoint, options, prompts, level, rate, args.burstiness,
                                                  args.seed, not args.disable_tqdm)))
            for level in checked["levels"] for rate in checked["rates"]]
    rows = [summarize_run(level, results, wall, rate, goodput, percentiles) for level, rate, results, wall in runs]
    wer = endpoint.path == TRANSCRIPTION_PATH
    print(f"omnipipe bench serve: {base_url}{endpoint.path}, model {model!r}, {args.num_prompts} prompts per run, "
          f"dataset {checked['dataset']}, {' + '.join(_modalities(endpoint, audio))}, max_tokens {args.max_tokens}")
    print(format_report(rows, measured(endpoint, audio), selected, percentiles, wer))
    meta = {"base_url": base_url, "endpoint": endpoint.path, "model": model, "dataset": checked["dataset"],
            "burstiness": args.burstiness, "goodput": goodput, "num_prompts": args.num_prompts,
            "max_tokens": args.max_tokens, "modalities": _modalities(endpoint, audio),
            "percentile_metrics": selected, "metric_percentiles": percentiles, "machine": machine_info()}
    if args.json:
        write_json(args.json, {"meta": meta, "rows": rows})
    if args.save_result:
        label = args.label or endpoint.backend
        result_meta = {**meta, "backend": endpoint.backend, "label": args.label, "metadata": checked["metadata"]}
        for (level, _, results, _), row in zip(runs, rows, strict=True):
            date = now_stamp()
            path = result_path(args.result_dir, args.result_filename, label, row["request_rate"], level, model, date)
            write_result(path, vllm_result(row, results, result_meta, selected, percentiles, args.save_detailed,
                                           date))
            print(f"result: {path}")
    return 0 if all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
