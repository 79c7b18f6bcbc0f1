"""``WS /v1/realtime`` through the ``websockets`` client: sessions, text and spoken turns, bad events, cancel and
barge-in. The energy VAD is checked on its own first."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from omnipipe.server.vad import EnergyVAD
from tests.server.conftest import ServerProcess, engines_idle

RECV_TIMEOUT_S = 120
RATE = 24_000
# the toy thinker copies its prompt one character per 2 ms step: about 1000 characters last seconds
LONG_TEXT = " ".join(f"word{i}" for i in range(150))


# ---------------------------------------------------------------------------------------------- helpers
def ws_url(server: ServerProcess) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime"


@contextmanager
def session(server: ServerProcess, headers: dict[str, str] | None = None) -> Iterator[ClientConnection]:
    with connect(ws_url(server), additional_headers=server.headers if headers is None else headers,
                 max_size=None, open_timeout=60) as ws:
        created = recv(ws)
        assert created["type"] == "session.created", created
        yield ws


def send(ws: ClientConnection, type_: str, **fields: Any) -> None:
    ws.send(json.dumps({"type": type_, **fields}))


def recv(ws: ClientConnection) -> dict[str, Any]:
    event = json.loads(ws.recv(timeout=RECV_TIMEOUT_S))
    assert isinstance(event.get("event_id"), str) and event["event_id"], event
    return event


def until(ws: ClientConnection, *types: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Read events until one of ``types``; return the ones before it and it."""
    seen = []
    while True:
        event = recv(ws)
        if event["type"] in types:
            return seen, event
        seen.append(event)


def of(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type_]


def pcm16_b64(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


def tone(seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def user_text(ws: ClientConnection, text: str) -> dict[str, Any]:
    send(ws, "conversation.item.create",
         item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    _, created = until(ws, "conversation.item.created", "error")
    return created


def no_vad(ws: ClientConnection, **session: Any) -> dict[str, Any]:
    send(ws, "session.update", session={"turn_detection": None, **session})
    _, updated = until(ws, "session.updated", "error")
    assert updated["type"] == "session.updated", updated
    return updated


# ---------------------------------------------------------------------------------------------- the VAD alone
def test_energy_vad_starts_on_loud_frames_and_stops_after_silence() -> None:
    vad = EnergyVAD(threshold=0.05, silence_duration_ms=100, prefix_padding_ms=0, sample_rate_hz=RATE)
    assert vad.feed(np.zeros(RATE // 10, dtype=np.float32)) == []  # 100 ms of silence
    started = vad.feed(tone(0.2))
    assert [(e.kind, e.audio_ms) for e in started] == [("speech_started", 100)]
    assert vad.feed(np.zeros(RATE // 20, dtype=np.float32)) == []  # 50 ms quiet: not yet
    stopped = vad.feed(np.zeros(RATE // 10, dtype=np.float32))
    assert [(e.kind, e.audio_ms) for e in stopped] == [("speech_stopped", 300)]
    # frames split across appends are joined; a quiet tone stays below the threshold
    vad.reset()
    assert vad.feed(tone(0.2, amplitude=0.01)) == []
    pieces = [tone(0.013) for _ in range(3)]
    assert [e.kind for chunk in pieces for e in vad.feed(chunk)] == ["speech_started"]


# ---------------------------------------------------------------------------------------------- toy server
def test_session_update_is_echoed_and_validated(toy_server: ServerProcess) -> None:
    with session(toy_server) as ws:
        updated = no_vad(ws, modalities=["text"], instructions="", voice="default")
        assert updated["session"]["modalities"] == ["text"]
        assert updated["session"]["turn_detection"] is None
        assert updated["session"]["instructions"] == ""
        send(ws, "session.update", session={"instructions": "be brief"})  # the toy family takes no instructions
        _, error = until(ws, "error", "session.updated")
        assert error["type"] == "error" and error["error"]["param"] == "session.instructions", error
        send(ws, "session.update", session={"turn_detection": {"type": "server_vad", "threshold": 0.1,
                                                                 "silence_duration_ms": 300}})
        _, updated = until(ws, "session.updated")
        assert updated["session"]["turn_detection"]["threshold"] == 0.1
        assert updated["session"]["turn_detection"]["silence_duration_ms"] == 300
        for bad, param in (({"input_audio_format": "g711_ulaw"}, "session.input_audio_format"),
                           ({"modalities": ["video"]}, "session.modalities"),
                           ({"voice": "nobody"}, "session.voice"),
                           ({"turn_detection": {"type": "semantic_vad"}}, "session.turn_detection.type"),
                           ({"turn_detection": {"threshold": 2}}, "session.turn_detection.threshold"),
                           ({"max_response_output_tokens": 0}, "session.max_response_output_tokens"),
                           ({"input_audio_transcription": "yes"}, "session.input_audio_transcription"),
                           ({"input_audio_transcription": {"model": ""}}, "session.input_audio_transcription.model"),
                           # the toy pipeline has no transcription pipeline to transcribe with
                           ({"input_audio_transcription": {"model": "whisper-1"}},
                            "session.input_audio_transcription")):
            send(ws, "session.update", session=bad, event_id="client-1")
            _, error = until(ws, "error", "session.updated")
            assert error["type"] == "error", (bad, error)
            assert error["error"]["param"] == param and error["error"]["event_id"] == "client-1", error


def test_text_turn_streams_transcript_audio_and_done(toy_server: ServerProcess) -> None:
    with session(toy_server) as ws:
        no_vad(ws)
        created = user_text(ws, "hello realtime")
        assert created["item"]["role"] == "user"
        send(ws, "response.create")
        events, done = until(ws, "response.done")
        assert done["response"]["status"] == "completed", done
        assert done["response"]["usage"]["output_tokens"] > 0
        assert events[0]["type"] == "response.created"
        deltas = of(events, "response.audio_transcript.delta")
        assert "".join(d["delta"] for d in deltas) == "HELLO REALTIME"
        assert of(events, "response.audio_transcript.done")[0]["transcript"] == "HELLO REALTIME"
        audio = b"".join(base64.b64decode(d["delta"]) for d in of(events, "response.audio.delta"))
        assert len(audio) > 0 and len(audio) % 2 == 0
        assert of(events, "response.audio.done")
        assert done["response"]["id"] == events[0]["response"]["id"]
        # a second turn on the same connection, text only
        user_text(ws, "again")
        send(ws, "response.create", response={"modalities": ["text"]})
        events, done = until(ws, "response.done")
        assert done["response"]["status"] == "completed"
        assert "".join(d["delta"] for d in of(events, "response.text.delta")) == "AGAIN"
        assert not of(events, "response.audio.delta")
        assert of(events, "response.text.done")[0]["text"] == "AGAIN"


def test_malformed_events_get_errors_and_the_session_keeps_working(toy_server: ServerProcess) -> None:
    cases: list[tuple[str, str | None]] = [
        ("not json", "invalid_json"),
        ("[" * 100_000 + "]" * 100_000, "invalid_json"),  # json.loads raised RecursionError: the socket died
        ("[1, 2]", "invalid_event"),
        (json.dumps({"no": "type"}), "missing_field"),
        (json.dumps({"type": "no.such.event"}), "invalid_event_type"),
        (json.dumps({"type": "input_audio_buffer.append"}), "missing_field"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "***not base64***"}), "invalid_base64"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}),
         "invalid_audio"),
        (json.dumps({"type": "input_audio_buffer.commit"}), "input_audio_buffer_commit_empty"),
        (json.dumps({"type": "conversation.item.create"}), "missing_field"),
        (json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "assistant",
                                                                  "content": []}}), "unsupported_item"),
        (json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                  "content": [{"type": "input_text"}]}}),
         "missing_field"),
        (json.dumps({"type": "response.create"}), "no_input"),
        (json.dumps({"type": "response.cancel"}), "response_cancel_not_active"),
        (json.dumps({"type": "session.update", "session": "nope"}), "invalid_value"),
    ]
    with session(toy_server) as ws:
        no_vad(ws)
        for text, code in cases:
            ws.send(text)
            event = recv(ws)
            assert event["type"] == "error", (text, event)
            assert event["error"]["code"] == code, (text, event)
            assert event["error"]["type"] == "invalid_request_error" and event["error"]["message"]
        ws.send(b"\x00binary")
        assert recv(ws)["type"] == "error"
        # committed audio on a text-only pipeline is refused, and clearing the buffer works
        send(ws, "input_audio_buffer.append", audio=pcm16_b64(tone(0.1)))
        send(ws, "input_audio_buffer.commit")
        assert recv(ws)["error"]["code"] == "unsupported_modality"
        send(ws, "input_audio_buffer.clear")
        assert recv(ws)["type"] == "input_audio_buffer.cleared"
        # still a working session
        user_text(ws, "still fine")
        send(ws, "response.create")
        events, done = until(ws, "response.done")
        assert done["response"]["status"] == "completed"
        assert "".join(d["delta"] for d in of(events, "response.audio_transcript.delta")) == "STILL FINE"


def test_response_cancel_mid_stream_ends_cancelled_and_leaves_nothing(toy_server: ServerProcess) -> None:
    with session(toy_server) as ws:
        no_vad(ws)
        user_text(ws, LONG_TEXT)
        send(ws, "response.create")
        _, first = until(ws, "response.audio_transcript.delta", "response.audio.delta")
        send(ws, "response.cancel")
        events, done = until(ws, "response.done")
        assert done["response"]["status"] == "cancelled", done
        assert done["response"]["status_details"]["reason"] == "client_cancelled", done
        assert done["response"]["id"] == first["response_id"]
        assert not of(events, "error")
        transcript = "".join(d["delta"] for d in of(events, "response.audio_transcript.delta"))
        assert len(transcript) < len(LONG_TEXT)
        state = toy_server.wait_idle(timeout_s=30)
        assert engines_idle(state), state
        # the next response on the same session runs normally
        user_text(ws, "after cancel")
        send(ws, "response.create")
        _, done = until(ws, "response.done")
        assert done["response"]["status"] == "completed"


def test_barge_in_on_loud_audio_cancels_the_running_response(toy_server: ServerProcess) -> None:
    with session(toy_server) as ws:
        send(ws, "session.update", session={"turn_detection": {"type": "server_vad", "threshold": 0.05,
                                                                 "silence_duration_ms": 500}})
        until(ws, "session.updated")
        user_text(ws, LONG_TEXT)
        send(ws, "response.create")
        until(ws, "response.audio_transcript.delta", "response.audio.delta")
        # quiet audio does not interrupt; loud audio (no trailing silence, so no auto-commit) does
        send(ws, "input_audio_buffer.append", audio=pcm16_b64(tone(0.2, amplitude=0.005)))
        send(ws, "input_audio_buffer.append", audio=pcm16_b64(tone(0.3)))
        events, done = until(ws, "response.done")
        assert done["response"]["status"] == "cancelled", done
        assert done["response"]["status_details"]["reason"] == "turn_detected", done
        started = of(events, "input_audio_buffer.speech_started")
        assert len(started) == 1 and started[0]["audio_start_ms"] >= 0
        assert engines_idle(toy_server.wait_idle(timeout_s=30))
        send(ws, "input_audio_buffer.clear")
        _, cleared = until(ws, "input_audio_buffer.cleared")
        assert cleared["type"] == "input_audio_buffer.cleared"


def test_disconnect_mid_response_aborts_it(toy_server: ServerProcess) -> None:
    with session(toy_server) as ws:
        no_vad(ws)
        user_text(ws, LONG_TEXT)
        send(ws, "response.create")
        until(ws, "response.audio_transcript.delta", "response.audio.delta")
    state = toy_server.wait_idle(timeout_s=30)
    assert engines_idle(state), state


def test_api_key_is_required_in_the_header(toy_server: ServerProcess) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with pytest.raises(InvalidStatus) as info, connect(ws_url(toy_server), additional_headers=headers,
                                                           open_timeout=30):
            pass
        assert info.value.response.status_code == 403
    with session(toy_server) as ws:
        no_vad(ws)


# ---------------------------------------------------------------------------------------------- default server
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def spoken_question(default_server: ServerProcess) -> np.ndarray:
    """QUESTION read aloud by the server's own speech endpoint as 24 kHz pcm16."""
    response = httpx.post(f"{default_server.url}/v1/audio/speech", headers=default_server.headers, timeout=300,
                          json={"model": "tts", "input": QUESTION, "voice": "default", "response_format": "pcm"})
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content, dtype="<i2").astype(np.float32) / 32768.0


@pytest.mark.models
def test_spoken_turn_on_the_default_pipeline(default_server: ServerProcess, spoken_question: np.ndarray) -> None:
    with session(default_server) as ws:
        no_vad(ws, max_response_output_tokens=30)
        step = RATE // 5
        for start in range(0, len(spoken_question), step):  # 200 ms appends, as a microphone would send
            send(ws, "input_audio_buffer.append", audio=pcm16_b64(spoken_question[start:start + step]))
        send(ws, "input_audio_buffer.commit")
        _, committed = until(ws, "input_audio_buffer.committed", "error")
        assert committed["type"] == "input_audio_buffer.committed", committed
        send(ws, "response.create")
        events, done = until(ws, "response.done")
        assert done["response"]["status"] == "completed", (done, of(events, "error"))
        transcript = "".join(d["delta"] for d in of(events, "response.audio_transcript.delta"))
        assert transcript.strip()
        audio = b"".join(base64.b64decode(d["delta"]) for d in of(events, "response.audio.delta"))
        assert len(audio) > 0.3 * RATE * 2  # more than 0.3 s of 24 kHz speech
    assert engines_idle(default_server.wait_idle(timeout_s=60))


@pytest.mark.models
def test_barge_in_with_speech_on_the_default_pipeline(default_server: ServerProcess,
                                                      spoken_question: np.ndarray) -> None:
    loud = spoken_question / max(float(np.max(np.abs(spoken_question))), 1e-6) * 0.8
    with session(default_server) as ws:
        send(ws, "session.update", session={"turn_detection": {"type": "server_vad", "threshold": 0.02,
                                                                 "silence_duration_ms": 60_000}})
        until(ws, "session.updated")
        user_text(ws, "Tell me a long story about a dragon who lived in a castle.")
        send(ws, "response.create")
        _, first = until(ws, "response.audio_transcript.delta", "response.audio.delta", "response.done")
        assert first["type"] != "response.done", first
        send(ws, "input_audio_buffer.append", audio=pcm16_b64(loud))
        events, done = until(ws, "response.done")
        assert of(events, "input_audio_buffer.speech_started")
        assert done["response"]["status"] == "cancelled", done
    assert engines_idle(default_server.wait_idle(timeout_s=60))
