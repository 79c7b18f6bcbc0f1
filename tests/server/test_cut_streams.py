"""A stream cut short by a stage death must look cut to the client: raw audio bodies end without their terminating
chunk (httpx and the openai client raise), SSE streams end with an error event (the openai client raises)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.server.conftest import ServerProcess, running_server
from tests.waiting import wait_for

pytestmark = pytest.mark.slow  # servers whose stages are killed mid-answer, each kind of stream

# slow vocoder and talker calls stretch a long answer over seconds, so a stage can be killed mid-stream; the
# vocoder is killed once per test, more often in a row than the default restart limit allows
SLOW_DEPLOY = {"stages": {"thinker": {"options": {"step_delay_ms": 20}},
                          "talker": {"options": {"call_delay_ms": 20}},
                          "code2wav": {"options": {"call_delay_ms": 40}, "max_restarts": 10}}}
LONG_INPUT = " ".join(f"word{i}" for i in range(80))


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server("toy", SLOW_DEPLOY, tmp_path_factory.mktemp("cut-streams"), 120) as server:
        yield server


def _current_pid(server: ServerProcess, pipeline: str, stage: str) -> int | None:
    state = httpx.get(f"{server.url}/debug/state", headers=server.headers, timeout=10).json()["engines"]
    pid = ((state.get(pipeline) or {}).get("state") or {}).get("pids", {}).get(stage)
    return int(pid) if pid else None


def stage_pid(server: ServerProcess, pipeline: str, stage: str, timeout_s: float = 30) -> int:
    return wait_for(lambda: _current_pid(server, pipeline, stage), timeout_s, f"a pid for {pipeline}/{stage}")


def wait_restarted(server: ServerProcess, pipeline: str, stage: str, old_pid: int, timeout_s: float = 60) -> None:
    wait_for(lambda: _current_pid(server, pipeline, stage) not in (None, old_pid), timeout_s,
             f"{pipeline}/{stage} came back", interval_s=0.2)


@pytest.mark.parametrize("response_format", ["pcm", "wav", "mp3"])
def test_raw_speech_cut_by_a_stage_death_raises_in_httpx(slow_server: ServerProcess, response_format: str) -> None:
    """The vocoder dies mid-answer (the toy talker turns the whole input into frames in one call, so only the
    vocoder is still at work when the audio streams); mp3 is encoded as it streams, so it is cut the same way."""
    victim = "code2wav"
    body = {"model": "toy_tts", "input": LONG_INPUT, "response_format": response_format}
    enough = 4096 if response_format in ("pcm", "wav") else 512  # 8 kHz mp3 is about 1 kB a second
    received = 0
    with httpx.Client(base_url=slow_server.url, headers=slow_server.headers, timeout=60) as http:
        http.post("/v1/audio/speech", json={**body, "input": "warm"}).raise_for_status()  # the companion is up
        pid = victim_pid = stage_pid(slow_server, "toy_tts", victim)
        with pytest.raises(httpx.RemoteProtocolError), http.stream("POST", "/v1/audio/speech", json=body) as response:
            assert response.status_code == 200
            for piece in response.iter_raw(1024):
                received += len(piece)
                if received >= enough and pid:
                    os.kill(pid, signal.SIGKILL)
                    pid = 0
    assert received >= enough
    wait_restarted(slow_server, "toy_tts", victim, old_pid=victim_pid)


def test_openai_client_raises_on_a_cut_speech_stream(slow_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{slow_server.url}/v1", api_key=slow_server.api_key or "unused", max_retries=0)
    client.audio.speech.create(model="toy_tts", input="warm", voice="default", response_format="pcm")  # companion up
    pid = stage_pid(slow_server, "toy_tts", "code2wav")
    # the openai client reads through its own HTTP stack: whatever it raises, it says the body was incomplete
    with (pytest.raises(Exception, match="incomplete chunked read"),
          client.audio.speech.with_streaming_response.create(model="toy_tts", input=LONG_INPUT, voice="default",
                                                             response_format="pcm") as response):
        for i, _ in enumerate(response.iter_bytes(1024)):
            if i == 2:
                os.kill(pid, signal.SIGKILL)
    wait_restarted(slow_server, "toy_tts", "code2wav", old_pid=pid)


def test_openai_client_raises_on_a_cut_chat_stream(slow_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{slow_server.url}/v1", api_key=slow_server.api_key or "unused", max_retries=0)
    pid = stage_pid(slow_server, "toy", "code2wav")
    chunks: list[Any] = []
    with pytest.raises(openai.APIError, match="code2wav"):
        stream = client.chat.completions.create(
            model="toy", messages=[{"role": "user", "content": LONG_INPUT}], max_tokens=400, stream=True,
            modalities=["text", "audio"], audio={"voice": "default", "format": "pcm16"})
        for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == 5:
                os.kill(pid, signal.SIGKILL)
    assert len(chunks) >= 5
    wait_restarted(slow_server, "toy", "code2wav", old_pid=pid)


def test_realtime_response_cut_by_a_stage_death_ends_failed(slow_server: ServerProcess) -> None:
    """Realtime: the response ends ``failed`` with an error event naming the stage (never ``completed`` with part of
    the audio), and the same session answers the next turn in full."""
    from tests.server.test_realtime import of, session

    pid = stage_pid(slow_server, "toy", "code2wav")
    with session(slow_server, beta=True) as conn:  # the beta dialect's event names
        conn.send("session.update", session={"turn_detection": None})
        conn.until("session.updated")
        conn.user_text(LONG_INPUT)
        conn.send("response.create")
        audio_deltas = 0
        events = []
        while True:
            _, event = conn.until("response.audio.delta", "response.done", "error")
            events.append(event)
            if event["type"] == "response.audio.delta":
                audio_deltas += 1
                if audio_deltas == 2:
                    os.kill(pid, signal.SIGKILL)
            elif event["type"] == "response.done":
                break
        done = events[-1]
        assert done["response"]["status"] == "failed", done
        errors = of(events, "error")
        assert errors and "code2wav" in errors[0]["error"]["message"], errors
        wait_restarted(slow_server, "toy", "code2wav", old_pid=pid)
        conn.user_text("after the cut")
        conn.send("response.create")
        turn, done = conn.until("response.done")
        assert done["response"]["status"] == "completed", done
        assert "".join(d["delta"] for d in of(turn, "response.audio_transcript.delta")) == "AFTER THE CUT"


def test_server_keeps_serving_after_the_cuts(slow_server: ServerProcess, tmp_path: Path) -> None:
    with httpx.Client(base_url=slow_server.url, headers=slow_server.headers, timeout=60) as http:
        response = http.post("/v1/audio/speech", json={"model": "toy_tts", "input": "fine", "response_format": "pcm"})
    assert response.status_code == 200 and len(response.content) > 0


def test_a_whole_answer_lost_with_its_stage_is_a_503_to_retry(slow_server: ServerProcess) -> None:
    """Non-streamed: nothing was sent yet when the vocoder dies, so the answer is a 503 (the stage is being
    replaced; Retry-After says when to try again) naming the stage, not a 500; the retry is answered in full."""
    import threading

    pid = stage_pid(slow_server, "toy", "code2wav")
    body = {"model": "toy", "messages": [{"role": "user", "content": LONG_INPUT}], "max_tokens": 400,
            "modalities": ["text", "audio"], "audio": {"voice": "default", "format": "wav"}}
    killer = threading.Timer(1.5, os.kill, (pid, signal.SIGKILL))
    killer.start()
    try:
        with httpx.Client(base_url=slow_server.url, headers=slow_server.headers, timeout=120) as http:
            lost = http.post("/v1/chat/completions", json=body)
    finally:
        killer.join()
    assert lost.status_code == 503, lost.text
    error = lost.json()["error"]
    assert error["code"] == "stage_unavailable" and "code2wav" in error["message"], error
    assert int(lost.headers["retry-after"]) >= 1
    wait_restarted(slow_server, "toy", "code2wav", old_pid=pid)
    with httpx.Client(base_url=slow_server.url, headers=slow_server.headers, timeout=120) as http:
        again = http.post("/v1/chat/completions", json={**body, "max_tokens": 20})
    assert again.status_code == 200, again.text
