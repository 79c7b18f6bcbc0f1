"""Shared fixtures: engines on a background event loop, and leak checks."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import psutil
import pytest

from omnipipe import AsyncOmni


class EngineHarness:
    """An AsyncOmni living on its own event-loop thread, so tests can share one engine."""

    def __init__(self, pipeline: Any = "toy", deploy: Any = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.engine: AsyncOmni = self.run(self._create(pipeline, deploy))

    @staticmethod
    async def _create(pipeline: Any, deploy: Any) -> AsyncOmni:
        return await AsyncOmni(pipeline, deploy).start()

    def run(self, coro: Awaitable[Any], timeout_s: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        try:
            self.run(self.engine.shutdown())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()


async def collect(engine: AsyncOmni, prompt: Any, **kwargs: Any) -> list[Any]:
    return [out async for out in engine.generate(prompt, **kwargs)]


async def wait_until_idle(engine: AsyncOmni, timeout_s: float = 10.0) -> dict[str, Any]:
    """Poll the engine's state until no stage, relay or queue holds anything; return the last state."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        state = await engine.debug_state()
        if state_is_idle(state) or loop.time() > deadline:
            return state
        await asyncio.sleep(0.05)


def state_is_idle(state: dict[str, Any]) -> bool:
    if state["orchestrator_requests"] or state["orchestrator_relay_slots"] or state["client_requests"]:
        return False
    return all(not s["requests"] and not s["relay_slots"] and not s["pending_chunks"] for s in state["stages"].values())


def shm_segments(run_id: str) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"omnipipe-{run_id}-")]


def child_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(scope="module")
def toy() -> Any:
    harness = EngineHarness("toy")
    yield harness
    harness.close()


@pytest.fixture
def harness_factory() -> Callable[..., EngineHarness]:
    made: list[EngineHarness] = []

    def make(pipeline: Any = "toy", deploy: Any = None) -> EngineHarness:
        harness = EngineHarness(pipeline, deploy)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        if not harness.loop.is_closed():
            harness.close()
