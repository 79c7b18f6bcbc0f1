"""``omnipipe bench gateway``: what the gateway costs, measured side by side in one run.

    omnipipe bench gateway --pipeline default --num-prompts 20 --max-concurrency 1,4

Starts, on free loopback ports, one ``omnipipe worker`` (capacity = the highest concurrency) and two gateways in
front of that same worker, one recording sessions (into a temporary directory) and one with ``--no-record``, and
stops them all at the end. For each max concurrency the same prompts go, as streaming chat completions, to three
targets: ``direct`` (the worker), ``gateway`` and ``gateway --no-record``. The prompts are split into rounds of
``concurrency`` requests sent at once, and every round runs on each target in turn (the order rotates from round to
round), so that drift on a noisy machine hits all three alike. Every round starts with the worker idle and, for a
gateway, after the gateway has seen the worker idle again (the gateways poll the worker's /health every 2 s and
would otherwise hold a request back after a round another target ran): the figures are the cost of the extra hop,
the queue and the recording, not of sharing one worker between three clients. req/s is completed requests over
the summed wall time of the target's rounds.

The realtime path: the time from opening the WebSocket to the worker's ``session.created``, directly and through
each gateway (which first sends ``queued`` and ``queue_done``), interleaved the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from omnipipe.bench.report import format_table, machine_info, summarize, write_json
from omnipipe.bench.serve import summarize_run
from omnipipe.bench.serve_datasets import BenchPrompt, load_prompts
from omnipipe.bench.serve_endpoints import ENDPOINTS, RequestOptions, RequestResult, send
from omnipipe.protocol.worker import CHAT_PATH
from omnipipe.util.net import free_port
from omnipipe.util.process import start_in_group, stop_groups

DIRECT, GATEWAY, NO_RECORD = "direct", "gateway", "gateway --no-record"
TARGETS = (DIRECT, GATEWAY, NO_RECORD)
CHAT_PIPELINES = ("default", "toy")
MAIN_HEADERS = ["Max_Concurrency", "Target", "Completed", "Mean TTFT (ms)", "Median TTFT (ms)", "Mean TTFP (ms)",
                "Median TTFP (ms)", "Mean E2E (ms)", "Median E2E (ms)", "req/s"]
OVERHEAD_HEADERS = ["Max_Concurrency", "Target", "TTFT +ms (median)", "TTFT ratio", "TTFP +ms (median)",
                    "TTFP ratio", "E2E +ms (median)", "E2E ratio"]
REALTIME_HEADERS = ["Target", "Samples", "Median to first event (ms)", "Median to session.created (ms)",
                    "Mean to session.created (ms)", "+ms vs direct (median)", "ratio vs direct"]
STOP_TIMEOUT_S = 30.0
SETTLE_TIMEOUT_S = 120.0
LOG_TAIL_CHARS = 4000


class BenchError(Exception):
    """The run cannot go on (a process died or never got ready); the message says why."""


class Child:
    """``python -m omnipipe.cli.main ARGS`` in its own process group, its output in ``workdir/NAME.log``."""

    def __init__(self, name: str, args: list[str], workdir: Path, port: int) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / f"{name.replace(' ', '')}.log"
        self._log = self.log_path.open("wb")
        self.process = start_in_group([sys.executable, "-m", "omnipipe.cli.main", *args], stdout=self._log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def log_tail(self) -> str:
        self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError as exc:
            return f"(no log: {exc})"

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise BenchError(f"{self.name} exited with code {self.process.returncode}; the end of its log "
                             f"({self.log_path.name}):\n{self.log_tail()}")

    def close_log(self) -> None:
        self._log.close()


def stop_children(children: Sequence[Child]) -> list[str]:
    """SIGINT each (in the given order) and wait; after ``STOP_TIMEOUT_S`` SIGKILL its process group. What it
    started (its stage processes, which share its process group) get 10 s more to end before the group is killed,
    also when the child itself died earlier. Returns what had to be killed."""
    killed: list[str] = []
    for child in children:
        [stopped] = stop_groups([child.process], signum=signal.SIGINT, timeout_s=STOP_TIMEOUT_S, leftovers_s=10.0)
        if stopped.killed:
            killed.append(child.name)
        if stopped.killed_leftovers:
            killed.append(f"what {child.name} left running")
        child.close_log()
    return killed


def wait_until(check: Callable[[], Any], timeout_s: float, what: str, children: Sequence[Child]) -> Any:
    """Poll ``check()`` until it returns something truthy; fail early if a child died."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        for child in children:
            child.check_alive()
        with contextlib.suppress(httpx.HTTPError, ValueError):
            last = check()
            if last:
                return last
        time.sleep(0.2)
    raise BenchError(f"{what} not ready after {timeout_s:.0f} s (last answer: {last!r})")


# ---------------------------------------------------------------------------------------------- the run
@dataclass
class Target:
    name: str
    url: str
    ws_url: str
    client: httpx.AsyncClient
    admin: dict[str, str] | None = None  # for a gateway: its admin headers (to see its view of the worker)


class Rig:
    """The worker, the two gateways and one HTTP client per target."""

    def __init__(self, worker: Child, gateways: dict[str, Child], admin_token: str, children: list[Child]) -> None:
        self.worker = worker
        self.gateways = gateways
        self.admin = {"Authorization": f"Bearer {admin_token}"}
        self.children = children
        self.probe = httpx.AsyncClient(timeout=10)
        self.worker_address = f"127.0.0.1:{worker.port}"

    def check_alive(self) -> None:
        for child in self.children:
            child.check_alive()

    async def worker_idle(self) -> float:
        """Wait until the worker reports IDLE with no session; returns when that was seen (perf_counter)."""
        deadline = time.perf_counter() + SETTLE_TIMEOUT_S
        last: Any = None
        while time.perf_counter() < deadline:
            self.check_alive()
            with contextlib.suppress(httpx.HTTPError, ValueError):
                last = (await self.probe.get(f"{self.worker.url}/health")).json()
                if last.get("state") == "IDLE" and not last.get("active_sessions"):
                    return time.perf_counter()
            await asyncio.sleep(0.02)
        raise BenchError(f"the worker did not get idle within {SETTLE_TIMEOUT_S:.0f} s (last: {last!r})")

    async def settle(self, target: Target) -> None:
        """The worker idle and, for a gateway, the gateway's latest health reply of it IDLE and taken after."""
        idle_at = await self.worker_idle()
        if target.admin is None:
            return
        deadline = time.perf_counter() + SETTLE_TIMEOUT_S
        last: Any = None
        while time.perf_counter() < deadline:
            self.check_alive()
            since_idle = time.perf_counter() - idle_at
            with contextlib.suppress(httpx.HTTPError, ValueError, TypeError):
                reply = await self.probe.get(f"{target.url}/api/admin/workers", headers=target.admin)
                last = next(w for w in reply.json() if w["address"] == self.worker_address)
                # last_ok_s_ago is rounded to 0.1 s: the reply must surely have come after the worker went idle
                if last["state"] == "IDLE" and last["last_ok_s_ago"] is not None and \
                        last["last_ok_s_ago"] + 0.1 < since_idle:
                    return
            await asyncio.sleep(0.05)
        raise BenchError(f"{target.name} did not see the worker idle within {SETTLE_TIMEOUT_S:.0f} s "
                         f"(last: {last!r})")

    async def aclose(self) -> None:
        await self.probe.aclose()


async def run_round(rig: Rig, target: Target, model: str, prompts: list[str], max_tokens: int,
                    audio: bool) -> tuple[list[RequestResult], float]:
    await rig.settle(target)
    start = time.perf_counter()
    options = RequestOptions(model, max_tokens, audio, {}, target.url, target.client.timeout.read)  # its --timeout
    results = await asyncio.gather(*(send(ENDPOINTS[CHAT_PATH], target.client, BenchPrompt(p), options)
                                     for p in prompts))
    return list(results), time.perf_counter() - start


def rotation(index: int) -> tuple[str, ...]:
    shift = index % len(TARGETS)
    return TARGETS[shift:] + TARGETS[:shift]


async def run_level(rig: Rig, targets: dict[str, Target], model: str, prompts: list[str], level: int,
                    max_tokens: int, audio: bool) -> list[dict[str, Any]]:
    results: dict[str, list[RequestResult]] = {name: [] for name in TARGETS}
    walls = dict.fromkeys(TARGETS, 0.0)
    for index, start in enumerate(range(0, len(prompts), level)):
        chunk = prompts[start:start + level]
        for name in rotation(index):
            done, wall = await run_round(rig, targets[name], model, chunk, max_tokens, audio)
            results[name] += done
            walls[name] += wall
    return [{"target": name, **summarize_run(level, results[name], walls[name])} for name in TARGETS]


async def realtime_sample(rig: Rig, target: Target, timeout_s: float) -> dict[str, float]:
    """Seconds from opening the WebSocket to the handshake, the first event and ``session.created``."""
    await rig.settle(target)
    start = time.perf_counter()
    first: float | None = None
    async with connect(target.ws_url, open_timeout=timeout_s, max_size=None) as ws:
        opened = time.perf_counter()
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), timeout_s))
            now = time.perf_counter()
            first = now if first is None else first
            if event.get("type") == "session.created":
                break
            if event.get("type") == "error":
                raise BenchError(f"{target.name}: realtime error before session.created: {event.get('error')}")
    return {"handshake": opened - start, "first_event": first - start, "session_created": now - start}


async def run_realtime(rig: Rig, targets: dict[str, Target], samples: int, timeout_s: float) -> dict[str, Any]:
    series: dict[str, dict[str, list[float]]] = {n: {"handshake": [], "first_event": [], "session_created": []}
                                                 for n in TARGETS}
    for name in TARGETS:  # warmup, not counted
        await realtime_sample(rig, targets[name], timeout_s)
    for index in range(samples):
        for name in rotation(index):
            for key, value in (await realtime_sample(rig, targets[name], timeout_s)).items():
                series[name][key].append(value)
    return {name: {key: summarize(values, 1000.0) for key, values in s.items()} for name, s in series.items()}


async def run_all(rig: Rig, model: str, prompts: list[str], levels: list[int], args: argparse.Namespace,
                  on_level: Callable[[list[dict[str, Any]]], None]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    audio = not args.text_only
    limits = httpx.Limits(max_connections=max(levels) + 1, max_keepalive_connections=max(levels) + 1)
    urls = {DIRECT: rig.worker.url, **{name: child.url for name, child in rig.gateways.items()}}
    async with contextlib.AsyncExitStack() as stack:
        targets = {}
        for name in TARGETS:
            client = await stack.enter_async_context(httpx.AsyncClient(base_url=urls[name], timeout=args.timeout,
                                                                       limits=limits))
            targets[name] = Target(name, urls[name], urls[name].replace("http://", "ws://") + "/v1/realtime",
                                   client, None if name == DIRECT else rig.admin)
        for index in range(args.warmup):  # a round at the highest concurrency on each target, not counted
            for name in rotation(index):
                await run_round(rig, targets[name], model, prompts[:max(levels)], args.max_tokens, audio)
        rows: list[dict[str, Any]] = []
        for level in levels:
            level_rows = await run_level(rig, targets, model, prompts, level, args.max_tokens, audio)
            on_level(level_rows)
            rows += level_rows
        realtime = await run_realtime(rig, targets, args.realtime_samples, args.timeout) \
            if args.realtime_samples else {}
    return rows, realtime


# ---------------------------------------------------------------------------------------------- report
def _stat(row: dict[str, Any] | None, name: str, stat: str = "median") -> float | None:
    return row[name][stat] if row and row.get(name) else None


def _compare(value: float | None, base: float | None) -> tuple[float | None, float | None]:
    if value is None or base is None:
        return None, None
    return value - base, (value / base if base > 0 else None)


def overhead(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency and gateway variant: its median TTFT, TTFP and E2E minus the direct ones, and the ratio."""
    out = []
    for level in dict.fromkeys(r["max_concurrency"] for r in rows):
        at = {r["target"]: r for r in rows if r["max_concurrency"] == level}
        for name in (GATEWAY, NO_RECORD):
            entry: dict[str, Any] = {"max_concurrency": level, "target": name}
            for metric in ("ttft", "ttfp", "e2el"):
                delta, ratio = _compare(_stat(at.get(name), metric), _stat(at.get(DIRECT), metric))
                entry[f"{metric}_median_delta_ms"] = delta
                entry[f"{metric}_median_ratio"] = ratio
            out.append(entry)
    return out


def realtime_overhead(realtime: dict[str, Any]) -> dict[str, Any]:
    base = _stat(realtime.get(DIRECT), "session_created")
    out = {}
    for name in (GATEWAY, NO_RECORD):
        delta, ratio = _compare(_stat(realtime.get(name), "session_created"), base)
        out[name] = {"session_created_median_delta_ms": delta, "session_created_median_ratio": ratio}
    return out


def format_rows(rows: list[dict[str, Any]]) -> str:
    return format_table(MAIN_HEADERS, [[r["max_concurrency"], r["target"], r["completed"], _stat(r, "ttft", "mean"),
                                        _stat(r, "ttft"), _stat(r, "ttfp", "mean"), _stat(r, "ttfp"),
                                        _stat(r, "e2el", "mean"), _stat(r, "e2el"), r["throughput_rps"]]
                                       for r in rows])


def format_report(rows: list[dict[str, Any]], over: list[dict[str, Any]], realtime: dict[str, Any]) -> str:
    lines = [format_rows(rows), "",
             format_table(OVERHEAD_HEADERS, [[o["max_concurrency"], o["target"],
                                              *[o[f"{m}_median_{k}"] for m in ("ttft", "ttfp", "e2el")
                                                for k in ("delta_ms", "ratio")]] for o in over],
                          title="Gateway overhead (gateway minus direct, and gateway / direct)")]
    if realtime:
        rt_over = realtime_overhead(realtime)
        lines += ["", format_table(REALTIME_HEADERS, [
            [name, realtime[name]["session_created"]["count"], _stat(realtime[name], "first_event"),
             _stat(realtime[name], "session_created"), _stat(realtime[name], "session_created", "mean"),
             *((rt_over[name]["session_created_median_delta_ms"], rt_over[name]["session_created_median_ratio"])
               if name in rt_over else (None, None))] for name in TARGETS],
            title="Realtime: WebSocket connect to session.created (through a gateway the first event is 'queued')")]
    for r in rows:
        if r["failed"]:
            lines.append(f"{r['target']} at max concurrency {r['max_concurrency']}: {r['failed']} of {r['prompts']} "
                         f"requests failed: {'; '.join(r['errors'])}")
    return "\n".join(lines)


def format_machine(info: dict[str, Any]) -> str:
    load = " ".join(f"{x:.2f}" for x in info["load_avg_1_5_15"]) or "-"
    return f"machine: {info['cpu_count']} cpus, load average {load}, python {info['python']}, {info['platform']}"


# ---------------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnipipe bench gateway", description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[2:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", default="default", choices=CHAT_PIPELINES,
                        help="a pipeline that answers chat completions (default: %(default)s)")
    parser.add_argument("--deploy", type=Path, help="deploy YAML for the worker")
    parser.add_argument("--num-prompts", type=int, default=20, help="requests per target and concurrency level")
    parser.add_argument("--max-concurrency", default="1,4", help="comma-separated levels (default: %(default)s)")
    parser.add_argument("--text-only", action="store_true", help="ask for text only (no TTFP)")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0, help="order of the built-in questions")
    parser.add_argument("--warmup", type=int, default=1,
                        help="rounds at the highest concurrency sent (and not measured) to each target first")
    parser.add_argument("--realtime-samples", type=int, default=10,
                        help="WebSocket connects per target (0: skip the realtime path)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--startup-timeout", type=float, default=900.0,
                        help="seconds to wait for the worker to load its models")
    parser.add_argument("--json", help="also write the figures here")
    return parser


def _checked_levels(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """The concurrency levels asked for; every argument checked (``parser.error`` exits on a bad one)."""
    try:
        levels = [int(c) for c in args.max_concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error("--max-concurrency: comma-separated integers, e.g. 1,4")
    if not levels or min(levels) < 1:
        parser.error("--max-concurrency: every level must be >= 1")
    if args.num_prompts < 1 or args.max_tokens < 1 or args.warmup < 0 or args.realtime_samples < 0:
        parser.error("--num-prompts and --max-tokens must be >= 1, --warmup and --realtime-samples >= 0")
    if args.timeout <= 0 or args.startup_timeout <= 0:
        parser.error("--timeout and --startup-timeout must be > 0")
    if args.deploy is not None and not args.deploy.is_file():
        parser.error(f"--deploy: file not found: {args.deploy}")
    return levels


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    levels = _checked_levels(parser, args)
    prompts = load_prompts("random", args.num_prompts, args.seed)
    info_start = machine_info()
    capacity = max(levels)
    workdir = Path(tempfile.mkdtemp(prefix="omnipipe-bench-gateway-"))
    admin_token = secrets.token_urlsafe(16)
    children: list[Child] = []
    try:
        worker_port = free_port()
        worker = Child("worker", ["worker", "--pipeline", args.pipeline, "--host", "127.0.0.1", "--port",
                                  str(worker_port), "--capacity", str(capacity),
                                  *(["--deploy", str(args.deploy.resolve())] if args.deploy else [])],
                       workdir, worker_port)
        children.append(worker)
        gateways: dict[str, Child] = {}
        for name, extra in ((GATEWAY, ["--data-dir", str(workdir / "recordings")]),
                            (NO_RECORD, ["--data-dir", str(workdir / "unused"), "--no-record"])):
            port = free_port()
            gateways[name] = Child(name, ["gateway", "--workers", f"127.0.0.1:{worker_port}", "--host", "127.0.0.1",
                                          "--port", str(port), f"--admin-token={admin_token}", *extra], workdir, port)
            children.insert(0, gateways[name])  # stopped before the worker
        print(f"omnipipe bench gateway: starting a {args.pipeline!r} worker (capacity {capacity}) and two gateways "
              f"(logs in {workdir})", file=sys.stderr, flush=True)
        wait_until(lambda: httpx.get(f"{worker.url}/health", timeout=5).json().get("state") == "IDLE",
                   args.startup_timeout, "the worker", children)
        for name, child in gateways.items():
            wait_until(lambda c=child: httpx.get(f"{c.url}/health", timeout=5).json().get("status") == "ok",
                       60.0, name, children)
        models = httpx.get(f"{worker.url}/v1/models", timeout=30).json().get("data") or []
        if not models:
            raise BenchError("the worker's /v1/models lists no models")
        model = str(models[0]["id"])
        audio = not args.text_only
        print(f"omnipipe bench gateway: pipeline {args.pipeline!r}, model {model!r}, one worker (capacity {capacity}) "
              f"behind two gateways; {args.num_prompts} prompts per target and level, "
              f"{'text + audio' if audio else 'text only'}, max_tokens {args.max_tokens}; rounds of <concurrency> "
              f"requests interleaved across {', '.join(TARGETS)}", flush=True)
        print(format_machine(info_start), flush=True)

        def show_level(level_rows: list[dict[str, Any]]) -> None:
            print(f"max concurrency {level_rows[0]['max_concurrency']} done", file=sys.stderr, flush=True)

        async def go() -> tuple[list[dict[str, Any]], dict[str, Any]]:
            rig = Rig(worker, gateways, admin_token, children)
            try:
                return await run_all(rig, model, prompts, levels, args, show_level)
            finally:
                await rig.aclose()

        try:
            rows, realtime = asyncio.run(go())
        except (WebSocketException, OSError, httpx.HTTPError) as exc:  # OSError includes TimeoutError
            for child in children:
                child.check_alive()
            raise BenchError(f"{type(exc).__name__}: {exc}") from exc
        sessions_dir = workdir / "recordings" / "sessions"
        recorded = sum(1 for _ in sessions_dir.iterdir()) if sessions_dir.is_dir() else 0
        unrecorded = workdir / "unused" / "sessions"
        not_recorded_ok = not unrecorded.is_dir() or not any(unrecorded.iterdir())
    except BenchError as exc:
        print(f"omnipipe bench gateway: {exc}", file=sys.stderr)
        return 1
    finally:
        killed = stop_children(children)
        if killed:
            print(f"omnipipe bench gateway: had to kill {', '.join(killed)}", file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
    over = overhead(rows)
    info_end = machine_info()
    print(format_report(rows, over, realtime))
    print(f"\nrecorded sessions (gateway): {recorded}; the --no-record gateway recorded "
          f"{'none' if not_recorded_ok else 'some (unexpected)'}")
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in info_end['load_avg_1_5_15'])}")
    if args.json:
        write_json(args.json, {
            "meta": {"pipeline": args.pipeline, "model": model, "num_prompts": args.num_prompts, "levels": levels,
                     "worker_capacity": capacity, "max_tokens": args.max_tokens, "seed": args.seed,
                     "warmup_rounds": args.warmup, "realtime_samples": args.realtime_samples,
                     "modalities": ["text", "audio"] if audio else ["text"], "targets": list(TARGETS),
                     "method": "rounds of <concurrency> requests, interleaved across targets in rotating order; "
                               "each round starts with the worker idle and the gateway's view of it fresh",
                     "machine_at_start": info_start, "machine_at_end": info_end},
            "rows": rows, "overhead": over,
            "realtime": {"targets": realtime, "overhead": realtime_overhead(realtime) if realtime else {}},
            "recorded_sessions": recorded, "no_record_gateway_recorded_nothing": not_recorded_ok})
        print(f"figures written to {args.json}")
    return 0 if all(r["failed"] == 0 for r in rows) and not_recorded_ok else 1


if __name__ == "__main__":
    sys.exit(main())
