"""The soak's load: streaming chat completions, some left by the client mid-stream, each ending in an ``Outcome``
(completed, failed with its cause, left by client, stuck); how far the load may go while faults are due."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from omnipipe.gateway.proxy.queue_wait import QUEUE_DONE

CHAT = "/v1/chat/completions"
QUEUE_EVENT = "queue"  # the SSE event name of a gateway's queue updates
LEAVE_AFTER_CHUNKS = (1, 6)  # a left request is left after this many data events (inclusive range)
CAUSE_CHARS = 240

COMPLETED, FAILED, LEFT, STUCK = "completed", "failed", "left by client", "stuck"


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
                finish = _note_choices(out, event, finish)
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


def _note_choices(out: Outcome, event: dict[str, Any], finish: str | None) -> str | None:
    """When the answer began (its first text or audio), into ``out``; the finish_reason so far."""
    for choice in event.get("choices") or []:
        finish = choice.get("finish_reason") or finish
        delta = choice.get("delta") or {}
        audio = delta.get("audio") or {}
        if out.answered is None and (delta.get("content") or audio.get("transcript") or audio.get("data")):
            out.answered = time.perf_counter()
    return finish


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
