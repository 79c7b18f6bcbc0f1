"""Streaming clients that go away mid-answer leave nothing behind in any stage."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.server.conftest import ServerProcess, engines_idle

LONG_QUESTION = " ".join(f"word{i}" for i in range(60))


def disconnect_after(server: ServerProcess, kind: str, events_to_read: int) -> int:
    """Open a stream, read ``events_to_read`` pieces, then drop the connection; return how many were read."""
    if kind == "chat":
        path, body = "/v1/chat/completions", {
            "model": "toy", "messages": [{"role": "user", "content": LONG_QUESTION}], "max_tokens": 500,
            "stream": True, "modalities": ["text", "audio"], "audio": {"voice": "default", "format": "pcm16"}}
    else:
        path, body = "/v1/audio/speech", {"model": "toy", "input": LONG_QUESTION, "response_format": "pcm"}
    read = 0
    with (httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as http,
          http.stream("POST", path, json=body) as response):
        assert response.status_code == 200
        pieces = response.iter_lines() if kind == "chat" else response.iter_raw(256)
        for _ in pieces:
            if read >= events_to_read:
                break
            read += 1
    return read


def test_ten_clients_disconnecting_at_random_points_leave_no_state(toy_server: ServerProcess) -> None:
    rng = random.Random(1234)
    plans = [("chat" if i % 3 else "speech", rng.choice([0, 1, 2, 5, 10, 25, 60])) for i in range(10)]
    with ThreadPoolExecutor(max_workers=10) as pool:
        reads = list(pool.map(lambda plan: disconnect_after(toy_server, *plan), plans))
    assert len(reads) == 10
    state = toy_server.wait_idle(timeout_s=30)
    assert engines_idle(state), state
    # and the server still answers in full
    with toy_server.client() as http:
        response = http.post("/v1/chat/completions", json={
            "model": "toy", "messages": [{"role": "user", "content": "still here"}], "max_tokens": 50})
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "STILL HERE"


def test_disconnect_during_every_phase_of_one_stream(toy_server: ServerProcess) -> None:
    for events in (0, 3, 30, 200):
        disconnect_after(toy_server, "chat", events)
        state = toy_server.wait_idle(timeout_s=30)
        assert engines_idle(state), (events, state)


def test_a_client_that_leaves_a_whole_answer_aborts_it(toy_server: ServerProcess) -> None:
    """Non-streamed: the server sends nothing until the answer is complete, so only the watch on the connection
    can notice the client leaving. This answer takes ~20 s (the toy thinker spends 2 ms per character); the
    client gives up after 1 s, and every stage must be idle long before the answer would have been done."""
    question = "x" * 10_000
    body = {"model": "toy", "messages": [{"role": "user", "content": question}], "max_tokens": 20_000,
            "modalities": ["text"]}
    with httpx.Client(base_url=toy_server.url, headers=toy_server.headers, timeout=1.0) as http:
        try:
            http.post("/v1/chat/completions", json=body)
        except httpx.ReadTimeout:
            pass
        else:
            raise AssertionError("the answer came back within 1 s: the test needs a longer answer")
    state = toy_server.wait_idle(timeout_s=8)
    assert engines_idle(state), state
