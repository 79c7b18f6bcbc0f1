"""``omnipipe bench serve``: load on a running server through streaming chat completions (text + pcm16 audio).

    omnipipe bench serve --base-url http://127.0.0.1:8091 --num-prompts 50 --max-concurrency 1,4,10

For each max concurrency, ``--num-prompts`` requests run with at most that many in flight; each one measures, from
the client's side: E2E (request sent -> stream ended), TTFT (first text delta), TPOT (time per output token after
the first, with the token count from the stream's usage), ITL (gaps between text deltas), TTFP (first audio delta),
RTF (E2E / seconds of audio received) and the request throughput (completed requests / wall time).

Arrivals are closed-loop by default (every request is ready at once; the concurrency bounds them). With
``--request-rate R[,R...]`` (requests per second) they are open-loop: request i is sent at the i-th arrival of a
gamma process with shape ``--burstiness`` (1: Poisson; lower: burstier) and mean gap 1/R, as ``vllm bench serve``
does, and every concurrency level runs at every rate. ``--goodput ttft:500 ttfp:800 rtf:1`` adds the rate of
completed requests that met every bound (ms for ttft/tpot/ttfp/e2e, a ratio for rtf).

To compare async chunk on and off, run two servers on two ports, the second with a deploy file containing
``async_chunk: false`` (``omnipipe serve --port 8092 --deploy no_async.yaml``), and run this benchmark against each.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from omnipipe.bench.prompts import QUESTIONS
from omnipipe.bench.report import format_table, machine_info, mean, summarize, write_json
from omnipipe.protocol.audio import PCM16_RATE_HZ, PCM16_SAMPLE_BYTES

METRICS = ("e2e", "ttft", "tpot", "itl", "ttfp", "rtf")
MAIN_HEADERS = ["Max_Concurrency", "Prompts", "Rate (req/s)", "Mean E2E (ms)", "Mean TTFT (ms)", "Mean TPOT (ms)",
                "Mean TTFP (ms)", "Mean RTF", "Mean ITL (ms)", "req/s", "Goodput (req/s)"]
GOODPUT_METRICS = ("ttft", "tpot", "ttfp", "e2e", "rtf")
DETAIL_METRICS = ("e2e", "ttft", "tpot", "ttfp", "rtf", "itl")
DETAIL_HEADERS = ["Max_Concurrency", "Rate (req/s)"] + [f"{n.upper() if n != 'rtf' else 'RTF'} {s}" for n in DETAIL_METRICS
                                        for s in ("median", "p99")]


@dataclass
class RequestResult:
    ok: bool
    e2e_s: float = 0.0
    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    ttfp_s: float | None = None
    audio_s: float = 0.0
    rtf: float | None = None
    output_tokens: int = 0
    error: str | None = None


def load_prompts(dataset: str, num_prompts: int, seed: int) -> list[str]:
    """``random``: the built-in questions in a seeded random order (repeating as needed); otherwise a file with one
    prompt per line, or JSON lines with a ``prompt`` (or ``text``) field, used in order and repeated as needed."""
    if dataset == "random":
        rng = random.Random(seed)
        return [rng.choice(QUESTIONS) for _ in range(num_prompts)]
    path = Path(dataset)
    if not path.is_file():
        raise ValueError(f"--dataset: 'random' or a file, and {dataset!r} is not a file")
    prompts: list[str] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"--dataset: {path}:{number}: invalid JSON: {exc}") from None
            text = record.get("prompt", record.get("text")) if isinstance(record, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"--dataset: {path}:{number}: a JSON line needs a 'prompt' or 'text' string")
            line = text.strip()
        prompts.append(line)
    if not prompts:
        raise ValueError(f"--dataset: {path} has no prompts")
    return [prompts[i % len(prompts)] for i in range(num_prompts)]


async def one_request(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int,
                      audio: bool) -> RequestResult:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
                            "max_tokens": max_tokens, "stream_options": {"include_usage": True}}
    if audio:
        body["modalities"] = ["text", "audio"]
        body["audio"] = {"voice": "default", "format": "pcm16"}
    text_times: list[float] = []
    first_audio: float | None = None
    audio_bytes = 0
    tokens = 0
    start = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:300]
                return RequestResult(False, error=f"HTTP {response.status_code}: {detail}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    return RequestResult(False, error=f"stream error: {event['error'].get('message')}")
                if event.get("usage"):
                    tokens = int(event["usage"].get("completion_tokens") or 0)
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    now = time.perf_counter()
                    # the words: content, or (with audio, as OpenAI sends them) the audio's transcript
                    if delta.get("content") or (delta.get("audio") or {}).get("transcript"):
                        text_times.append(now)
                    chunk = (delta.get("audio") or {}).get("data")
                    if chunk:
                        first_audio = now if first_audio is None else first_audio
                        audio_bytes += len(base64.b64decode(chunk))
    except (httpx.HTTPError, json.JSONDecodeError, ValueError) as exc:
        return RequestResult(False, error=f"{type(exc).__name__}: {exc}")
    end = time.perf_counter()
    result = RequestResult(True, e2e_s=end - start, output_tokens=tokens or len(text_times))
    if text_times:
        result.ttft_s = text_times[0] - start
        result.itl_s = [b - a for a, b in itertools.pairwise(text_times)]
        if result.output_tokens > 1:
            result.tpot_s = (text_times[-1] - text_times[0]) / (result.output_tokens - 1)
    if first_audio is not None:
        result.ttfp_s = first_audio - start
    result.audio_s = audio_bytes / PCM16_SAMPLE_BYTES / PCM16_RATE_HZ
    if result.audio_s > 0:
        result.rtf = result.e2e_s / result.audio_s
    return result


def meets(result: RequestResult, goodput: dict[str, float]) -> bool:
    """Whether a completed request met every bound (ms, or a ratio for rtf); a missing figure does not."""
    for name, bound in goodput.items():
        value = getattr(result, "rtf" if name == "rtf" else f"{name}_s")
        if value is None or (value if name == "rtf" else value * 1000.0) > bound:
            return False
    return True


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """``["ttft:500", "rtf:1"]`` -> ``{"ttft": 500.0, "rtf": 1.0}``; ValueError naming what is wrong."""
    out: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition(":")
        if name not in GOODPUT_METRICS:
            raise ValueError(f"--goodput: {item!r}: the metric is one of {', '.join(GOODPUT_METRICS)}")
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
                  goodput: dict[str, float] | None = None) -> dict[str, Any]:
    done = [r for r in results if r.ok]
    values: dict[str, list[float]] = {name: [] for name in METRICS}
    for r in done:
        values["itl"].extend(r.itl_s)
        for name, value in (("e2e", r.e2e_s), ("ttft", r.ttft_s), ("tpot", r.tpot_s), ("ttfp", r.ttfp_s),
                            ("rtf", r.rtf)):
            if value is not None:
                values[name].append(value)
    row: dict[str, Any] = {
        "max_concurrency": concurrency, "request_rate": None if rate == float("inf") else rate,
        "prompts": len(results), "completed": len(done),
        "failed": len(results) - len(done), "duration_s": wall_s,
        "throughput_rps": len(done) / wall_s if wall_s > 0 else 0.0,
        "output_tokens_total": sum(r.output_tokens for r in done),
        "audio_s_mean": mean([r.audio_s for r in done]) if done else 0.0,
        "errors": sorted({r.error for r in results if r.error})[:5],
        "goodput_rps": (sum(meets(r, goodput) for r in done) / wall_s if wall_s > 0 else 0.0) if goodput else None,
    }
    for name, series in values.items():
        row[name] = summarize(series, 1.0 if name == "rtf" else 1000.0) if series else None  # ms except RTF
    return row


async def run_level(base_url: str, headers: dict[str, str], model: str, prompts: list[str], concurrency: int,
                    max_tokens: int, audio: bool, timeout_s: float, rate: float = float("inf"),
                    burstiness: float = 1.0, seed: int = 0, goodput: dict[str, float] | None = None) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=concurrency + 1, max_keepalive_connections=concurrency + 1)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s, limits=limits) as client:
        gate = asyncio.Semaphore(concurrency)
        arrivals = arrival_times(len(prompts), rate, burstiness, seed)
        start = time.perf_counter()

        async def limited(prompt: str, arrival_s: float) -> RequestResult:
            await asyncio.sleep(max(0.0, start + arrival_s - time.perf_counter()))
            async with gate:
                return await one_request(client, model, prompt, max_tokens, audio)

        results = await asyncio.gather(*(limited(p, a) for p, a in zip(prompts, arrivals)))
        wall = time.perf_counter() - start
    return summarize_run(concurrency, list(results), wall, rate, goodput)


def format_report(rows: list[dict[str, Any]]) -> str:
    def m(row: dict[str, Any], name: str, stat: str = "mean") -> float | None:
        return row[name][stat] if row.get(name) else None

    main = format_table(MAIN_HEADERS, [[r["max_concurrency"], r["completed"],
                                        "inf" if r["request_rate"] is None else r["request_rate"], m(r, "e2e"),
                                        m(r, "ttft"), m(r, "tpot"), m(r, "ttfp"), m(r, "rtf"), m(r, "itl"),
                                        r["throughput_rps"], r["goodput_rps"]]
                                       for r in rows])
    detail = format_table(DETAIL_HEADERS, [[r["max_concurrency"], "inf" if r["request_rate"] is None else
                                            r["request_rate"], *[m(r, n, s) for n in DETAIL_METRICS
                                                                    for s in ("median", "p99")]] for r in rows])
    lines = [main, "", detail]
    for r in rows:
        if r["failed"]:
            lines.append(f"max concurrency {r['max_concurrency']}: {r['failed']} of {r['prompts']} requests failed: "
                         f"{'; '.join(r['errors'])}")
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
    parser.add_argument("--model", default=None, help="model name to send (default: the first of /v1/models)")
    parser.add_argument("--api-key", default=os.environ.get("OMNIPIPE_API_KEY"),
                        help="sent as 'Authorization: Bearer KEY' (default: $OMNIPIPE_API_KEY)")
    parser.add_argument("--num-prompts", type=int, default=50, help="requests per concurrency level")
    parser.add_argument("--max-concurrency", default="1,4,10", help="comma-separated levels (default: %(default)s)")
    parser.add_argument("--dataset", default="random", help="'random' (built-in questions, seeded order) or a file: "
                        "one prompt per line, or JSON lines with a 'prompt' field")
    parser.add_argument("--seed", type=int, default=0, help="order of the random dataset")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--text-only", action="store_true", help="ask for text only (no TTFP/RTF)")
    parser.add_argument("--warmup", type=int, default=1, help="requests sent (and not measured) first")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--request-rate", default="inf",
                        help="comma-separated arrival rates in requests/s ('inf': all at once; default: %(default)s)")
    parser.add_argument("--burstiness", type=float, default=1.0,
                        help="gamma shape of the gaps between arrivals (1: Poisson; default: %(default)s)")
    parser.add_argument("--goodput", nargs="+", default=[], metavar="NAME:BOUND",
                        help="service-level bounds for goodput, e.g. ttft:500 ttfp:800 rtf:1 (ms; rtf a ratio)")
    parser.add_argument("--json", help="also write the figures here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
    try:
        goodput = parse_goodput(args.goodput)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        prompts = load_prompts(args.dataset, args.num_prompts, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    base_url = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        model = args.model or _served_model(base_url, headers, 30.0)
    except (httpx.HTTPError, ValueError) as exc:
        print(f"omnipipe bench serve: cannot reach {base_url}: {exc}", file=sys.stderr)
        return 1
    audio = not args.text_only
    if args.warmup:
        asyncio.run(run_level(base_url, headers, model, prompts[:1] * args.warmup, 1, args.max_tokens, audio,
                              args.timeout))
    rows = [asyncio.run(run_level(base_url, headers, model, prompts, level, args.max_tokens, audio, args.timeout,
                                  rate, args.burstiness, args.seed, goodput))
            for level in levels for rate in rates]
    print(f"omnipipe bench serve: {base_url}, model {model!r}, {args.num_prompts} prompts per level, "
          f"{'text + audio' if audio else 'text only'}, max_tokens {args.max_tokens}")
    print(format_report(rows))
    if args.json:
        write_json(args.json, {"meta": {"base_url": base_url, "model": model, "dataset": args.dataset,
                                        "burstiness": args.burstiness, "goodput": goodput,
                                        "num_prompts": args.num_prompts, "max_tokens": args.max_tokens,
                                        "modalities": ["text", "audio"] if audio else ["text"],
                                        "machine": machine_info()},
                               "rows": rows})
    return 0 if all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
