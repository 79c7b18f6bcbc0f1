"""``omnipipe bench soak``: a server under load while things go wrong, and what it does about them.

    omnipipe bench soak --spawn --requests 60 --concurrency 8 --abort-rate 0.2 \\
        --kill-stages thinker,talker,code2wav --stop-stage-s 5 --malformed 2

Load: ``--requests`` streaming chat completions (text + pcm16 audio, the built-in questions) with at most
``--concurrency`` in flight. The client leaves a share ``--abort-rate`` of them after their first few chunks (it
closes the connection); these count as "left by client". Every other request ends one way: completed (``[DONE]``
after a finish_reason), failed with the cause the server gave (an error status or error event; a stream that ends
without ``[DONE]`` fails as "stream cut"), or stuck (no end within ``--request-timeout``).

Faults, one at a time, spread over the run while the load is on (a share of the requests is held back per fault
and sent once it has come, so the load still runs at the last one): ``--kill-stages`` SIGKILLs each named stage's
process once; ``--stop-stage-s S`` SIGSTOPs one stage (``--stop-stage``, the thinker by default) for S seconds and
then SIGCONTs it (unless the server replaced it meanwhile). The pids come from the server (``/health``'s stages,
else ``/debug/state``). Per fault, from the signal on: detection (``/health``, polled every 50 ms, reports the
stage not ok; from a server whose ``/health`` has no per-stage states: anything but 200, or a new pid for the stage
in ``/debug/state``, which answers only once every stage does, so within about 10 s), restart (a new pid for the
stage), ok again (``/health`` healthy again after that), first answer (the first text or audio of a request sent
after the fault) and recovery (the first request sent after the fault completes: load, or the short probe requests
the bench sends after each fault until one completes). The next fault comes once this one healed (bounded by
``--recovery-timeout``).

``--malformed M``: M rounds of the malformed requests of ``bench/malformed.py``, sent one by one while the load
runs; 4xx and 5xx are counted and every 5xx is listed with its body.

Resources of the server process and all its descendants, from /proc: RSS (also of just the processes that lived
through the run), open fds, threads, child processes and the /dev/shm segments of its engines' runs; measured after
a warm-up round and again after the run, once the engines hold no request. Against a running server
(``--base-url``) they are measured when the server runs on this machine (the process listening on the URL's port,
or ``--server-pid``).

``--spawn`` starts ``omnipipe serve`` on a free loopback port with a deploy file holding short liveness bounds
(``stall_report_s``, ``stall_restart_s`` for every stage), waits for ``/health`` 200 and stops it at the end
(SIGINT, then SIGKILL): nothing it started may be left, neither processes nor /dev/shm segments nor run
directories. ``--gateway`` starts ``omnipipe up`` with two workers instead and sends everything through the gateway;
its own fault is the SIGKILL of the first worker process (``up`` starts it again), detected when the gateway's
``/health`` no longer shows that worker serving; stage faults go to the first worker.

Exit code 1, with a FAIL line saying why, if a request got stuck, a malformed request got a 5xx or no answer, a
fault was not detected or did not heal, or something leaked: processes, segments or run directories after the stop,
requests the engines still hold after the run, or RSS grown by more than ``--max-rss-growth`` percent (the RSS of
the processes that lived through the run: a restarted stage, or an engine started on first use, is no growth).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import random
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from omnipipe.bench.gateway import BenchError, Child, free_port, stop_children, wait_until
from omnipipe.bench.malformed import Case, malformed_cases
from omnipipe.bench.report import format_table, machine_info, write_json
from omnipipe.bench.serve_datasets import load_prompts
from omnipipe.gateway.proxy.http import QUEUE_EVENTS_HEADER
from omnipipe.gateway.proxy.queue_wait import QUEUE_DONE
from omnipipe.protocol.worker import DEFAULT_MAX_BODY_BYTES
from omnipipe.transport.relay.shm import SEGMENT_PREFIX

CHAT = "/v1/chat/completions"
QUEUE_EVENT = "queue"  # the SSE event name of a gateway's queue updates
HEALTH_POLL_S = 0.05
PID_POLL_S = 0.1
TREE_POLL_S = 1.0
PROBE_MAX_TOKENS = 8  # probes are short: they tell when a whole request goes through again
PROBE_PAUSE_S = (0.2, 2.0)  # between probes that did not complete: from, doubling up to
STOP_REPORT_GRACE_S = 2.0  # a stop nothing reported by this long after it ended counts as undetected
GIVEN_UP_AFTER_S = 5.0  # a stage down (not restarting) this long has been given up by the server
SPAWN_MAX_BODY_BYTES = 2_000_000
GATEWAY_WORKERS = 2
SERVING_WORKER_STATES = ("IDLE", "BUSY", "DUPLEX_ACTIVE", "DUPLEX_PAUSED")
LEAVE_AFTER_CHUNKS = (1, 6)  # a left request is left after this many data events (inclusive range)
CAUSE_CHARS = 240
RUN_DIR_GLOB = "omnipipe-*/owner.json"

COMPLETED, FAILED, LEFT, STUCK = "completed", "failed", "left by client", "stuck"
KILL, STOP, KILL_WORKER = "SIGKILL", "SIGSTOP", "SIGKILL worker"
REQUEST_HEADERS = ["Outcome", "Load", "Probes"]
FAULT_HEADERS = ["Fault", "Target", "Pid", "Under load", "Detection (ms)", "Restart (ms)", "OK again (ms)",
                 "First answer (ms)", "Recovery (ms)"]
RESOURCE_HEADERS = ["Resource", "Before", "After", "Change (%)"]
MALFORMED_HEADERS = ["Rounds", "Requests", "2xx (tolerated)", "4xx", "5xx", "503 stage down (well-formed)",
                     "No answer"]


# ---------------------------------------------------------------------------------------------- requests
@dataclass
class Outcome:
    kind: str  # COMPLETED, FAILED, LEFT or STUCK
    started: float
    ended: float
    cause: str | None = None  # for FAILED: what the server said (or "stream cut")
    answered: float | None = None  # the first text or audio delta
    events: int = 0  # data events of the answer (a gateway's queue events not counted)
    last_event: float | None = None
    dequeued: float | None = None  # through a gateway: when the request left its queue


def cause_of(message: Any) -> str:
    """A failure cause as one short line, without request ids (so that equal causes group)."""
    text = re.sub(r"\s+", " ", str(message)).strip()
    text = re.sub(r"^request [\w-]+: ", "", text)
    text = re.sub(r"chatcmpl-[0-9a-f]+", "<id>", text)
    return text[:CAUSE_CHARS] or "(empty message)"


def error_message(body: bytes) -> str:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return body.decode(errors="replace")


async def soak_request(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int,
                       leave_after: int | None, timeout_s: float) -> Outcome:
    """One streaming chat completion (text + pcm16 audio); left after ``leave_after`` data events if given."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": max_tokens, "modalities": ["text", "audio"], "audio": {"voice": "default", "format": "pcm16"}}
    out = Outcome(STUCK, time.perf_counter(), 0.0)

    async def stream() -> tuple[str, str | None]:
        async with client.stream("POST", CHAT, json=body) as response:
            if response.status_code != 200:
                return FAILED, f"HTTP {response.status_code}: {cause_of(error_message(await response.aread()))}"
            finish: str | None = None
            name = ""
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    name = line[6:].strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if name == QUEUE_EVENT:  # a gateway's queue position, asked for with QUEUE_EVENTS_HEADER
                    name = ""
                    if json.loads(data).get("type") == QUEUE_DONE:
                        out.dequeued = time.perf_counter()
                    continue
                out.events += 1
                out.last_event = time.perf_counter()
                if data == "[DONE]":
                    return (COMPLETED, None) if finish else (FAILED, "stream ended without a finish_reason")
                event = json.loads(data)
                if "error" in event:
                    error = event["error"]
                    return FAILED, cause_of(error.get("message") if isinstance(error, dict) else error)
                for choice in event.get("choices") or []:
                    finish = choice.get("finish_reason") or finish
                    delta = choice.get("delta") or {}
                    audio = delta.get("audio") or {}
                    if out.answered is None and (delta.get("content") or audio.get("transcript") or audio.get("data")):
                        out.answered = time.perf_counter()
                if leave_after is not None and out.events >= leave_after:
                    return LEFT, None  # leaving the block closes the connection mid-stream
            return FAILED, "stream cut"

    try:
        out.kind, out.cause = await asyncio.wait_for(stream(), timeout_s)
    except TimeoutError:
        out.kind, out.cause = STUCK, None
    except (httpx.RemoteProtocolError, httpx.ReadError):
        out.kind, out.cause = FAILED, "stream cut"
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: an event that is not JSON
        out.kind, out.cause = FAILED, cause_of(f"client: {type(exc).__name__}: {exc}")
    out.ended = time.perf_counter()
    return out


class Progress:
    """How far the load is, and how far it may go: the fault runner holds back a share of the requests per fault,
    so that the load still runs when the last fault comes, and releases it when the fault is done."""

    def __init__(self, total: int, allowed: int | None = None) -> None:
        self.total = total
        self.allowed = total if allowed is None else allowed
        self.dispatched = 0
        self.finished = 0
        self.done = False
        self._released = asyncio.Event()

    @property
    def in_flight(self) -> int:
        return self.dispatched - self.finished

    def release(self, upto: int) -> None:
        if upto > self.allowed:
            self.allowed = min(self.total, upto)
            self._released.set()
            self._released = asyncio.Event()

    async def turn(self, index: int) -> None:
        while index >= self.allowed:
            await self._released.wait()


async def run_load(client: httpx.AsyncClient, model: str, prompts: list[str], leave: dict[int, int],
                   concurrency: int, max_tokens: int, timeout_s: float, progress: Progress) -> list[Outcome]:
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int) -> Outcome:
        await progress.turn(index)
        async with gate:
            progress.dispatched += 1
            try:
                return await soak_request(client, model, prompts[index], max_tokens, leave.get(index), timeout_s)
            finally:
                progress.finished += 1

    try:
        return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))
    finally:
        progress.done = True


def leave_plan(requests: int, rate: float, seed: int) -> dict[int, int]:
    """Which requests the client leaves (a seeded sample of ``rate * requests``) and after how many data events."""
    rng = random.Random(seed)
    chosen = rng.sample(range(requests), round(rate * requests))
    return {index: rng.randint(*LEAVE_AFTER_CHUNKS) for index in sorted(chosen)}


def tally(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    kinds = Counter(o.kind for o in outcomes)
    causes = Counter(o.cause or "(no cause)" for o in outcomes if o.kind == FAILED)
    return {"total": len(outcomes), "completed": kinds[COMPLETED], "failed": kinds[FAILED], "left_by_client":
            kinds[LEFT], "stuck": kinds[STUCK], "causes": dict(causes.most_common())}


# ---------------------------------------------------------------------------------------------- /proc
def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): tells a process from a later one with its pid."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rpartition(")")[2].split()[19] if stat else None


def cmdline(pid: int) -> str:
    raw = _read(f"/proc/{pid}/cmdline")
    return raw.replace("\0", " ").strip() if raw else ""


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (``/proc/PID/task/*/children``, else a scan of every process's parent)."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        found: list[int] = []
        for task in tasks.iterdir():
            found += [int(p) for p in (task / "children").read_text().split()]
        return found
    except FileNotFoundError:
        if not tasks.exists():
            return []
    except OSError:
        pass
    out = []
    for entry in Path("/proc").iterdir():
        stat = _read(f"/proc/{entry.name}/stat") if entry.name.isdigit() else None
        if stat and int(stat.rpartition(")")[2].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def descendants(root: int) -> list[int]:
    out: list[int] = []
    todo = children(root)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children(pid)
    return out


def engine_runs(pids: set[int]) -> set[str]:
    """Run ids of the engines owned by any of ``pids`` (their run directories' owner records)."""
    runs = set()
    for record in Path(tempfile.gettempdir()).glob(RUN_DIR_GLOB):
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            owner = json.loads(record.read_text())
            if int(owner.get("pid")) in pids:
                runs.add(str(owner["run_id"]))
    return runs


def run_segments(runs: set[str]) -> list[str]:
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return []
    return sorted(n for n in names if any(n.startswith(f"{SEGMENT_PREFIX}{run}-") for run in runs))


def run_dirs(runs: set[str]) -> list[str]:
    out = []
    for record in Path(tempfile.gettempdir()).glob(RUN_DIR_GLOB):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if str(json.loads(record.read_text()).get("run_id")) in runs:
                out.append(str(record.parent))
    return sorted(out)


def resources(root: int, runs: set[str]) -> tuple[dict[str, float], dict[tuple[int, str | None], int]]:
    """RSS (MiB), open fds and threads summed over ``root`` and its descendants; their count; run segments. And
    each process's RSS in KiB by (pid, start time), to compare the processes that lived through a run."""
    pids = [root, *descendants(root)]
    fds = threads = 0
    rss: dict[tuple[int, str | None], int] = {}
    for pid in pids:
        status = _read(f"/proc/{pid}/status") or ""
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss[(pid, start_time(pid))] = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads += int(line.split()[1])
        with contextlib.suppress(OSError):
            fds += len(os.listdir(f"/proc/{pid}/fd"))
    return {"rss_mib": sum(rss.values()) / 1024, "open_fds": fds, "threads": threads,
            "child_processes": len(pids) - 1, "shm_segments": len(run_segments(runs))}, rss


def survivors_rss(before: dict[tuple[int, str | None], int], after: dict[tuple[int, str | None], int],
                  ) -> tuple[float, float, int]:
    """RSS (MiB) before and after of the processes present both times (the same ones: pid and start time), and how
    many they are: a restarted stage or an engine started on first use does not count as growth."""
    both = [key for key in before if key in after]
    return sum(before[k] for k in both) / 1024, sum(after[k] for k in both) / 1024, len(both)


def listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this machine, if it can be seen in /proc."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (_read(table) or "").splitlines()[1:]:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rpartition(":")[2], 16) == port:
                inodes.add(f"socket:[{parts[9]}]")
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(entry.name)
    return None


class ProcessWatch:
    """Everything under ``root`` that ever ran (pid, start time, command) and its engines' run ids, seen every
    second, so that the stop can be checked for leftovers; and, every 0.1 s, the pids of ``root``'s direct children
    whose command line names a port (``up``'s workers)."""

    def __init__(self, root: int, worker_ports: Sequence[int] = ()) -> None:
        self.root = root
        self.worker_ports = list(worker_ports)
        self.seen: dict[int, tuple[str | None, str]] = {}
        self.runs: set[str] = set()
        self.worker_pids: list[tuple[float, dict[str, int | None]]] = []

    def sample_tree(self) -> None:
        pids = [self.root, *descendants(self.root)]
        for pid in pids:
            if pid not in self.seen:
                self.seen[pid] = (start_time(pid), cmdline(pid)[:200])
        self.runs |= engine_runs(set(pids))

    def workers_now(self) -> dict[str, int | None]:
        found: dict[str, int | None] = {worker_name(p): None for p in self.worker_ports}
        for pid in children(self.root):
            words = cmdline(pid).split()
            if "worker" in words and "--port" in words:
                with contextlib.suppress(ValueError, IndexError):
                    port = int(words[words.index("--port") + 1])
                    if port in self.worker_ports:
                        found[worker_name(port)] = pid
        return found

    async def run(self) -> None:
        last_tree = 0.0
        while True:
            now = time.perf_counter()
            if self.worker_ports:
                self.worker_pids.append((now, self.workers_now()))
            if now - last_tree >= TREE_POLL_S:
                self.sample_tree()
                last_tree = now
            await asyncio.sleep(PID_POLL_S if self.worker_ports else TREE_POLL_S)

    def alive(self) -> list[str]:
        """What of everything seen still runs (the same process: the same start time)."""
        return [f"{pid} ({command})" for pid, (started, command) in sorted(self.seen.items())
                if started is not None and start_time(pid) == started]


def worker_name(port: int) -> str:
    return f"worker 127.0.0.1:{port}"


# ---------------------------------------------------------------------------------------------- health
@dataclass
class HealthSample:
    t: float
    code: int  # 0: no answer
    stages: dict[str, dict[str, Any]] | None  # /health's per-stage states, when the server reports them
    workers: dict[str, str] | None  # a gateway's /health: worker address -> state


class HealthWatch:
    """``GET /health`` every 50 ms; every answer kept (time, status, per-stage states or the gateway's workers)."""

    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self.client = client
        self.url = url
        self.samples: list[HealthSample] = []

    async def poll_once(self) -> HealthSample:
        t = time.perf_counter()
        try:
            response = await self.client.get(f"{self.url}/health", timeout=2.0)
            code = response.status_code
            body = response.json()
        except (httpx.HTTPError, ValueError):
            code, body = 0, {}
        body = body if isinstance(body, dict) else {}
        stages = body.get("stages") if isinstance(body.get("stages"), dict) else None
        workers = body.get("workers") if isinstance(body.get("workers"), dict) else None
        sample = HealthSample(t, code, stages, workers)
        self.samples.append(sample)
        return sample

    async def run(self) -> None:
        while True:
            sample = await self.poll_once()
            await asyncio.sleep(max(0.0, HEALTH_POLL_S - (time.perf_counter() - sample.t)))

    def latest(self) -> HealthSample | None:
        return self.samples[-1] if self.samples else None


class StatePidWatch:
    """Stage pids from ``/debug/state`` every 0.1 s, for a server whose ``/health`` has no per-stage states. An
    answer can take seconds while a stage does not answer the engine (stopped or loading): each observation is
    timed when its answer came."""

    def __init__(self, client: httpx.AsyncClient, url: str, headers: dict[str, str], engine: str) -> None:
        self.client, self.url, self.headers, self.engine = client, url, headers, engine
        self.samples: list[tuple[float, dict[str, int | None]]] = []

    async def run(self) -> None:
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
                pids = await stage_pids(self.client, self.url, self.headers, self.engine)
                self.samples.append((time.perf_counter(), pids))
            await asyncio.sleep(PID_POLL_S)


async def debug_state(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> dict[str, Any]:
    response = await client.get(f"{url}/debug/state", headers=headers, timeout=30.0)
    response.raise_for_status()
    return response.json()


async def stage_pids(client: httpx.AsyncClient, url: str, headers: dict[str, str], engine: str) -> dict[str, Any]:
    state = (await debug_state(client, url, headers))["engines"][engine]["state"] or {}
    return dict(state.get("pids") or {})


def engine_leftovers(state: dict[str, Any]) -> list[str]:
    """What the engines of a ``/debug/state`` answer still hold (request ids, relay slots, pending chunks)."""
    out = []
    for name, info in (state.get("engines") or {}).items():
        held = info.get("state")
        if not held:
            continue
        for key in ("orchestrator_requests", "client_requests"):
            if held.get(key):
                out.append(f"{name}: {key} {held[key]}")
        if held.get("orchestrator_relay_slots"):
            out.append(f"{name}: orchestrator_relay_slots {held['orchestrator_relay_slots']}")
        for stage, s in (held.get("stages") or {}).items():
            for key in ("requests", "relay_slots", "pending_chunks"):
                if s.get(key):
                    out.append(f"{name}: stage {stage} {key} {s[key]}")
    return out


# ---------------------------------------------------------------------------------------------- faults
@dataclass
class Fault:
    kind: str  # KILL, STOP or KILL_WORKER
    target: str  # a stage name, or a worker's name
    stop_s: float = 0.0
    pid: int | None = None
    at: float | None = None
    under_load: bool = False
    error: str | None = None  # why it could not be done
    detected_s: float | None = None
    restarted_s: float | None = None
    ok_again_s: float | None = None
    answered_s: float | None = None
    recovered_s: float | None = None
    resume: asyncio.Task[None] | None = None  # the SIGCONT of a SIGSTOP

    @property
    def label(self) -> str:
        return f"{STOP} {self.stop_s:g} s" if self.kind == STOP else self.kind


@dataclass
class Rig:
    """The target: where requests go, where stage faults are watched, and how pids are found."""

    url: str  # requests (the server, or the gateway)
    headers: dict[str, str]
    stage_url: str  # the server whose stages faults hit (the first worker behind a gateway)
    engine: str  # its main pipeline (the key in /debug/state)
    client: httpx.AsyncClient  # monitoring (not the load's)
    stage_health: HealthWatch
    gateway_health: HealthWatch | None = None
    state_pids: StatePidWatch | None = None
    processes: ProcessWatch | None = None

    def stage_pid_samples(self, stage: str) -> list[tuple[float, int | None]]:
        """Every observation of the stage's pid: from /health's stages, else from /debug/state."""
        from_health = [(s.t, (s.stages.get(stage) or {}).get("pid")) for s in self.stage_health.samples
                       if s.stages is not None and stage in s.stages]
        if from_health:
            return from_health
        return [(t, pids.get(stage)) for t, pids in (self.state_pids.samples if self.state_pids else [])]

    async def current_pid(self, fault: Fault) -> int | None:
        if fault.kind == KILL_WORKER:
            assert self.processes is not None
            return self.processes.workers_now().get(fault.target)
        sample = self.stage_health.latest()
        if sample is not None and sample.stages is not None and fault.target in sample.stages:
            return sample.stages[fault.target].get("pid")
        return (await stage_pids(self.client, self.stage_url, self.headers, self.engine)).get(fault.target)

    def healthy(self, fault: Fault, sample: HealthSample) -> bool:
        if fault.kind == KILL_WORKER:
            return (sample.workers or {}).get(fault.target.removeprefix("worker ")) in SERVING_WORKER_STATES
        if sample.stages is not None and fault.target in sample.stages:
            return sample.stages[fault.target].get("state") == "ok"
        return sample.code == 200

    def down(self, fault: Fault) -> str | None:
        """A stage the server gave up (down, not restarting, for ``GIVEN_UP_AFTER_S``): no request can complete, the
        fault will not heal. (A stage is also down for a moment between its death and its restart.)"""
        samples = self.health_samples(fault)
        if fault.kind == KILL_WORKER or not samples or samples[-1].stages is None:
            return None
        since = samples[-1].t - GIVEN_UP_AFTER_S
        if samples[0].t > since:
            return None
        down = {name for name, info in samples[-1].stages.items() if info.get("state") == "down"}
        for sample in reversed(samples):
            if sample.t < since or not down:
                break
            down &= {name for name, info in (sample.stages or {}).items() if info.get("state") == "down"}
        return min(down) if down else None

    def describe(self, fault: Fault, sample: HealthSample) -> str:
        if fault.kind == KILL_WORKER:
            return f"gateway: {(sample.workers or {}).get(fault.target.removeprefix('worker '))}"
        stage = (sample.stages or {}).get(fault.target)
        down = self.down(fault)
        if down is not None and down != fault.target:
            return f"stage {down!r} is down"
        return f"state {stage.get('state')}" if stage else f"/health {sample.code}"

    def health_samples(self, fault: Fault) -> list[HealthSample]:
        watch = self.gateway_health if fault.kind == KILL_WORKER and self.gateway_health else self.stage_health
        return watch.samples

    def per_stage_health(self) -> bool:
        return any(s.stages is not None for s in self.stage_health.samples)

    def pid_samples(self, fault: Fault) -> list[tuple[float, int | None]]:
        if fault.kind == KILL_WORKER:
            assert self.processes is not None
            return [(t, pids.get(fault.target)) for t, pids in self.processes.worker_pids]
        return self.stage_pid_samples(fault.target)


def measure(rig: Rig, fault: Fault, outcomes: Sequence[Outcome], until: float = math.inf) -> None:
    """Detection, restart, ok again and recovery of ``fault``, in seconds from the signal, from what was seen
    between the signal and ``until`` (the next fault)."""
    if fault.at is None:
        return
    t0 = fault.at
    samples = [s for s in rig.health_samples(fault) if t0 <= s.t < until]
    unhealthy = next((s.t for s in samples if not rig.healthy(fault, s)), None)
    new_pid = next((t for t, pid in rig.pid_samples(fault)
                    if t0 <= t < until and pid is not None and pid != fault.pid), None)
    detected = unhealthy
    if fault.kind != KILL_WORKER and not rig.per_stage_health() and new_pid is not None:
        detected = new_pid if detected is None else min(detected, new_pid)  # /health tells nothing per stage
    fault.detected_s = None if detected is None else detected - t0
    fault.restarted_s = None if new_pid is None else new_pid - t0
    fault.ok_again_s = None
    if detected is not None:
        after = max(detected, new_pid or detected)
        fault.ok_again_s = next((s.t - t0 for s in samples if s.t >= after and rig.healthy(fault, s)), None)
    after_fault = [o for o in outcomes if t0 <= o.started < until]
    answers = [o.answered for o in after_fault if o.answered is not None]
    fault.answered_s = min(answers) - t0 if answers else None
    done = [o.ended for o in after_fault if o.kind == COMPLETED]
    fault.recovered_s = min(done) - t0 if done else None


def plan_faults(kill_stages: Sequence[str], stop_stage: str | None, stop_s: float, worker: str | None) -> list[Fault]:
    faults = [Fault(KILL, stage) for stage in kill_stages]
    if stop_stage is not None and stop_s > 0:
        faults.append(Fault(STOP, stop_stage, stop_s=stop_s))
    if worker is not None:
        faults.append(Fault(KILL_WORKER, worker))
    return faults


def fault_share(requests: int, faults: int) -> int:
    """Requests held back per fault until it is done."""
    return requests // (faults + 1)


async def run_faults(rig: Rig, faults: list[Fault], progress: Progress, concurrency: int,
                     probe: Callable[[], Awaitable[Outcome]], probes: list[Outcome], recovery_timeout_s: float,
                     rng: random.Random) -> None:
    """The faults one by one, spread over the load: fault k comes once the requests before its held-back share went
    out and some are in flight (plus 0.3-1.5 s, so that streams are under way), and only once the fault before it
    healed: a probe request completed and ``/health`` healthy again. Each fault releases its share."""
    share = fault_share(progress.total, len(faults))
    try:
        for index, fault in enumerate(faults):
            due = progress.total - share * (len(faults) - index)
            while not progress.done and not (progress.dispatched >= due and progress.in_flight > 0):
                if progress.in_flight == 0 and progress.dispatched >= progress.allowed:
                    progress.release(progress.allowed + max(1, min(concurrency, share)))  # some load for the fault
                await asyncio.sleep(0.05)
            if progress.in_flight:
                await asyncio.sleep(rng.uniform(0.3, 1.5))
            try:
                if await target_ready(rig, fault, time.perf_counter() + recovery_timeout_s):
                    fault.under_load = progress.in_flight > 0
                    await inject(rig, fault)
            finally:
                progress.release(progress.total - share * (len(faults) - index - 1))
            if fault.at is not None:
                await heal(rig, fault, probe, probes, fault.at + recovery_timeout_s)
    finally:
        progress.release(progress.total)


async def target_ready(rig: Rig, fault: Fault, deadline: float) -> bool:
    """Wait until ``/health`` shows the fault's target healthy (a stage may still be busy with a fault the server
    found by itself); ``fault.error`` if it does not get there by ``deadline``."""
    since = time.perf_counter()
    while time.perf_counter() < deadline:
        samples = rig.health_samples(fault)
        if samples and samples[-1].t > since and rig.healthy(fault, samples[-1]):
            return True
        if rig.down(fault):
            break
        await asyncio.sleep(HEALTH_POLL_S)
    samples = rig.health_samples(fault)
    seen = rig.describe(fault, samples[-1]) if samples else "no /health answer"
    fault.error = f"{fault.target} not healthy before the fault ({seen})"
    return False


async def inject(rig: Rig, fault: Fault) -> None:
    """Send the fault's signal to its process (a SIGSTOP is followed by a SIGCONT later); ``fault.error`` if not."""
    try:
        fault.pid = await rig.current_pid(fault)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        fault.error = f"no pid: {type(exc).__name__}: {exc}"
        return
    if fault.pid is None:
        fault.error = "no pid for it"
        return
    try:
        fault.at = time.perf_counter()
        os.kill(fault.pid, signal.SIGSTOP if fault.kind == STOP else signal.SIGKILL)
    except OSError as exc:  # not on this machine, or gone
        fault.error = f"{type(exc).__name__}: {exc}"
        fault.at = None
        return
    if fault.kind == STOP:
        fault.resume = asyncio.create_task(resume_later(fault.pid, fault.stop_s))


async def heal(rig: Rig, fault: Fault, probe: Callable[[], Awaitable[Outcome]], probes: list[Outcome],
               deadline: float) -> None:
    """Wait (bounded) until the fault healed: a probe request sent after it completed (probes are sent until one
    does), the stopped process continued, the fault seen by ``/health`` (a killed process replaced) and ``/health``
    healthy again after that. A stop that nothing reported by the time it ended is taken as undetected."""
    assert fault.at is not None
    pause = PROBE_PAUSE_S[0]
    while time.perf_counter() < deadline:
        outcome = await probe()
        probes.append(outcome)
        if outcome.kind == COMPLETED or rig.down(fault):
            break
        await asyncio.sleep(pause)
        pause = min(2 * pause, PROBE_PAUSE_S[1])
    if fault.resume is not None:
        await fault.resume
    undetected_after = time.perf_counter() + STOP_REPORT_GRACE_S
    while time.perf_counter() < deadline:
        measure(rig, fault, probes)
        replaced = fault.kind == STOP or fault.restarted_s is not None
        if fault.detected_s is not None and replaced and fault.ok_again_s is not None:
            return
        if fault.kind == STOP and fault.detected_s is None and time.perf_counter() > undetected_after:
            return
        if rig.down(fault):
            return
        await asyncio.sleep(0.05)


async def resume_later(pid: int, after_s: float) -> None:
    await asyncio.sleep(after_s)
    with contextlib.suppress(ProcessLookupError):  # the server replaced the stopped process meanwhile
        os.kill(pid, signal.SIGCONT)


# ---------------------------------------------------------------------------------------------- malformed
async def run_malformed(client: httpx.AsyncClient, cases: Sequence[Case], rounds: int, headers: dict[str, str],
                        timeout_s: float) -> list[dict[str, Any]]:
    """Every case, ``rounds`` times, one at a time; the answer's status (None: no answer) and a 5xx's body."""
    results: list[dict[str, Any]] = []
    for round_index in range(rounds):
        for case in cases:
            entry: dict[str, Any] = {"case": case.name, "round": round_index, "status": None,
                                     "expected": case.status}
            try:
                response = await asyncio.wait_for(client.request(**case.request_args(headers)), timeout_s)
                entry["status"] = response.status_code
                if response.status_code >= 500:
                    entry["body"] = response.text[:1000]
            except TimeoutError:
                entry["error"] = f"no answer within {timeout_s:g} s"
            except httpx.HTTPError as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"
            results.append(entry)
            await asyncio.sleep(0.05)
    return results


def _stage_down(result: dict[str, Any]) -> bool:
    """A well-formed request (one the server must accept) answered 503 ``stage_unavailable``: it met a stage the
    soak had just killed or stopped, which is the right answer then, not a malformed input breaking the server."""
    if result["status"] != 503 or result.get("expected", 500) >= 300:
        return False
    try:
        return json.loads(result.get("body") or "{}")["error"]["code"] == "stage_unavailable"
    except (ValueError, KeyError, TypeError):
        return False


def malformed_summary(results: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    sent = len(results)
    down = [r for r in results if _stage_down(r)]
    results = [r for r in results if not _stage_down(r)]
    codes = [r["status"] for r in results]
    server_errors: dict[str, dict[str, Any]] = {}
    for r in results:
        if r["status"] is not None and r["status"] >= 500:
            entry = server_errors.setdefault(r["case"], {"case": r["case"], "status": r["status"], "count": 0,
                                                        "body": r.get("body")})
            entry["count"] += 1
    return {"rounds": rounds, "requests": sent,
            "2xx": sum(1 for c in codes if c is not None and c < 300),
            "4xx": sum(1 for c in codes if c is not None and 400 <= c < 500),
            "5xx": sum(1 for c in codes if c is not None and c >= 500),
            "other": sum(1 for c in codes if c is not None and 300 <= c < 400),
            "no_answer": [f"{r['case']}: {r.get('error')}" for r in results if r["status"] is None],
            "server_errors": list(server_errors.values()),
            "stage_down": len(down)}


def malformed_list(model: str, max_body_bytes: int, api_key: bool) -> list[Case]:
    """The shared list; without an API key on the server, the cases about the key mean nothing and are left out."""
    cases = malformed_cases(model, max_body_bytes)
    if api_key:
        return cases
    return [c for c in cases if c.auth and "Authorization" not in c.headers]


# ---------------------------------------------------------------------------------------------- report
def _change(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before == 0:
        return None
    return (after - before) / before * 100


def format_report(report: dict[str, Any]) -> str:
    load, probes = report["requests"]["load"], report["requests"]["probes"]
    causes = list(dict.fromkeys([*load["causes"], *probes["causes"]]))
    rows: list[list[Any]] = [[COMPLETED, load["completed"], probes["completed"]]]
    rows += [[f"failed: {cause}", load["causes"].get(cause, 0), probes["causes"].get(cause, 0)] for cause in causes]
    rows += [[LEFT, load["left_by_client"], probes["left_by_client"]], [STUCK, load["stuck"], probes["stuck"]],
             ["total", load["total"], probes["total"]]]
    lines = [format_table(REQUEST_HEADERS, rows, title="Requests (probes: sent after each fault until one completes)")]
    for o in report["requests"]["timeline"]:
        if o["kind"] == STUCK:
            queue = f", out of the gateway's queue at {o['dequeued_s']:.1f} s" if o["dequeued_s"] is not None else ""
            last = f", the last at {o['last_event_s']:.1f} s" if o["last_event_s"] is not None else ""
            lines.append(f"  stuck: {'probe' if o['probe'] else 'request'} sent at {o['started_s']:.1f} s"
                         f"{queue}: {o['events']} events{last}")

    def ms(value: float | None) -> float | None:
        return None if value is None else value * 1000

    faults = report["faults"]
    if faults:
        lines += ["", format_table(FAULT_HEADERS, [
            [f["label"], f["target"], f["pid"], None if f["at_s"] is None else "yes" if f["under_load"] else "no",
             ms(f["detected_s"]), ms(f["restarted_s"]), ms(f["ok_again_s"]), ms(f["answered_s"]),
             ms(f["recovered_s"])]
            for f in faults], digits=0, title="Faults (times from the signal)")]
        lines += [f"  {f['label']} {f['target']}: not done: {f['error']}" for f in faults if f["error"]]
    res = report["resources"]
    if res.get("before") and res.get("after"):
        names = [("rss_mib", "RSS (MiB)"), ("rss_lived_through_mib",
                                            f"RSS of the {res['before']['lived_through']} alive throughout (MiB)"),
                 ("open_fds", "open fds"), ("threads", "threads"), ("child_processes", "child processes"),
                 ("shm_segments", "shm segments")]
        lines += ["", format_table(RESOURCE_HEADERS, [
            [label, res["before"][key], res["after"][key], _change(res["before"][key], res["after"][key])]
            for key, label in names], digits=1,
            title=f"Resources of pid {res['root_pid']} and its descendants (after warm-up; after the run, idle)")]
    elif res.get("note"):
        lines += ["", f"resources: {res['note']}"]
    mal = report["malformed"]
    if mal:
        lines += ["", format_table(MALFORMED_HEADERS, [[mal["rounds"], mal["requests"], mal["2xx"], mal["4xx"],
                                                         mal["5xx"], mal["stage_down"], len(mal["no_answer"])]],
                                   title="Malformed requests")]
        lines += [f"  {e['status']} x{e['count']} {e['case']}: {e['body']}" for e in mal["server_errors"]]
        lines += [f"  no answer: {line}" for line in mal["no_answer"]]
    if report["stages_at_end"]:
        lines += ["", "stages at the end: " + ", ".join(
            f"{name} {s['state']} (restarts {s['restarts']}, stall reports {s['stalls']})"
            for name, s in report["stages_at_end"].items())]
    if report["leaks"]:
        lines += ["", "Leaks:", *(f"  {leak}" for leak in report["leaks"])]
    return "\n".join(lines)


def verdict(report: dict[str, Any]) -> list[str]:
    """Why the run fails (nothing: it passes)."""
    reasons = []
    stuck = report["requests"]["load"]["stuck"] + report["requests"]["probes"]["stuck"]
    if stuck:
        reasons.append(f"{stuck} stuck request(s)")
    mal = report["malformed"]
    if mal and mal["5xx"]:
        reasons.append(f"{mal['5xx']} malformed request(s) got a 5xx "
                       f"({', '.join(e['case'] for e in mal['server_errors'])})")
    if mal and mal["no_answer"]:
        reasons.append(f"{len(mal['no_answer'])} malformed request(s) got no answer")
    for f in report["faults"]:
        name = f"{f['label']} {f['target']}"
        if f["error"]:
            reasons.append(f"{name} could not be done ({f['error']})")
        elif f["detected_s"] is None:
            reasons.append(f"{name} was not detected")
        elif f["recovered_s"] is None:
            reasons.append(f"{name} did not heal: no request sent after it completed")
        elif f["ok_again_s"] is None:
            reasons.append(f"{name} did not heal: /health not healthy again")
    down = [name for name, s in report["stages_at_end"].items() if s["state"] == "down"]
    if down:
        reasons.append(f"the server gave up stage(s) {', '.join(down)} (down at the end)")
    if report["leaks"]:
        reasons.append("leaked: " + "; ".join(report["leaks"]))
    return reasons


# ---------------------------------------------------------------------------------------------- the run
def liveness_deploy(base: Path | None, stages: Sequence[str], report_s: float,
                    restart_s: float | None) -> dict[str, Any]:
    """The deploy file for ``--spawn``: ``base`` (if given) with the liveness bounds set for every stage that does
    not set its own; the bounds only where this build's deploy config knows them."""
    from omnipipe.config.deploy_config import StageDeploy

    raw: dict[str, Any] = (yaml.safe_load(base.read_text()) or {}) if base is not None else {}
    known = {f.name for f in dataclasses.fields(StageDeploy)}
    if not {"stall_report_s", "stall_restart_s"} <= known:
        return raw
    stages_raw = raw.setdefault("stages", {})
    for stage in stages:
        settings = stages_raw.setdefault(stage, {}) or {}
        settings.setdefault("stall_report_s", report_s)
        settings.setdefault("stall_restart_s", restart_s)
        stages_raw[stage] = settings
    return raw


async def wait_idle(client: httpx.AsyncClient, urls: Sequence[str], headers: dict[str, str],
                    timeout_s: float) -> list[str]:
    """Poll every server's ``/debug/state`` until its engines hold nothing; what they still hold at the deadline."""
    deadline = time.perf_counter() + timeout_s
    held: list[str] = []
    while True:
        held = []
        for url in urls:
            try:
                held += [f"{url}: {h}" for h in engine_leftovers(await debug_state(client, url, headers))]
            except (httpx.HTTPError, ValueError) as exc:
                held.append(f"{url}: /debug/state: {type(exc).__name__}: {exc}")
        if not held or time.perf_counter() > deadline:
            return held
        await asyncio.sleep(0.2)


async def served_model(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> str:
    response = await client.get(f"{url}/v1/models", headers=headers, timeout=30.0)
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise BenchError(f"{url}/v1/models lists no models")
    return str(models[0]["id"])


async def soak(args: argparse.Namespace, target: dict[str, Any]) -> tuple[dict[str, Any], ProcessWatch | None]:
    """Warm-up, resources, then load + faults + malformed together, then resources again. Returns the report and
    what was seen of the server's processes (to check the stop)."""
    url, headers, root = target["url"], target["headers"], target["root_pid"]
    # through a gateway, a request tells its wait in the queue (queue events) from a silent one
    request_headers = {**headers, QUEUE_EVENTS_HEADER: "1"} if target["gateway"] else headers
    timeout = httpx.Timeout(args.request_timeout + 10, connect=10.0)
    limits = httpx.Limits(max_connections=args.concurrency + 2, max_keepalive_connections=args.concurrency + 2)
    async with contextlib.AsyncExitStack() as stack:
        load_client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, headers=request_headers,
                                                                        timeout=timeout, limits=limits))
        probe_client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, headers=request_headers,
                                                                         timeout=timeout))
        watch_client = await stack.enter_async_context(httpx.AsyncClient(timeout=10.0))
        malformed_client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=timeout))
        model = await served_model(watch_client, url, headers)
        engine = target["engine"]
        rig = Rig(url, headers, target["stage_url"], engine, watch_client, HealthWatch(watch_client,
                                                                                        target["stage_url"]))
        if target["gateway"]:
            rig.gateway_health = HealthWatch(watch_client, url)
        processes = ProcessWatch(root, target["worker_ports"]) if root is not None else None
        rig.processes = processes
        stage_names = list((await stage_pids(watch_client, target["stage_url"], headers, engine)).keys())
        unknown = [s for s in [*args.kill, *([args.stop_stage] if args.stop_stage_s > 0 else [])]
                   if s not in stage_names]
        if unknown:
            raise BenchError(f"no stage {', '.join(map(repr, unknown))} in pipeline {engine!r} "
                             f"(its stages: {', '.join(stage_names)})")
        prompts = load_prompts("random", args.requests + args.warmup * args.concurrency, args.seed)
        warm, prompts = prompts[:args.warmup * args.concurrency], prompts[args.warmup * args.concurrency:]
        cases = malformed_list(model, target["max_body_bytes"], bool(headers)) if args.malformed else []
        if warm:  # with one round of the malformed requests, which may start the speech and transcription engines
            print(f"omnipipe bench soak: warm-up ({len(warm)} requests{' and the malformed ones' if cases else ''})",
                  file=sys.stderr, flush=True)
            await asyncio.gather(run_load(load_client, model, warm, {}, args.concurrency, args.max_tokens,
                                          args.request_timeout, Progress(len(warm))),
                                 run_malformed(malformed_client, cases, 1, headers, args.request_timeout))
        idle_urls = target["idle_urls"]
        held_before = await wait_idle(watch_client, idle_urls, headers, 60.0)
        if held_before:
            print(f"omnipipe bench soak: before the run the engines still hold: {'; '.join(held_before)}",
                  file=sys.stderr)
        before = None
        if processes is not None:
            processes.sample_tree()
            before, rss_before = resources(root, processes.runs)
        first = await rig.stage_health.poll_once()
        if first.stages is None:  # no per-stage /health: pids from /debug/state
            rig.state_pids = StatePidWatch(watch_client, target["stage_url"], headers, engine)
        monitors = [asyncio.create_task(m.run()) for m in (rig.stage_health, rig.gateway_health, rig.state_pids,
                                                           processes) if m is not None]
        faults = plan_faults(args.kill, args.stop_stage, args.stop_stage_s, target["fault_worker"])
        progress = Progress(len(prompts), len(prompts) - fault_share(len(prompts), len(faults)) * len(faults))
        probes: list[Outcome] = []
        leave = leave_plan(len(prompts), args.abort_rate, args.seed)
        probe_prompts = iter(load_prompts("random", 10_000, args.seed + 1))

        def probe() -> Awaitable[Outcome]:
            return soak_request(probe_client, model, next(probe_prompts), min(args.max_tokens, PROBE_MAX_TOKENS),
                                None, args.request_timeout)

        print(f"omnipipe bench soak: {len(prompts)} requests at concurrency {args.concurrency} "
              f"({len(leave)} left by the client), {len(faults)} fault(s), {args.malformed} malformed round(s) of "
              f"{len(cases)}", file=sys.stderr, flush=True)
        start, started_at_unix = time.perf_counter(), time.time()

        def since(t: float | None) -> float | None:
            return None if t is None else t - start

        try:
            outcomes, _, malformed = await asyncio.gather(
                run_load(load_client, model, prompts, leave, args.concurrency, args.max_tokens,
                         args.request_timeout, progress),
                run_faults(rig, faults, progress, args.concurrency, probe, probes, args.recovery_timeout,
                           random.Random(args.seed)),
                run_malformed(malformed_client, cases, args.malformed, headers, args.request_timeout))
            wall = time.perf_counter() - start
            held_after = await wait_idle(watch_client, idle_urls, headers, 60.0)
        finally:
            for task in monitors:
                task.cancel()
            await asyncio.gather(*monitors, return_exceptions=True)
        end_health = await rig.stage_health.poll_once()
        after = None
        if processes is not None:
            processes.sample_tree()
            after, rss_after = resources(root, processes.runs)
    starts = [f.at for f in faults if f.at is not None]
    for fault in faults:
        later = [t for t in starts if fault.at is not None and t > fault.at]
        measure(rig, fault, [*outcomes, *probes], min(later, default=math.inf))
    leaks = [f"the engines still hold {h}" for h in held_after]
    if before and after:
        before["rss_lived_through_mib"], after["rss_lived_through_mib"], lived = survivors_rss(rss_before, rss_after)
        before["lived_through"] = after["lived_through"] = lived
        growth = _change(before["rss_lived_through_mib"], after["rss_lived_through_mib"])
        if growth is not None and growth > args.max_rss_growth:
            leaks.append(f"RSS of the {lived} processes that lived through the run grew {growth:.1f}% (over "
                         f"{args.max_rss_growth:g}%): {before['rss_lived_through_mib']:.0f} -> "
                         f"{after['rss_lived_through_mib']:.0f} MiB")
    return {
        "model": model, "wall_s": wall, "per_stage_health": rig.per_stage_health(),
        "stages_at_end": {name: {k: info.get(k) for k in ("state", "pid", "restarts", "stalls")}
                          for name, info in (end_health.stages or {}).items()},
        "requests": {"load": tally(outcomes), "probes": tally(probes),
                     "timeline": [{"probe": probe_flag, "kind": o.kind, "cause": o.cause,
                                   "started_s": o.started - start, "ended_s": o.ended - start,
                                   "answered_s": since(o.answered), "events": o.events,
                                   "last_event_s": since(o.last_event), "dequeued_s": since(o.dequeued)}
                                  for probe_flag, group in ((False, outcomes), (True, probes)) for o in group]},
        "started_at_unix": started_at_unix,
        "faults": [{"label": f.label, "kind": f.kind, "target": f.target, "stop_s": f.stop_s, "pid": f.pid,
                    "at_s": None if f.at is None else f.at - start, "under_load": f.under_load, "error": f.error,
                    "detected_s": f.detected_s, "restarted_s": f.restarted_s, "ok_again_s": f.ok_again_s,
                    "answered_s": f.answered_s, "recovered_s": f.recovered_s} for f in faults],
        "resources": {"root_pid": root, "before": before, "after": after,
                      "note": None if root is not None else "the server's process is not on this machine"},
        "malformed": malformed_summary(malformed, args.malformed) if args.malformed else None,
        "leaks": leaks,
    }, processes


def spawn_target(args: argparse.Namespace, workdir: Path, children: list[Child]) -> dict[str, Any]:
    """Start ``omnipipe serve`` (or ``omnipipe up``) and wait until it serves; what ``soak`` needs to know of it."""
    from omnipipe.models.registry import get_pipeline

    pipeline = get_pipeline(args.pipeline)
    deploy = liveness_deploy(args.deploy, pipeline.stage_names, args.stall_report_s, args.stall_restart_s)
    deploy_path = workdir / "deploy.yaml"
    deploy_path.write_text(yaml.safe_dump(deploy))
    port = free_port()
    if not args.gateway:
        api_key = args.api_key or secrets.token_urlsafe(12)
        server = Child("server", ["serve", "--pipeline", args.pipeline, "--host", "127.0.0.1", "--port", str(port),
                                  "--deploy", str(deploy_path), f"--api-key={api_key}",
                                  "--max-body-bytes", str(SPAWN_MAX_BODY_BYTES)], workdir, port)
        children.append(server)
        print(f"omnipipe bench soak: starting omnipipe serve --pipeline {args.pipeline} on port {port} "
              f"(log in {server.log_path})", file=sys.stderr, flush=True)
        wait_until(lambda: httpx.get(f"{server.url}/health", timeout=5).status_code == 200, args.startup_timeout,
                   "the server", children)
        return {"url": server.url, "headers": {"Authorization": f"Bearer {api_key}"}, "root_pid": server.process.pid,
                "stage_url": server.url, "engine": args.pipeline, "gateway": False, "worker_ports": [],
                "fault_worker": None, "idle_urls": [server.url], "max_body_bytes": SPAWN_MAX_BODY_BYTES,
                "deploy": deploy}
    worker_ports = free_ports(GATEWAY_WORKERS)
    capacity = max(1, math.ceil(args.concurrency / GATEWAY_WORKERS))
    up = Child("up", ["up", "--workers", str(GATEWAY_WORKERS), "--pipeline", args.pipeline, "--deploy",
                      str(deploy_path), "--capacity", str(capacity), "--worker-port", str(worker_ports[0]), "--port",
                      str(port), f"--admin-token={secrets.token_urlsafe(12)}", "--data-dir", str(workdir / "data")],
               workdir, port)
    children.append(up)
    print(f"omnipipe bench soak: starting omnipipe up --workers {GATEWAY_WORKERS} --pipeline {args.pipeline} "
          f"(gateway on port {port}, workers on {worker_ports[0]}..{worker_ports[-1]}; log in {up.log_path})",
          file=sys.stderr, flush=True)
    worker_urls = [f"http://127.0.0.1:{p}" for p in worker_ports]

    def all_ready() -> bool:
        reply = httpx.get(f"{up.url}/health", timeout=5).json()
        workers = reply.get("workers") or {}
        return len(workers) == GATEWAY_WORKERS and all(s == "IDLE" for s in workers.values()) and \
            all(httpx.get(f"{u}/health", timeout=5).status_code == 200 for u in worker_urls)

    wait_until(all_ready, args.startup_timeout, "omnipipe up", children)
    return {"url": up.url, "headers": {}, "root_pid": up.process.pid, "stage_url": worker_urls[0],
            "engine": args.pipeline, "gateway": True, "worker_ports": worker_ports,
            "fault_worker": worker_name(worker_ports[0]), "idle_urls": worker_urls,
            "max_body_bytes": DEFAULT_MAX_BODY_BYTES, "deploy": deploy}


def free_ports(count: int) -> list[int]:
    """``count`` consecutive free loopback ports (``up`` puts its workers on consecutive ports)."""
    for _ in range(100):
        first = free_port()
        ports = list(range(first, first + count))
        if all(_port_free(p) for p in ports[1:]):
            return ports
    raise BenchError(f"found no {count} consecutive free ports")


def _port_free(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def running_target(args: argparse.Namespace) -> dict[str, Any]:
    """A server started by someone else, at ``--base-url``."""
    url = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        health = httpx.get(f"{url}/health", timeout=10)
        engines = httpx.get(f"{url}/debug/state", headers=headers, timeout=30)
        engines.raise_for_status()
    except httpx.HTTPError as exc:
        raise BenchError(f"cannot reach {url}: {exc}") from exc
    pipeline = health.json().get("pipeline") or next(iter(engines.json()["engines"]))
    root = args.server_pid
    split = urlsplit(url)
    if root is None and split.hostname in ("127.0.0.1", "localhost", "::1"):
        root = listening_pid(split.port or 80)
    return {"url": url, "headers": headers, "root_pid": root, "stage_url": url, "engine": pipeline,
            "gateway": False, "worker_ports": [], "fault_worker": None, "idle_urls": [url],
            "max_body_bytes": args.max_body_bytes, "deploy": None}


def after_stop(processes: Any, settle_s: float = 15.0) -> list[str]:
    """What a stopped server left: processes, /dev/shm segments and run directories of its engines."""
    if processes is None:
        return []
    deadline = time.monotonic() + settle_s
    while True:
        alive, segments, dirs = processes.alive(), run_segments(processes.runs), run_dirs(processes.runs)
        if not (alive or segments or dirs) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return ([f"process still running after the stop: {p}" for p in alive]
            + [f"/dev/shm segment after the stop: {s}" for s in segments]
            + [f"run directory after the stop: {d}" for d in dirs])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnipipe bench soak", description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[2:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--base-url", default=None, help="a running server (default: http://127.0.0.1:8091)")
    where.add_argument("--spawn", action="store_true", help="start omnipipe serve (and stop it at the end)")
    where.add_argument("--gateway", action="store_true",
                       help=f"start omnipipe up with {GATEWAY_WORKERS} workers and go through its gateway")
    parser.add_argument("--pipeline", default="default", help="with --spawn/--gateway (default: %(default)s)")
    parser.add_argument("--deploy", type=Path, help="with --spawn/--gateway: a deploy YAML to start from")
    parser.add_argument("--api-key", default=os.environ.get("OMNIPIPE_API_KEY"),
                        help="sent as 'Authorization: Bearer KEY' (default: $OMNIPIPE_API_KEY; --spawn: a random "
                             "one the server is started with)")
    parser.add_argument("--server-pid", type=int, help="with --base-url: the server's pid, for its resources "
                        "(default: the process listening on the URL's port, if on this machine)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="with --base-url: the server's body limit, for the malformed case just over it")
    parser.add_argument("--requests", type=int, default=60, help="streaming chat completions (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=8, help="at most this many in flight")
    parser.add_argument("--abort-rate", type=float, default=0.2, help="share of requests the client leaves mid-stream")
    parser.add_argument("--kill-stages", default="", help="comma-separated stages to SIGKILL once each, e.g. "
                        "thinker,talker,code2wav")
    parser.add_argument("--stop-stage-s", type=float, default=0.0, help="SIGSTOP a stage this long (0: not at all)")
    parser.add_argument("--stop-stage", default="thinker", help="the stage --stop-stage-s stops (default: thinker)")
    parser.add_argument("--malformed", type=int, default=0, help="rounds of the malformed request list")
    # short enough that a --stop-stage-s of 25 s goes through the restart path, wide enough that a busy 2-core
    # machine's slow steps are only reported (at 1 s / 4 s the watchdog killed a loaded thinker until it was given up)
    parser.add_argument("--stall-report-s", type=float, default=2.0,
                        help="--spawn/--gateway: every stage's stall_report_s in the deploy file")
    parser.add_argument("--stall-restart-s", type=float, default=20.0,
                        help="--spawn/--gateway: every stage's stall_restart_s (a negative value: null, never)")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0, help="question order and which requests are left")
    parser.add_argument("--warmup", type=int, default=1, help="rounds of --concurrency requests first, not counted")
    parser.add_argument("--request-timeout", type=float, default=120.0,
                        help="a request without an end after this many seconds is stuck")
    parser.add_argument("--recovery-timeout", type=float, default=180.0,
                        help="how long a fault may take to heal before the next one")
    parser.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for the models")
    parser.add_argument("--max-rss-growth", type=float, default=10.0, help="percent of RSS growth that is a leak")
    parser.add_argument("--json", help="also write everything here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.kill = [s.strip() for s in args.kill_stages.split(",") if s.strip()]
    if len(set(args.kill)) != len(args.kill):
        parser.error("--kill-stages: each stage once")
    if args.requests < 1 or args.concurrency < 1 or args.max_tokens < 1 or args.warmup < 0 or args.malformed < 0:
        parser.error("--requests, --concurrency and --max-tokens must be >= 1, --warmup and --malformed >= 0")
    if not 0 <= args.abort_rate <= 1:
        parser.error("--abort-rate: a share in [0, 1]")
    if not (math.isfinite(args.stop_stage_s) and args.stop_stage_s >= 0):
        parser.error("--stop-stage-s: a number of seconds >= 0")
    for flag in ("request_timeout", "recovery_timeout", "startup_timeout", "stall_report_s"):
        if not getattr(args, flag) > 0:
            parser.error(f"--{flag.replace('_', '-')}: must be > 0")
    if args.stall_restart_s < 0:
        args.stall_restart_s = None
    elif args.stall_restart_s <= args.stall_report_s:
        parser.error("--stall-restart-s: must be above --stall-report-s (or negative: never)")
    spawn = args.spawn or args.gateway
    if spawn and args.deploy is not None and not args.deploy.is_file():
        parser.error(f"--deploy: file not found: {args.deploy}")
    if spawn:
        from omnipipe.models.registry import UnknownPipelineError, get_pipeline

        try:
            get_pipeline(args.pipeline)
        except UnknownPipelineError as exc:
            parser.error(f"--pipeline: {exc}")
    if not spawn and args.base_url is None:
        args.base_url = "http://127.0.0.1:8091"
    info = machine_info()
    workdir = Path(tempfile.mkdtemp(prefix="omnipipe-bench-soak-"))
    children: list[Child] = []
    report: dict[str, Any] | None = None
    try:
        target = spawn_target(args, workdir, children) if spawn else running_target(args)
        try:
            report, processes = asyncio.run(soak(args, target))
        except (OSError, httpx.HTTPError) as exc:  # OSError includes TimeoutError
            for child in children:
                child.check_alive()
            raise BenchError(f"{type(exc).__name__}: {exc}") from exc
    except BenchError as exc:
        print(f"omnipipe bench soak: {exc}", file=sys.stderr)
        if children:
            print(f"omnipipe bench soak: logs kept in {workdir}", file=sys.stderr)
        return 1
    finally:
        killed = stop_children(children)
        if killed:
            print(f"omnipipe bench soak: had to kill {', '.join(killed)}", file=sys.stderr)
        if report is not None and spawn:
            report["after_stop"] = after_stop(processes)
            report["leaks"] += report["after_stop"]
            code = children[0].process.returncode
            if code != 0:
                report["leaks"].append(f"{children[0].name} exited with code {code} when stopped")
                print(f"omnipipe bench soak: the end of {children[0].name}'s log:\n{children[0].log_tail()}",
                      file=sys.stderr)
    mode = "gateway (omnipipe up)" if args.gateway else "spawned server" if args.spawn else target["url"]
    print(f"omnipipe bench soak: {mode}, pipeline {target['engine']!r}, model {report['model']!r}; "
          f"{args.requests} requests at concurrency {args.concurrency}, abort rate {args.abort_rate:g}, "
          f"{report['wall_s']:.1f} s; /health per stage: {'yes' if report['per_stage_health'] else 'no'}")
    print(format_report(report))
    if spawn and not report["after_stop"]:
        print(f"\nafter the stop: no process, /dev/shm segment or run directory left of the "
              f"{len(processes.seen)} processes and {len(processes.runs)} engine runs seen")
    reasons = verdict(report)
    print()
    print(f"FAIL: {'; '.join(reasons)}" if reasons else "PASS: nothing stuck, no 5xx, every fault healed, no leak")
    if reasons and children:
        print(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        write_json(args.json, {
            "meta": {"mode": "gateway" if args.gateway else "spawn" if args.spawn else "base-url",
                     "url": target["url"], "pipeline": target["engine"], "requests": args.requests,
                     "concurrency": args.concurrency, "abort_rate": args.abort_rate, "kill_stages": args.kill,
                     "stop_stage": args.stop_stage if args.stop_stage_s > 0 else None,
                     "stop_stage_s": args.stop_stage_s, "malformed_rounds": args.malformed,
                     "max_tokens": args.max_tokens, "seed": args.seed, "request_timeout_s": args.request_timeout,
                     "deploy": target["deploy"], "machine": info},
            **report, "fail": reasons})
        print(f"figures written to {args.json}")
    return 1 if reasons else 0


if __name__ == "__main__":
    sys.exit(main())
