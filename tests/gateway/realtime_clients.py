"""Async realtime clients that go through the gateway's queue, for the FIFO and worker-failure tests."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from tests.waiting import wait_for_async

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
    asked = ["audio"] if "audio" in modalities else ["text"]
    await client.ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": asked}}))
    while True:
        try:
            event = await recv(client.ws)
        except Exception:  # the connection closed: keep how
            client.close_code = client.ws.close_code
            return
        if event["type"] in ("response.output_text.delta", "response.output_audio_transcript.delta"):
            client.answer += event["delta"]
        elif event["type"] == "response.output_audio.delta":
            client.audio_deltas += 1
        elif event["type"] == "error":
            client.error = event["error"]
        elif event["type"] == "response.done":
            assert event["response"]["status"] == "completed", event
            return


async def six_on_two_slots(url: str, first_question: str, question: str, modalities: list[str]) -> list[QueuedClient]:
    """Six clients join one after the other (so the arrival order is known) while two slots serve them; each
    served client asks one question and leaves, which lets the next one in."""
    clients = [QueuedClient(i) for i in range(6)]
    for client in clients:
        await join(url, client)
    await asyncio.gather(*(wait_served(c) for c in clients[:2]))
    waiting = [asyncio.create_task(wait_served(c)) for c in clients[2:]]
    for client in clients[:2]:
        await ask(client, first_question, modalities)
        await client.ws.close()
    for task, client in zip(waiting, clients[2:], strict=True):
        await task
        await ask(client, question, modalities)
        await client.ws.close()
    return clients


def check_fifo(clients: list[QueuedClient]) -> None:
    """Positions 1..4 in arrival order for the four that waited, served in that order, each answered."""
    assert [c.queued["position"] for c in clients] == [0, 0, 1, 2, 3, 4], [c.queued for c in clients]
    assert all(c.queued["ticket_id"] for c in clients)
    assert [(c.queued["estimated_wait_s"] or 0) > 0 for c in clients] == [False, False, True, True, True, True], \
        [c.queued for c in clients]
    # the first two were served at once (read concurrently, in either order); the four that waited, in order
    served_order = sorted(clients, key=lambda c: c.served_at)
    assert sorted(c.index for c in served_order[:2]) == [0, 1] \
        and [c.index for c in served_order[2:]] == [2, 3, 4, 5], \
        [(c.index, c.queued, c.updates, c.done) for c in served_order]
    for client in clients[3:]:  # everyone behind the head saw its place move up
        positions = [u["position"] for u in client.updates]
        assert positions and positions == sorted(positions, reverse=True), positions
        assert positions[-1] < client.queued["position"]
    assert all(c.answer and c.error is None for c in clients), [(c.answer, c.error) for c in clients]


async def kill_one_of_two(url: str, question: str, kill: Callable[[str], None]) -> tuple[QueuedClient, QueuedClient]:
    """Two sessions on two workers both answering; ``kill(worker_address)`` kills the first one's worker once
    both answers are under way; both sessions are closed on return."""
    a, b = QueuedClient(0), QueuedClient(1)
    for client in (a, b):
        await join(url, client)
        await wait_served(client)
    assert a.done["worker"] != b.done["worker"]
    turns = [asyncio.create_task(ask(c, question, ["text", "audio"])) for c in (a, b)]
    await wait_for_async(lambda: a.answer and b.answer, RECV_TIMEOUT_S, "both answers under way")
    kill(a.done["worker"])
    await asyncio.gather(*turns)
    for client in (a, b):  # the survivor's session ends here, not whenever the connection is collected
        await client.ws.close()
    return a, b
