"""The voice turn on the default pipeline: the speech transcribed by the session as the turn ends (once a turn,
for the answer and the transcription events alike), the tentative answer under server VAD (a
start the user talks over leaves nothing behind), and the thinker's per-session cache freed when a session ends."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import numpy as np
import pytest

from omnipipe.bench.voice_questions import cut_trailing_quiet
from tests.server.conftest import ServerProcess, engines_idle, spoken
from tests.server.test_realtime import RATE, Conn, of, session, silence

pytestmark = pytest.mark.models

QUESTIONS = ("What is the capital of France?", "Who wrote Romeo and Juliet?",
             "What is the largest planet in our solar system?", "What color is the sky on a clear day?")
CHUNK = RATE * 40 // 1000  # 40 ms appends, as the voice page sends them


def clip(text: str) -> np.ndarray:
    """``text`` spoken by the packaged voice, the same every run, ending at its last speech sample."""
    pcm = (np.clip(spoken(text, steady=True), -1, 1) * 32767).astype("<i2").tobytes()
    return np.frombuffer(cut_trailing_quiet(pcm), "<i2").astype(np.float32) / 32768.0


def words(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def stream(conn: Conn, audio: np.ndarray) -> None:
    """Append ``audio`` at real-time pace in 40 ms chunks (a pause in it reaches the VAD as a pause)."""
    start = time.perf_counter()
    for i, offset in enumerate(range(0, len(audio), CHUNK)):
        delay = start + i * CHUNK / RATE - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        conn.append(audio[offset:offset + CHUNK], step=CHUNK)


def counters(server: ServerProcess) -> dict[str, float]:
    """The realtime voice-turn counters of the server's /metrics (``name{labels}`` -> value)."""
    text = httpx.get(f"{server.url}/metrics", headers=server.headers, timeout=30).text
    found = re.findall(r"^omnipipe:realtime_(\w+)_total(\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    return {f"{name}{labels}": float(value) for name, labels, value in found}


def grew(before: dict[str, float], after: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def thinker_sessions(server: ServerProcess) -> dict[str, int]:
    """The default thinker's prefix cache as /debug/state shows it."""
    state = httpx.get(f"{server.url}/debug/state", headers=server.headers, timeout=30).json()
    stages = state["engines"]["default"]["state"]["stages"]
    return stages["thinker"]["kv_cache"]


def test_a_committed_turn_is_transcribed_once_for_the_answer_and_the_transcript(
        default_server: ServerProcess) -> None:
    before = counters(default_server)
    with session(default_server) as conn:
        conn.no_vad(audio={"input": {"transcription": {"model": "whisper-1"}}}, max_output_tokens=30)
        for question in QUESTIONS[:2]:
            stream(conn, clip(question))
            conn.send("input_audio_buffer.commit")
            conn.send("response.create")
            events, done = conn.until("response.done")
            assert done["response"]["status"] == "completed", (done, of(events, "error"))
            heard = of(events, "conversation.item.input_audio_transcription.completed")
            assert len(heard) == 1 and words(heard[0]["transcript"])[-2:] == words(question)[-2:], heard
            said = "".join(d["delta"] for d in of(events, "response.output_audio_transcript.delta"))
            assert said.strip() and of(events, "response.output_audio.delta")
    after = counters(default_server)
    assert grew(before, after, 'turn_transcriptions{model_name="default"}') == 2
    assert engines_idle(default_server.wait_idle(timeout_s=60))


def test_without_the_sessions_transcript_the_pipeline_hears_the_turn_whole(default_server: ServerProcess) -> None:
    """``live_transcription: false``: the committed audio goes to the pipeline (its own whisper stage), which takes
    no audio streams, so the session streams none and the turn's clip goes whole; the answer is to the question."""
    before = counters(default_server)
    with session(default_server) as conn:
        conn.no_vad(audio={"input": {"live_transcription": False}}, max_output_tokens=30)
        stream(conn, clip("What is the capital of France?"))
        conn.send("input_audio_buffer.commit")
        conn.send("response.create")
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "completed", (done, of(events, "error"))
        said = "".join(d["delta"] for d in of(events, "response.output_audio_transcript.delta"))
        assert "paris" in words(said), said
    after = counters(default_server)
    assert grew(before, after, 'streamed_turns{model_name="default"}') == 0


def test_a_tentative_answer_the_user_talks_over_leaves_nothing_behind(default_server: ServerProcess) -> None:
    """A 300 ms pause mid-question starts an answer (silence_duration_ms 500): the user goes on, so it is dropped
    unheard; the answer to the whole question, started at the final pause, is the one released."""
    first, rest = clip("What is the capital"), clip("of France?")
    before = counters(default_server)
    with session(default_server) as conn:
        answer = conn.update(max_output_tokens=30, audio={"input": {
            "transcription": {"model": "whisper-1"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}})
        assert answer["type"] == "session.updated", answer
        stream(conn, np.concatenate([silence(0.5), first, silence(0.3)]))
        middle = counters(default_server)
        stream(conn, np.concatenate([rest, silence(1.0)]))
        events, done = conn.until("response.done")
        assert done["response"]["status"] == "completed", (done, of(events, "error"))
        heard = conn.until("conversation.item.input_audio_transcription.completed")[1] \
            if not of(events, "conversation.item.input_audio_transcription.completed") else \
            of(events, "conversation.item.input_audio_transcription.completed")[0]
        conn.send("conversation.item.retrieve", item_id=done["response"]["output"][0]["id"])
        conn.until("conversation.item.retrieved")
    after = counters(default_server)
    # the talked-over start: dropped before the question went on, and nothing of it reached the client
    assert grew(before, middle, 'speculative_starts{model_name="default",outcome="dropped"}') == 0
    assert grew(before, after, 'speculative_starts{model_name="default",outcome="dropped"}') >= 1
    assert grew(before, after, 'speculative_starts{model_name="default",outcome="released"}') == 1
    kinds = [e["type"] for e in events]
    assert kinds.count("input_audio_buffer.committed") == 1 and kinds.count("response.created") == 1, kinds
    responses = {e["response_id"] for e in events if "response_id" in e}
    assert responses == {done["response"]["id"]}, responses  # every delta is the released answer's
    added = of(events, "conversation.item.added")
    assert [a["item"]["role"] for a in added] == ["user", "assistant"], added
    assert "capital" in words(heard["transcript"]) and "france" in words(heard["transcript"]), heard
    assert grew(before, after, 'turn_transcriptions{model_name="default"}') == 1
    assert engines_idle(default_server.wait_idle(timeout_s=60))


def test_ending_a_session_frees_its_conversation_cache(default_server: ServerProcess) -> None:
    """The thinker keeps a session's turn for its next (which prefills only new words) and holds nothing of it once
    the session closes: 50 sessions come and go, no request holds a KV block and the blocks kept for later
    requests stay within ``prefix_cache_bytes``."""
    def one_turn(conn: Conn) -> None:
        conn.no_vad(output_modalities=["text"], max_output_tokens=3)
        conn.user_text("Say hello.")
        conn.send("response.create")
        assert conn.until("response.done")[1]["response"]["status"] == "completed"

    with session(default_server) as conn:
        one_turn(conn)
        held: dict[str, Any] = thinker_sessions(default_server)
        assert held["prefix_cache_bytes"] > 0, held  # the turn's blocks are kept for the session's next
    for _ in range(50):
        with session(default_server) as conn:
            one_turn(conn)
    deadline = time.monotonic() + 30
    # held for good: the preamble's blocks (38 tokens); a request's prompt holds more
    while (held := thinker_sessions(default_server))["tokens_used"] >= 64 and time.monotonic() < deadline:
        time.sleep(0.2)  # the close reaches the thinker through the engine, a moment after the socket's
    assert held["tokens_used"] < 64, held
    assert held["prefix_cache_bytes"] <= 256 << 20, held  # the default prefix_cache_bytes
