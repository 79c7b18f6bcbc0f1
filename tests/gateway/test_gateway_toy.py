"""The gateway in front of two real toy workers (capacity 1 each): queue positions and FIFO service over
WebSocket and HTTP, queue events, queue full, cancel, admin API, app switches, recordings, the Responses API's stored
responses found on the worker that made them, and a worker killed mid-session."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.gateway.conftest import GatewayProcess, WorkerProcess, running
from tests.gateway.realtime_clients import check_fifo, kill_one_of_two, six_on_two_slots
from tests.server.conftest import TOY_DEPLOY
from tests.waiting import wait_for

# the toy thinker copies its prompt, one character per 2 ms step: this answer lasts about 2 s
LONG_QUESTION = " ".join(f"word{i}" for i in range(150))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, list[WorkerProcess]]]:
    workdir = tmp_path_factory.mktemp("gateway-toy")
    workers = [WorkerProcess("toy", workdir, capacity=1, deploy=TOY_DEPLOY) for _ in range(2)]
    gateway = GatewayProcess([w.address for w in workers], workdir, extra=["--max-queue", "6"])
    with running(gateway, *workers):
        for worker in workers:
            worker.wait_state("IDLE", 120)
        gateway.wait_ready(60)
        yield gateway, workers


def open_ws(url: str) -> ClientConnection:
    """A connection the test closes itself (several stay open at once)."""
    return connect(url, max_size=None, open_timeout=30).__enter__()


def _idle(gateway: GatewayProcess, timeout_s: float = 30) -> None:
    """Wait until no session holds a worker, every online worker reports IDLE, and nobody waits."""
    def idle() -> bool:
        online = [w for w in gateway.admin("GET", "/workers").json() if w["online"]]
        return all(w["active_sessions"] == 0 and w["state"] == "IDLE" for w in online) and \
            not gateway.admin("GET", "/queue").json()

    wait_for(idle, timeout_s, "the gateway idle", detail=lambda: gateway.admin("GET", "/workers").json())


# ---------------------------------------------------------------------------------------------- queue
def test_six_sessions_on_two_slots_get_positions_in_arrival_order_and_are_served_fifo(cluster) -> None:
    gateway, workers = cluster
    _idle(gateway)
    clients = asyncio.run(six_on_two_slots(gateway.ws_url, LONG_QUESTION[:200], "hello", ["text"]))
    check_fifo(clients)
    assert {c.done["worker"] for c in clients} == {w.address for w in workers}
    _idle(gateway)


def _hold_both_workers(gateway: GatewayProcess) -> list:
    """Two realtime sessions that occupy both workers until closed."""
    return _hold_workers(gateway, 2)


def _hold_workers(gateway: GatewayProcess, count: int) -> list:
    """``count`` realtime sessions that occupy as many single-slot workers until closed."""
    held = []
    for _ in range(count):
        ws = open_ws(gateway.ws_url)
        first = json.loads(ws.recv(timeout=30))
        assert first["type"] == "queued" and first["position"] == 0, first
        assert json.loads(ws.recv(timeout=30))["type"] == "queue_done"
        held.append(ws)
    return held


def test_http_request_waits_in_queue_with_sse_queue_events(cluster) -> None:
    gateway, _ = cluster
    _idle(gateway)
    held = _hold_both_workers(gateway)
    body = {"model": "toy", "messages": [{"role": "user", "content": "abc"}], "stream": True}
    events: list[tuple[str | None, str]] = []
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=60,
                      headers={"X-Omnipipe-Queue-Events": "1"}) as response:
        assert response.status_code == 200
        session_id = response.headers["x-omnipipe-session-id"]
        event = None
        for line in response.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                events.append((event, line[5:].strip()))
                event = None
                if events[0][0] == "queue" and len(events) == 1:
                    queued = json.loads(events[0][1])
                    assert queued["type"] == "queued" and queued["position"] == 1, queued
                    held.pop().close()  # a worker frees up: this request is next
    kinds = [json.loads(data)["type"] for event, data in events if event == "queue"]
    assert kinds[0] == "queued" and kinds[-1] == "queue_done"
    chunks = [json.loads(data) for event, data in events if event is None and data != "[DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    assert text == "ABC"  # the toy thinker answers its prompt in capitals
    assert events[-1] == (None, "[DONE]")
    for ws in held:
        ws.close()
    _idle(gateway)
    recorded = httpx.get(f"{gateway.url}/api/sessions/{session_id}", timeout=10).json()
    assert recorded["meta"]["type"] == "chat"


def test_openai_client_through_the_gateway_is_recorded(cluster) -> None:
    gateway, _ = cluster
    _idle(gateway)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="toy", messages=[{"role": "user",
                                                                                  "content": "hello gateway"}])
    completion = raw.parse()
    assert completion.choices[0].message.content == "HELLO GATEWAY"
    session_id = raw.headers["x-omnipipe-session-id"]
    assert raw.headers["x-omnipipe-worker"] in {w["address"] for w in gateway.admin("GET", "/workers").json()}
    stream = client.chat.completions.create(model="toy", stream=True,
                                            messages=[{"role": "user", "content": "streamed"}])
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "STREAMED"
    # a second turn of the same chat session goes into the same recording
    again = httpx.post(f"{gateway.url}/v1/chat/completions", headers={"X-Omnipipe-Session-Id": session_id},
                       json={"model": "toy", "messages": [{"role": "user", "content": "second turn"}]}, timeout=60)
    assert again.status_code == 200 and again.headers["x-omnipipe-session-id"] == session_id
    def two_turns() -> list[dict]:
        turns = httpx.get(f"{gateway.url}/api/sessions/{session_id}", timeout=10).json()["recording"].get("turns", [])
        return turns if len(turns) == 2 else []

    turns = wait_for(two_turns, 10, "both turns recorded")
    assert [t["user_text"] for t in turns] == ["hello gateway", "second turn"]
    assert [t["assistant_text"] for t in turns] == ["HELLO GATEWAY", "SECOND TURN"]
    bad = httpx.post(f"{gateway.url}/v1/chat/completions", headers={"X-Omnipipe-Session-Id": "../etc"},
                     json={"model": "toy", "messages": [{"role": "user", "content": "x"}]}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Omnipipe-Session-Id"


def test_models_say_what_they_take_and_only_served_sessions_are_recorded(cluster) -> None:
    """``/v1/models`` (from a worker, through the gateway) lists each model's input and output modalities; a
    request the worker refuses (404 unknown model) or a route that does not exist leaves no recording."""
    gateway, _ = cluster
    _idle(gateway)
    models = {m["id"]: m for m in httpx.get(f"{gateway.url}/v1/models", timeout=10).json()["data"]}
    assert models["toy"]["input_modalities"] == ["text"]
    assert models["toy"]["output_modalities"] == ["audio", "text"]
    assert models["toy_tts"]["output_modalities"] == ["audio"]
    assert models["toy"]["conversation"] is False  # the toy family answers one question at a time
    one = httpx.get(f"{gateway.url}/v1/models/toy", timeout=10)
    assert one.status_code == 200 and one.json()["id"] == "toy"
    assert httpx.get(f"{gateway.url}/v1/models/nope", timeout=10).status_code == 404
    voices = httpx.get(f"{gateway.url}/v1/audio/voices", params={"model": "toy"}, timeout=10)
    assert voices.status_code == 200 and "default" in [v["id"] for v in voices.json()["voices"]], voices.text
    before = {r["session_id"] for r in gateway.admin("GET", "/recordings").json()}
    refused = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=60,
                         json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    streamed = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=60, headers={"X-Omnipipe-Queue-Events": "1"},
                          json={"model": "nope", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    assert "model_not_found" in streamed.text
    assert httpx.get(f"{gateway.url}/v1/nothing", timeout=10).status_code == 404
    served = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=60,
                        json={"model": "toy", "messages": [{"role": "user", "content": "kept"}]})
    assert served.status_code == 200
    _idle(gateway)

    def new_recordings() -> set[str]:  # the recording writes run on the gateway's threads
        return {r["session_id"] for r in gateway.admin("GET", "/recordings").json()} - before

    wait_for(lambda: served.headers["x-omnipipe-session-id"] in new_recordings(), 10, "the served session recorded")
    assert new_recordings() == {served.headers["x-omnipipe-session-id"]}
    assert httpx.get(f"{gateway.url}/api/sessions/{refused.headers['x-omnipipe-session-id']}",
                     timeout=10).status_code == 404


def test_queue_full_answers_503_and_websocket_error(cluster) -> None:
    gateway, _ = cluster
    _idle(gateway)
    held = _hold_both_workers(gateway)
    waiting = []
    try:
        for _ in range(6):  # --max-queue 6
            ws = open_ws(gateway.ws_url)
            assert json.loads(ws.recv(timeout=30))["type"] == "queued"
            waiting.append(ws)
        response = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=30,
                              json={"model": "toy", "messages": [{"role": "user", "content": "x"}]})
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "queue_full" and int(response.headers["retry-after"]) >= 1
        with connect(gateway.ws_url, max_size=None, open_timeout=30) as ws:
            event = json.loads(ws.recv(timeout=30))
            assert event["type"] == "error" and event["error"]["code"] == "queue_full", event
            with pytest.raises(Exception):  # noqa: B017 - whatever the client raises once the gateway closed
                ws.recv(timeout=30)
            assert ws.close_code == 1013
    finally:
        for ws in [*waiting, *held]:
            ws.close()
    _idle(gateway)


def test_leaving_or_cancelling_a_queued_place_frees_it(cluster) -> None:
    gateway, _ = cluster
    _idle(gateway)
    held = _hold_both_workers(gateway)
    try:
        first = open_ws(gateway.ws_url)
        ticket = json.loads(first.recv(timeout=30))["ticket_id"]
        second = open_ws(gateway.ws_url)
        assert json.loads(second.recv(timeout=30))["position"] == 2
        assert [t["ticket_id"] for t in gateway.admin("GET", "/queue").json()][0] == ticket
        cancelled = httpx.delete(f"{gateway.url}/api/queue/{ticket}", timeout=10)
        assert cancelled.status_code == 200
        event = json.loads(first.recv(timeout=30))
        assert event["type"] == "error" and event["error"]["code"] == "queue_cancelled", event
        update = json.loads(second.recv(timeout=30))
        assert update["type"] == "queue_update" and update["position"] == 1, update
        second.close()  # leaving while queued gives the place back
        wait_for(lambda: gateway.admin("GET", "/queue").json() == [], 10, "the queue emptied")
        assert httpx.delete(f"{gateway.url}/api/queue/{ticket}", timeout=10).status_code == 404
    finally:
        for ws in held:
            ws.close()
    _idle(gateway)


def test_events_sent_while_queued_are_forwarded_in_order_once_served(cluster) -> None:
    gateway, _ = cluster
    _idle(gateway)
    held = _hold_both_workers(gateway)
    with connect(gateway.ws_url, max_size=None, open_timeout=30) as ws:
        assert json.loads(ws.recv(timeout=30))["position"] == 1
        ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "held"}]}}))
        ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
        held.pop().close()
        types, text = [], ""
        while True:
            event = json.loads(ws.recv(timeout=60))
            types.append(event["type"])
            if event["type"] == "response.output_text.delta":
                text += event["delta"]
            if event["type"] in ("response.done", "error"):
                break
        assert types[:3] == ["queue_done", "session.created", "conversation.item.added"], types
        assert types[-1] == "response.done" and text == "HELD"
    for other in held:
        other.close()
    _idle(gateway)


def _queued_chat_after(gateway: GatewayProcess, action: Callable[[], None]) -> httpx.Response:
    """Send a plain chat request that has to wait (every worker is held), run ``action`` once it is in the
    queue, and return the response the client got."""
    with httpx.Client(timeout=60) as client:
        result: dict[str, httpx.Response] = {}
        waiting = threading.Thread(target=lambda: result.setdefault("r", client.post(
            f"{gateway.url}/v1/chat/completions", json={"model": "toy", "messages": [
                {"role": "user", "content": "x"}]})))
        waiting.start()
        wait_for(lambda: gateway.admin("GET", "/queue").json(), 30, "the request queued")
        action()
        waiting.join(30)
    return result["r"]


def test_a_cancelled_plain_request_gets_queue_cancelled(cluster) -> None:
    gateway, _ = cluster
    _idle(gateway)
    held = _hold_both_workers(gateway)
    try:
        def cancel_its_ticket() -> None:
            ticket = gateway.admin("GET", "/queue").json()[0]["ticket_id"]
            assert gateway.admin("DELETE", f"/queue/{ticket}").status_code == 200

        response = _queued_chat_after(gateway, cancel_its_ticket)
        assert response.status_code == 503 and response.json()["error"]["code"] == "queue_cancelled", response.text
    finally:
        for ws in held:
            ws.close()
    _idle(gateway)


def test_a_client_flooding_while_queued_is_cut_off(cluster) -> None:
    gateway, _ = cluster
    _idle(gateway)
    held = _hold_both_workers(gateway)
    try:
        with connect(gateway.ws_url, max_size=None, open_timeout=30) as ws:
            assert json.loads(ws.recv(timeout=30))["position"] == 1
            chunk = "x" * (1 << 20)
            # the gateway closes after the 4 MiB it holds for a queued client
            with pytest.raises(Exception):  # noqa: B017 - whatever the client raises on the closed socket
                for _ in range(64):
                    ws.send(chunk)
                ws.recv(timeout=30)
                ws.recv(timeout=30)
            assert ws.close_code == 1009
    finally:
        for ws in held:
            ws.close()
    _idle(gateway)


def test_proxied_headers_are_not_doubled_and_gateway_headers_are_added(cluster) -> None:
    gateway, workers = cluster
    _idle(gateway)
    response = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=60, headers={"X-Admin-Token": "secret"},
                          json={"model": "toy", "messages": [{"role": "user", "content": "hdr"}]})
    assert response.status_code == 200
    names = [k.lower() for k, _ in response.headers.multi_items()]
    assert names.count("date") == 1 and names.count("server") == 1 and names.count("content-type") == 1, names
    assert response.headers["x-omnipipe-worker"] in {w.address for w in workers}


# ---------------------------------------------------------------------------------------------- admin
ADMIN_ROUTES = [("GET", "/workers"), ("GET", "/queue"), ("DELETE", "/queue/abc"), ("GET", "/sessions"),
                ("GET", "/recordings"), ("GET", "/eta"), ("PUT", "/eta"), ("GET", "/apps"), ("PUT", "/apps"),
                ("POST", "/cleanup")]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-token-123"}, {"X-Admin-Token": "nope"},
                                     {"Authorization": "Basic Z2F0ZXdheQ=="}])
def test_admin_routes_refuse_without_the_token(cluster, headers: dict[str, str]) -> None:
    gateway, _ = cluster
    for method, path in ADMIN_ROUTES:
        response = httpx.request(method, f"{gateway.url}/api/admin{path}", headers=headers, json={}, timeout=10)
        assert response.status_code == 401, (method, path, response.text)
        assert response.json()["error"]["code"].startswith("admin_token")


def test_admin_api_with_the_token(cluster) -> None:
    gateway, workers = cluster
    _idle(gateway)
    listed = gateway.admin("GET", "/workers").json()
    assert {w["address"] for w in listed} == {w.address for w in workers}
    assert all(w["state"] == "IDLE" and w["capacity"] == 1 and w["online"] for w in listed)
    assert gateway.admin("PUT", "/eta", json={"baselines": {"voice": 42}}).json()["voice"]["baseline_s"] == 42
    bad = gateway.admin("PUT", "/eta", json={"baselines": {"voice": -1}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "baselines.voice"
    assert gateway.admin("PUT", "/eta", json={"baselines": {"video": 1}}).status_code == 400
    assert gateway.admin("PUT", "/apps", json={"chat": "no"}).json()["error"]["param"] == "chat"
    report = gateway.admin("POST", "/cleanup").json()
    assert {"scanned", "deleted_by_age", "deleted_by_size", "remaining", "errors"} <= set(report)
    assert gateway.admin("GET", "/recordings").status_code == 200


def test_disabled_apps_are_refused(cluster) -> None:
    gateway, _ = cluster
    try:
        assert gateway.admin("PUT", "/apps", json={"chat": False, "voice": False}).json()["chat"] is False
        response = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=10,
                              json={"model": "toy", "messages": [{"role": "user", "content": "x"}]})
        assert response.status_code == 403 and response.json()["error"]["code"] == "app_disabled"
        with connect(gateway.ws_url, open_timeout=30) as ws:
            event = json.loads(ws.recv(timeout=30))
            assert event["type"] == "error" and event["error"]["code"] == "app_disabled"
    finally:
        gateway.admin("PUT", "/apps", json={"chat": True, "voice": True})


# ---------------------------------------------------------------------------------------------- a worker dies
def test_stored_responses_are_found_on_the_worker_that_made_them(cluster) -> None:
    """The Responses API: responses are made by whichever worker the queue picks, and each stored one is found
    again (``GET``, ``DELETE``, a follow-up's ``previous_response_id``) on the worker that made it."""
    gateway, workers = cluster
    _idle(gateway)
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        made: dict[str, str] = {}
        for n in range(4):
            reply = http.post("/v1/responses", json={"model": "toy", "input": f"hello {n}"})
            assert reply.status_code == 200, reply.text
            assert reply.json()["output"][0]["type"] == "message"
            made[reply.json()["id"]] = reply.headers["X-Omnipipe-Worker"]
        assert set(made.values()) == {w.address for w in workers}  # both workers made some
        for response_id in made:
            got = http.get(f"/v1/responses/{response_id}")
            assert got.status_code == 200 and got.json()["id"] == response_id
            # a follow-up reaches the worker holding it: the toy pipeline refuses earlier turns (not a 404)
            follow_up = http.post("/v1/responses", json={"model": "toy", "input": "and then?",
                                                         "previous_response_id": response_id})
            assert follow_up.status_code == 400, follow_up.text
            assert follow_up.json()["error"]["param"] == "previous_response_id"
            assert follow_up.headers["X-Omnipipe-Worker"] == made[response_id]
            deleted = http.delete(f"/v1/responses/{response_id}")
            assert deleted.json() == {"id": response_id, "object": "response", "deleted": True}
            gone = http.get(f"/v1/responses/{response_id}")
            assert gone.status_code == 404 and gone.json()["error"]["param"] == "response_id"
        unknown = http.post("/v1/responses", json={"model": "toy", "input": "hi", "previous_response_id": "resp_x"})
        assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "previous_response_id"
        streamed = http.post("/v1/responses", json={"model": "toy", "input": "hi", "stream": True})
        assert streamed.status_code == 200
        assert "event: response.completed" in streamed.text


def test_killing_a_worker_mid_session_fails_only_its_client(cluster) -> None:
    gateway, workers = cluster
    _idle(gateway)

    def kill(address: str) -> None:
        os.kill(next(w for w in workers if w.address == address).process.pid, signal.SIGKILL)

    a, b = asyncio.run(kill_one_of_two(gateway.ws_url, LONG_QUESTION[:300], kill))
    victim = a.done["worker"]
    # requests sent at once, before any health check ran, are not lost to the dead worker
    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(6) as threads:
        answers = list(threads.map(lambda i: client.post(f"{gateway.url}/v1/chat/completions", json={
            "model": "toy", "messages": [{"role": "user", "content": f"after {i}"}]}), range(6)))
    assert [r.status_code for r in answers] == [200] * 6, [(r.status_code, r.text[:300]) for r in answers]
    assert a.error is not None and a.error["code"] == "worker_failed", a.error
    assert a.close_code == 1011
    assert b.error is None and b.answer.startswith("WORD0") and b.audio_deltas > 0, \
        (b.error, b.answer[:80], b.audio_deltas)
    wait_for(lambda: gateway.worker_states()[victim] == "OFFLINE", 20, "the killed worker OFFLINE")
    # new work goes to the survivor
    response = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=60,
                          json={"model": "toy", "messages": [{"role": "user", "content": "still here"}]})
    assert response.status_code == 200 and response.headers["x-omnipipe-worker"] != victim



def test_clients_queued_when_the_gateway_stops_get_queue_cancelled(cluster, tmp_path) -> None:
    """A second gateway in front of the same workers is stopped while a plain request waits in its queue: the
    client gets the OpenAI error object (503 queue_cancelled), not a cut connection or a bare 500."""
    _, workers = cluster
    live = [w for w in workers if w.process.poll() is None]  # an earlier test of this module kills one
    for worker in live:
        worker.wait_state("IDLE", 60)
    second = GatewayProcess([w.address for w in live], tmp_path)
    try:
        second.wait_ready(60)
        held = _hold_workers(second, len(live))
        try:
            response = _queued_chat_after(second, lambda: second.process.send_signal(signal.SIGTERM))
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "queue_cancelled", response.text
        finally:
            for ws in held:
                with contextlib.suppress(Exception):
                    ws.close()
    finally:
        second.stop()
    assert "told 1 queued client(s)" in second.log_path.read_text()


def test_a_chat_answered_before_the_gateway_stops_is_recorded_as_completed(cluster, tmp_path) -> None:
    _, workers = cluster
    live = [w for w in workers if w.process.poll() is None]
    for worker in live:
        worker.wait_state("IDLE", 60)
    gateway = GatewayProcess([w.address for w in live], tmp_path)
    try:
        gateway.wait_ready(60)
        answered = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=60,
                              json={"model": "toy", "messages": [{"role": "user", "content": "done"}]})
        assert answered.status_code == 200
    finally:
        gateway.stop()  # the chat session is still open (idle) when the gateway stops
    meta_path = gateway.data_dir / "sessions" / answered.headers["x-omnipipe-session-id"] / "meta.json"
    meta = json.loads(meta_path.read_text())
    assert (meta["status"], meta["error"]) == ("completed", None), meta


def test_the_realtime_dialect_asked_for_reaches_the_worker(cluster) -> None:
    """Through the gateway, a client that asks for beta (header, or the subprotocol a browser can send) gets beta;
    any other gets GA."""
    gateway, _ = cluster
    _idle(gateway)
    for kwargs, beta in (({}, False), ({"additional_headers": {"OpenAI-Beta": "realtime=v1"}}, True),
                         ({"subprotocols": ["openai-beta.realtime-v1"]}, True),
                         ({"subprotocols": ["realtime"]}, False)):
        with connect(gateway.ws_url, max_size=None, open_timeout=30, **kwargs) as ws:  # type: ignore[arg-type]
            assert ws.subprotocol == (kwargs.get("subprotocols") or [None])[0]
            while (event := json.loads(ws.recv(timeout=60)))["type"] != "session.created":
                assert event["type"] in ("queued", "queue_update", "queue_done"), event
            assert ("modalities" in event["session"]) == beta, (kwargs, event)
            assert (event["session"].get("type") == "realtime") == (not beta), (kwargs, event)
    _idle(gateway)
