"""What the soak asks a server: ``/health`` polled every 50 ms, stage pids from ``/debug/state``, what the engines
still hold, the model it serves."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from omnipipe.bench.gateway import BenchError
from omnipipe.bench.soak_processes import PID_POLL_S

HEALTH_POLL_S = 0.05


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
