"""Voxtral Realtime's ``/v1/realtime`` sessions through a real ``omnipipe serve --pipeline voxtral_realtime --model
DIR`` process and a websocket client, on a tiny checkpoint written by ``omnipipe tiny-checkpoint voxtral_realtime``:
every session is a transcription session (GA ``session.type`` ``transcription``), every server event checked against
the ``openai`` package's types.

- a turn's audio streams into the model as it comes: ``conversation.item.input_audio_transcription.delta`` events
  arrive before the commit; the commit answers ``input_audio_buffer.committed`` and ``conversation.item.added``, then
  ``...completed`` carries the transcript, which (and the deltas joined) is the model's own greedy ``generate`` on
  the 16 kHz audio the server heard (the client's pcm16 resampled as the server does, its tail flushed at the
  commit); two turns in a row, the second spoken while the first finishes; a cleared turn says nothing more;
- bad input is refused by name and the session goes on: ``session.type`` realtime, a turn detection, a language the
  model lacks, a null transcription, ``response.create`` and ``conversation.item.create``, an empty commit, bad
  base64; a beta connection is refused naming ``OpenAI-Beta``."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.sync.client import connect

from tests.models.test_voxtral_realtime import clip
from tests.models.test_voxtral_realtime_server import _reference
from tests.server.conftest import ServerProcess, running_server
from tests.server.test_realtime import RATE, Conn, of, pcm16_b64, session, ws_url

pytestmark = pytest.mark.slow  # a server process with a stage process

APPEND_SAMPLES = RATE // 10  # 100 ms appends at 24 kHz, as a microphone would send
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("voxtral-realtime-live") / "ckpt"
    subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "tiny-checkpoint", "voxtral_realtime", str(directory)],
                   check=True, capture_output=True, timeout=300, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    return directory


@pytest.fixture(scope="module")
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    deploy = {"stages": {"transcriber": {"threads": 1}}}
    with running_server("voxtral_realtime", deploy, tmp_path_factory.mktemp("voxtral-realtime-live-serve"), 300,
                        extra_args=("--model", str(checkpoint))) as running:
        yield running


def _spoken(seconds: float, seed: int) -> np.ndarray:
    """A clip as the client sends it: 24 kHz, pcm16 values."""
    import soxr

    samples = np.asarray(soxr.resample(clip(seconds, seed), 16000, RATE), np.float32)
    return np.frombuffer(base64.b64decode(pcm16_b64(samples)), "<i2").astype(np.float32) / 32768.0


def _as_heard(audio: np.ndarray) -> np.ndarray:
    """What the server hears of ``audio`` appended in 100 ms pieces and committed: each piece resampled to 16 kHz as
    it comes, the resampler's tail flushed at the commit."""
    import soxr

    stream = soxr.ResampleStream(RATE, 16000, 1, dtype="float32")
    pieces = [stream.resample_chunk(audio[start:start + APPEND_SAMPLES])
              for start in range(0, len(audio), APPEND_SAMPLES)]
    pieces.append(stream.resample_chunk(np.zeros(0, np.float32), last=True))
    return np.concatenate(pieces).astype(np.float32)


def _speak(conn: Conn, audio: np.ndarray) -> None:
    for start in range(0, len(audio), APPEND_SAMPLES):
        conn.send("input_audio_buffer.append", audio=pcm16_b64(audio[start:start + APPEND_SAMPLES]))


def _deltas(events: list[dict[str, Any]], item_id: str) -> str:
    return "".join(e["delta"] for e in of(events, DELTA) if e["item_id"] == item_id)


def test_turns_stream_their_transcript_while_spoken_and_complete_with_the_models(checkpoint: Path,
                                                                                server: ServerProcess) -> None:
    first, second = _spoken(3.5, seed=30), _spoken(2.5, seed=31)
    want_first, want_second = (_reference(checkpoint, _as_heard(audio))[0] for audio in (first, second))
    with session(server) as conn:
        conn.send("session.update", session={"type": "transcription"})
        _, updated = conn.until("session.updated")
        assert updated["session"]["type"] == "transcription", updated
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        # a cleared turn: its request dropped, nothing said of it
        _speak(conn, first[:APPEND_SAMPLES * 3])
        conn.send("input_audio_buffer.clear")
        conn.until("input_audio_buffer.cleared")
        # turn one: text while the user still speaks
        spoken_before = APPEND_SAMPLES * 25
        _speak(conn, first[:spoken_before])
        early, delta = conn.until(DELTA)
        item_id = delta["item_id"]
        _speak(conn, first[spoken_before:])
        conn.send("input_audio_buffer.commit")
        later, committed = conn.until("input_audio_buffer.committed")
        events = [*early, delta, *later, committed]
        assert committed["item_id"] == item_id and committed["previous_item_id"] is None, committed
        # turn two, spoken at once while turn one finishes
        _speak(conn, second)
        conn.send("input_audio_buffer.commit")
        while len(of(events, "conversation.item.done")) < 2:  # the two turns' requests end in either order
            event = conn.recv()
            assert event["type"] != "error", event
            events.append(event)
        second_committed = next(e for e in of(events, "input_audio_buffer.committed") if e["item_id"] != item_id)
        second_id = second_committed["item_id"]
        assert second_committed["previous_item_id"] == item_id
        completed = {e["item_id"]: e for e in of(events, COMPLETED)}
        assert _deltas(events, item_id) == want_first and completed[item_id]["transcript"] == want_first.strip()
        assert len(of([e for e in events if e.get("item_id") == item_id], DELTA)) > 1  # as it decodes
        assert completed[item_id]["usage"] == {"type": "duration", "seconds": round(len(first) / RATE, 3)}
        added = [e for e in of(events, "conversation.item.added") if e["item"]["id"] == item_id]
        assert len(added) == 1 and added[0]["item"]["content"] == [{"type": "input_audio", "transcript": None}]
        assert _deltas(events, second_id) == want_second
        assert completed[second_id]["transcript"] == want_second.strip()
        # each item's events in order: committed, added, completed, done
        for item in (item_id, second_id):
            kinds = [e["type"] for e in events if item in (e.get("item_id"), e.get("item", {}).get("id"))]
            assert [k for k in kinds if k != DELTA] == ["input_audio_buffer.committed", "conversation.item.added",
                                                        COMPLETED, "conversation.item.done"], kinds
        done = {e["item"]["id"]: e for e in of(events, "conversation.item.done")}
        assert done[item_id]["item"]["content"][0]["transcript"] == want_first.strip()
        # nothing of the cleared turn after its clear
        assert {e["item_id"] for e in events if "item_id" in e} == {item_id, second_id}


def test_bad_input_is_refused_by_name_and_the_session_goes_on(server: ServerProcess) -> None:
    with session(server) as conn:
        refusals = [
            ({"type": "realtime"}, "session.type"),
            ({"type": "transcription", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}},
             "session.audio.input.turn_detection"),
            ({"type": "transcription", "audio": {"input": {"transcription": {"language": "sw"}}}},
             "session.audio.input.transcription.language"),
            ({"type": "transcription", "audio": {"input": {"transcription": None}}},
             "session.audio.input.transcription"),
        ]
        for update, param in refusals:
            conn.send("session.update", session=update)
            _, error = conn.until("error", "session.updated")
            assert error["type"] == "error" and error["error"]["param"] == param, (update, error)
        for kind, fields in (("response.create", {}), ("conversation.item.create", {"item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})):
            conn.send(kind, **fields)
            _, error = conn.until("error")
            assert error["error"]["param"] == "type" and kind in error["error"]["message"], error
        conn.send("input_audio_buffer.commit")
        _, error = conn.until("error")
        assert error["error"]["code"] == "input_audio_buffer_commit_empty", error
        conn.send("input_audio_buffer.append", audio="not base64!")
        _, error = conn.until("error")
        assert error["error"]["param"] == "audio", error
        conn.send("session.update", session={"type": "transcription", "audio": {"input": {"transcription": {
            "model": "gpt-4o-transcribe", "language": "German"}}}})
        _, updated = conn.until("session.updated")
        assert updated["session"]["audio"]["input"]["transcription"] == {"model": "gpt-4o-transcribe",
                                                                         "language": "de", "prompt": None}
    with connect(ws_url(server), additional_headers={**server.headers, "OpenAI-Beta": "realtime=v1"},
                 open_timeout=60) as ws:  # type: ignore[arg-type]
        refused = json.loads(ws.recv(timeout=60))
        assert refused["type"] == "error" and refused["error"]["param"] == "OpenAI-Beta", refused
