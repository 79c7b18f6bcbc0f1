"""The gateway in front of two real default-pipeline workers (capacity 1 each): six realtime sessions queue up
and are served in arrival order with spoken answers.
(Killing a worker mid-answer is checked on toy workers: tests/gateway/test_gateway_toy.py.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest

from tests.gateway.conftest import GatewayProcess, WorkerProcess, running
from tests.gateway.realtime_clients import check_fifo, six_on_two_slots
from tests.server.conftest import DEFAULT_DEPLOY
from tests.waiting import wait_for

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, list[WorkerProcess]]]:
    workdir = tmp_path_factory.mktemp("gateway-default")
    workers = [WorkerProcess("default", workdir, capacity=1, deploy=DEFAULT_DEPLOY) for _ in range(2)]
    gateway = GatewayProcess([w.address for w in workers], workdir)
    with running(gateway, *workers):
        for worker in workers:
            worker.wait_state("IDLE", 600)
        gateway.wait_ready(60)
        yield gateway, workers


def test_workers_say_ready_only_once_their_transcription_companion_is_ready(cluster) -> None:
    """Each worker starts its asr pipeline with it and reports IDLE (the fixture waited for it) only once asr has
    loaded too: the first spoken turn's transcript never waits for a cold start."""
    _, workers = cluster
    for worker in workers:
        health = httpx.get(f"http://{worker.address}/health", timeout=30)
        assert health.status_code == 200
        assert health.json()["companions"]["transcription"] == {"pipeline": "asr", "status": "ready",
                                                                 "preloaded": True}
        engines = httpx.get(f"http://{worker.address}/debug/state", timeout=30).json()["engines"]
        assert engines["asr"]["status"] == "ready", engines["asr"]
        assert engines["tts"]["status"] == "idle"  # the speech companion still starts on first use


def test_six_voice_sessions_on_two_workers_are_served_in_arrival_order(cluster) -> None:
    gateway, workers = cluster
    clients = asyncio.run(six_on_two_slots(gateway.ws_url, "What is the capital of France?",
                                           "Name a color.", ["text", "audio"]))
    check_fifo(clients)
    assert "paris" in clients[0].answer.lower(), clients[0].answer
    assert all(c.audio_deltas > 0 for c in clients)
    assert {c.done["worker"] for c in clients} == {w.address for w in workers}
    # every session was recorded with its spoken answer
    recording = httpx.get(f"{gateway.url}/api/sessions/{clients[0].done['session_id']}", timeout=10).json()
    assert recording["meta"]["type"] == "voice"
    assert any(f.startswith("ai_audio/") for f in recording["files"]), recording["files"]


def _recorded_text(gateway: GatewayProcess, session_id: str) -> str:
    """The transcript recorded in a transcription session's turn, once the session is written."""
    def completed_turn() -> dict | None:
        reply = httpx.get(f"{gateway.url}/api/sessions/{session_id}", timeout=10)
        turns = reply.json()["recording"]["turns"] if reply.status_code == 200 else []
        return turns[0] if turns and turns[0]["status"] == "completed" else None

    return wait_for(completed_turn, 30, f"session {session_id} recorded a completed turn")["assistant_text"]


def test_a_transcription_in_every_format_is_recorded_with_its_words(cluster) -> None:
    """json, text, verbose_json, srt, vtt and the stream (stream=true) through the gateway: each recording holds the
    transcript's words, the same for every format (no cue numbers, timings or SSE framing)."""
    gateway, workers = cluster
    spoken = httpx.post(f"http://{workers[0].address}/v1/audio/speech", timeout=300, json={
        "model": "tts", "input": "The quick brown fox jumps over the lazy dog.", "voice": "default",
        "response_format": "wav"})
    assert spoken.status_code == 200, spoken.text
    answers: dict[str, str] = {}
    recorded: dict[str, str] = {}
    for name, form in [("json", {}), ("text", {}), ("verbose_json", {}), ("srt", {}), ("vtt", {}),
                       ("stream", {"stream": "true"})]:
        data = {"model": "asr", "response_format": "json" if name == "stream" else name, **form}
        reply = httpx.post(f"{gateway.url}/v1/audio/transcriptions", data=data, timeout=300,
                           files={"file": ("fox.wav", spoken.content, "audio/wav")})
        assert reply.status_code == 200, (name, reply.text)
        answers[name] = reply.text
        recorded[name] = _recorded_text(gateway, reply.headers["x-omnipipe-session-id"])
    words = json.loads(answers["json"])["text"]
    assert "fox" in words.lower(), words
    assert "-->" in answers["srt"] and answers["vtt"].startswith("WEBVTT"), answers
    assert "transcript.text.done" in answers["stream"], answers["stream"]
    assert recorded == dict.fromkeys(recorded, words), recorded

