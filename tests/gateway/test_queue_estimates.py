"""What a waiter is told, through a real gateway in front of real toy workers: an estimate made from the session that
is actually ahead of it (its type's duration less how long it has run) and the requests queued before it; and, while
the only worker is still loading its models, that the service is starting instead of a number."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.gateway.conftest import GatewayProcess, WorkerProcess, running
from tests.server.conftest import TOY_DEPLOY
from tests.waiting import wait_for

pytestmark = pytest.mark.slow  # a gateway and workers serving sessions long enough to be estimated

VOICE_S, CHAT_S = 30.0, 10.0
ROUNDING = 0.06  # estimates are sent rounded to 0.1 s
SLOW_LOAD_DEPLOY = {"stages": {"thinker": {"options": {"step_delay_ms": 2, "load_delay_ms": 600_000}}}}


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One toy worker with room for one session behind a gateway; voice sessions last 30 s, chats 10 s."""
    workdir = tmp_path_factory.mktemp("queue-estimates")
    worker = WorkerProcess("toy", workdir, capacity=1, deploy=TOY_DEPLOY)
    gateway = GatewayProcess([worker.address], workdir)
    with running(gateway, worker):
        worker.wait_state("IDLE", 120)
        gateway.wait_ready(60)
        baselines = {"voice": VOICE_S, "chat": CHAT_S}
        assert gateway.admin("PUT", "/eta", json={"baselines": baselines}).status_code == 200
        yield gateway


@pytest.fixture(scope="module")
def loading(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway whose only worker takes ten minutes to load its models (it answers /health LOADING meanwhile)."""
    workdir = tmp_path_factory.mktemp("queue-starting")
    worker = WorkerProcess("toy", workdir, capacity=1, deploy=SLOW_LOAD_DEPLOY)
    gateway = GatewayProcess([worker.address], workdir)
    with running(gateway, worker):
        worker.wait_state("LOADING", 120)
        gateway.wait_ready(60, serving=False)
        wait_for(lambda: gateway.worker_states() == {worker.address: "LOADING"}, 60,
                 "the gateway saw the worker LOADING", detail=gateway.worker_states)
        yield gateway
        # still loading: the worker and its stages would only stop on SIGINT once the load has ended
        loader = psutil.Process(worker.process.pid)
        for process in [*loader.children(recursive=True), loader]:
            process.kill()


def receive(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(ws.recv(timeout=60))


def queue_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The ``event: queue`` payloads of a chat SSE stream, then stops at the first worker chunk."""
    event = None
    for line in lines:
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            if event != "queue":
                return
            yield json.loads(line[5:])
            event = None


def test_a_waiter_behind_a_long_session_is_told_what_is_left_of_it(one_slot: GatewayProcess) -> None:
    gateway = one_slot
    body = {"model": "toy", "messages": [{"role": "user", "content": "abc"}], "stream": True}
    opened = time.monotonic()  # the gateway starts the voice session after this ...
    with connect(gateway.ws_url, max_size=None, open_timeout=30) as voice:
        assert receive(voice)["position"] == 0
        assert receive(voice)["type"] == "queue_done"
        served = time.monotonic()  # ... and before this
        time.sleep(1.5)  # stays: the voice session runs on, so less than its 30 s are left
        asked = time.monotonic()
        with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=60,
                          headers={"X-Omnipipe-Queue-Events": "1"}) as chat:
            lines = chat.iter_lines()
            chat_events = queue_events(lines)
            queued = next(chat_events)
            told = time.monotonic()
            assert (queued["type"], queued["position"], queued["starting"]) == ("queued", 1, False), queued
            # what is left of the voice session, as the gateway saw it between `asked` and `told`
            assert VOICE_S - (told - opened) - ROUNDING <= queued["estimated_wait_s"] \
                <= VOICE_S - (asked - served) + ROUNDING, (queued, told - opened, asked - served)

            behind_asked = time.monotonic()
            with connect(gateway.ws_url, max_size=None, open_timeout=30) as behind:
                second = receive(behind)
                behind_told = time.monotonic()
                assert (second["type"], second["position"]) == ("queued", 2), second
                # the voice session's rest, then the chat queued ahead of it (10 s: a chat, not a voice session)
                assert VOICE_S + CHAT_S - (behind_told - opened) - ROUNDING <= second["estimated_wait_s"] \
                    <= VOICE_S + CHAT_S - (behind_asked - served) + ROUNDING, second

                voice.close()  # the chat is served; the voice session behind it now waits for the chat only
                update = receive(behind)
                while update["type"] == "queue_update" and update["position"] != 1:
                    update = receive(behind)
                assert update["type"] == "queue_update", update
                assert 0.0 <= update["estimated_wait_s"] <= CHAT_S + ROUNDING, update
                assert [e["type"] for e in chat_events] == ["queue_done"]
                assert "[DONE]" in "".join(lines)  # the chat was answered


def test_a_gateway_whose_worker_is_loading_says_the_service_is_starting(loading: GatewayProcess) -> None:
    gateway = loading
    assert httpx.get(f"{gateway.url}/api/queue", timeout=10).json()["starting"] is True
    with connect(gateway.ws_url, max_size=None, open_timeout=30) as ws:
        queued = receive(ws)
        assert (queued["type"], queued["position"], queued["starting"]) == ("queued", 1, True), queued
        assert queued["estimated_wait_s"] is None
        body = {"model": "toy", "messages": [{"role": "user", "content": "x"}], "stream": True}
        with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=60,
                          headers={"X-Omnipipe-Queue-Events": "1"}) as chat:
            second = next(queue_events(chat.iter_lines()))
        assert (second["position"], second["starting"], second["estimated_wait_s"]) == (2, True, None), second
        (listed,) = [t for t in gateway.admin("GET", "/queue").json() if t["ticket_id"] == queued["ticket_id"]]
        assert listed["starting"] is True and listed["estimated_wait_s"] is None
