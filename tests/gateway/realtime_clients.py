"""Async realtime clients that go through the gateway's queue, for the FIFO and worker-failure tests."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

RECV_TIMEOUT_S = 180


@dataclass
class QueuedClient:
    index: int
    ws: ClientConnection | None = None
    queued: dict[str, Any] | None = None
    updates: list[dict[str, Any]] = field(default_factory=list)
    done: dict[str, Any] | None = None
    served_at: float | None = None
    answer: str = ""
    audio_deltas: int = 0
    error: dict[str, Any] | None = None
    close_code: int | None = None


async def recv(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S))


async def join(url: str, client: QueuedClient) -> None:
    """Connect and read the first queue message."""
    client.ws = await connect(url, max_size=None, open_timeout=30)
    client.queued = await recv(client.ws)
    assert client.queued["type"] == "queued", client.queued


async def wait_served(client: QueuedClient) -> None:
    """Read queue updates until ``queue_done`` (and the worker's ``session.created``)."""
    assert client.ws is not None
    while True:
        event = await recv(client.ws)
        if event["type"] == "queue_update":
            client.updates.append(event)
        elif event["type"] == "queue_done":
            client.done = event
            client.served_at = time.monotonic()
        elif event["type"] == "session.created":
            assert client.done is not None, "session.created before queue_done"
            return
        else:
            raise AssertionError(f"unexpected event while queued: {event}")


async def ask(client: QueuedClient, question: str, modalities: list[str]) -> None:
    """One turn: a text item and a response; collects the answer until ``response.done`` or an error."""
    assert client.ws is not None
    await client.ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}}))
    await client.ws.send(json.dumps({"type": "response.create", "response": {"modalities": modalities}}))
    while True:
        try:
            event = await recv(client.ws)
        except Exception:  # the connection closed: keep how
            client.close_code = client.ws.close_code
            return
        if event["type"] in ("response.text.delta", "response.audio_transcript.delta"):
            client.answer += event["delta"]
        elif event["type"] == "response.audio.delta":
            client.audio_deltas += 1
        elif event["type"] == "error":
            client.error = event["error"]
        elif event["type"] == "response.done":
            assert event["response"]["status"] == "completed", event
            return
