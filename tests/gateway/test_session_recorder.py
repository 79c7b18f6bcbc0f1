"""Session recorder: a voice session end to end through the realtime tap, crash safety, the writer, the replay."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omnipipe.gateway.recording import recorder as recorder_module
from omnipipe.gateway.recording.recorder import SessionRecorder
from omnipipe.gateway.recording.replay import merged_replay, read_wav, write_merged_replay
from omnipipe.gateway.recording.store import SessionStore
from omnipipe.gateway.recording.taps import RealtimeTap
from omnipipe.gateway.recording.writer import RecordingWriter
from tests.waiting import wait_for_async

RATE = 24_000
SID = "20261122-024301_voice_3f9a1c2b7d"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


class FakeClock:
    """Epoch seconds that only move when a test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.start = start
        self.now = start

    def __call__(self) -> float:
        return self.now

    def at(self, seconds_since_start: float) -> None:
        self.now = self.start + seconds_since_start


def tone(seconds: float, freq: float = 440.0, rate: int = RATE, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def pcm16_b64(samples: np.ndarray) -> str:
    return base64.b64encode(np.round(samples * 32767).astype("<i2").tobytes()).decode()


def send_client(tap: RealtimeTap, kind: str, **fields: Any) -> None:
    tap.on_client_event(json.dumps({"type": kind, **fields}))


def send_server(tap: RealtimeTap, kind: str, **fields: Any) -> None:
    tap.on_server_event(json.dumps({"type": kind, "event_id": "event_x", **fields}))


def stream_user_audio(tap: RealtimeTap, clock: FakeClock, start_s: float, seconds: float) -> None:
    """Append ``seconds`` of tone in 100 ms chunks, in real time from ``start_s``."""
    audio = tone(seconds)
    step = RATE // 10
    for i, offset in enumerate(range(0, audio.size, step)):
        clock.at(start_s + i * 0.1)
        send_client(tap, "input_audio_buffer.append", audio=pcm16_b64(audio[offset:offset + step]))
    clock.at(start_s + seconds)


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def wav_info(path: Path) -> tuple[int, int, float]:
    with wave.open(str(path)) as wav:
        return wav.getnchannels(), wav.getframerate(), wav.getnframes() / wav.getframerate()


@pytest.fixture
def writer() -> Iterator[RecordingWriter]:
    writer = RecordingWriter()
    yield writer
    writer.close()


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "data")


def new_recorder(store: SessionStore, writer: RecordingWriter, clock: FakeClock | None = None,
                 kind: str = "voice") -> SessionRecorder:
    return SessionRecorder(store, SID, kind, writer=writer, worker="127.0.0.1:22400", config={"path": "/v1/realtime"},
                           clock=clock or FakeClock())


def play_two_turns(tap: RealtimeTap, clock: FakeClock) -> None:
    """Turn 1 with server VAD; turn 2 with a client commit (echoed by the worker) plus a text item."""
    clock.at(0.0)
    send_server(tap, "session.created", session={"id": "sess_1", "voice": "default"})
    # turn 1: speech 0.5-1.5 s, answer audio 1.5 s from 1.8 s
    stream_user_audio(tap, clock, 0.5, 0.1)  # the first 100 ms chunk arrives at 0.5 s
    clock.at(0.6)
    send_server(tap, "input_audio_buffer.speech_started", audio_start_ms=0, item_id="item_1")
    stream_user_audio(tap, clock, 0.6, 0.9)
    clock.at(1.5)
    send_server(tap, "input_audio_buffer.speech_stopped", audio_end_ms=1000, item_id="item_1")
    send_server(tap, "input_audio_buffer.committed", previous_item_id=None, item_id="item_1")
    clock.at(1.6)
    send_server(tap, "response.created", response={"id": "resp_1", "status": "in_progress"})
    clock.at(1.7)
    send_server(tap, "response.audio_transcript.delta", response_id="resp_1", delta="Hello ")
    clock.at(1.8)
    answer = tone(1.5, 660.0)
    for chunk in np.array_split(answer, 3):
        send_server(tap, "response.audio.delta", response_id="resp_1", delta=pcm16_b64(chunk))
    send_server(tap, "response.audio_transcript.delta", response_id="resp_1", delta="there")
    clock.at(2.1)
    send_server(tap, "response.done", response={"id": "resp_1", "status": "completed", "status_details": None,
                                                "usage": {"total_tokens": 7, "output_tokens": 7}})
    # turn 2: audio 4.0-4.8 s committed by the client, a text item, answer audio 1.0 s from 5.2 s
    stream_user_audio(tap, clock, 4.0, 0.8)
    send_client(tap, "input_audio_buffer.commit")
    send_client(tap, "conversation.item.create", item={"type": "message", "role": "user",
                                                       "content": [{"type": "input_text", "text": "and in French?"}]})
    stream_user_audio(tap, clock, 4.8, 0.1)  # streaming goes on before the worker's echo of the commit
    clock.at(4.85)
    send_server(tap, "input_audio_buffer.committed", previous_item_id="item_1", item_id="item_2")
    send_client(tap, "input_audio_buffer.clear")
    send_server(tap, "input_audio_buffer.cleared")
    clock.at(5.0)
    send_server(tap, "response.created", response={"id": "resp_2", "status": "in_progress"})
    clock.at(5.2)
    send_server(tap, "response.audio.delta", response_id="resp_2", delta=pcm16_b64(tone(1.0, 660.0)))
    send_server(tap, "response.audio_transcript.delta", response_id="resp_2", delta="Bonjour")
    clock.at(5.3)
    send_server(tap, "response.done", response={"id": "resp_2", "status": "completed"})


def rms(channel: np.ndarray, start_s: float, end_s: float) -> float:
    window = channel[round(start_s * RATE):round(end_s * RATE)]
    return float(np.sqrt(np.mean(window.astype(np.float64) ** 2)))


def test_voice_session_end_to_end(store: SessionStore, writer: RecordingWriter) -> None:
    clock = FakeClock()
    recorder = new_recorder(store, writer, clock)
    tap = RealtimeTap(recorder)
    play_two_turns(tap, clock)
    clock.at(7.0)
    tap.close("completed")
    assert writer.flush(timeout=10)
    directory = store.session_dir(SID)

    meta = read_json(directory / "meta.json")
    assert meta == {"session_id": SID, "type": "voice", "created_at": 1000.0, "ended_at": 1007.0,
                    "status": "completed", "worker": "127.0.0.1:22400", "config": {"path": "/v1/realtime"},
                    "error": None}

    recording = read_json(directory / "recording.json")
    assert recording["session_id"] == SID and recording["type"] == "voice"
    first, second = recording["turns"]
    assert first["index"] == 1 and first["started_at"] == 0.6 and first["status"] == "completed"
    assert first["user_audio"] == {"path": "user_audio/turn001.wav", "t_start": 0.5, "duration_s": 1.0,
                                   "sample_rate": RATE}
    assert first["assistant_text"] == "Hello there" and first["user_text"] == ""
    assert first["ai_audio"] == [{"path": "ai_audio/turn001.wav", "t_start": 1.8, "duration_s": 1.5,
                                  "sample_rate": RATE}]
    assert first["metrics"] == {"ttft_ms": 100.0, "ttfp_ms": 200.0,
                                "usage": {"total_tokens": 7, "output_tokens": 7}}
    assert first["ended_at"] == 2.1
    assert second["index"] == 2 and second["status"] == "completed"
    assert second["user_text"] == "and in French?" and second["assistant_text"] == "Bonjour"
    assert second["user_audio"]["t_start"] == 4.0 and second["user_audio"]["duration_s"] == 0.8
    assert second["user_audio_extra"] == []  # the worker's echo of the client's commit adds nothing
    assert second["ai_audio"][0]["t_start"] == 5.2 and second["ai_audio"][0]["duration_s"] == 1.0
    kinds = [event["kind"] for event in recording["events"]]
    assert kinds[0] == "session.created"
    assert kinds.count("response.created") == 2 and kinds.count("response.done") == 2
    assert all(isinstance(event["t"], float) for event in recording["events"])

    for relpath, seconds in [("user_audio/turn001.wav", 1.0), ("ai_audio/turn001.wav", 1.5),
                             ("user_audio/turn002.wav", 0.8), ("ai_audio/turn002.wav", 1.0)]:
        assert wav_info(directory / relpath) == (1, RATE, pytest.approx(seconds))
    samples, _ = read_wav(directory / "ai_audio/turn001.wav")
    assert np.allclose(samples, tone(1.5, 660.0), atol=1e-3)

    channels, rate, seconds = wav_info(directory / "merged_replay.wav")
    assert (channels, rate, seconds) == (2, RATE, pytest.approx(6.2))
    with wave.open(str(directory / "merged_replay.wav")) as wav:
        replay = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").reshape(-1, 2) / 32768.0
    user, ai = replay[:, 0], replay[:, 1]
    loud, quiet = 0.3, 0.01
    for start, end in [(0.51, 1.49), (4.01, 4.79)]:  # user speaking
        assert rms(user, start, end) > loud and rms(ai, start, end) < quiet
    for start, end in [(1.81, 3.29), (5.21, 6.19)]:  # AI speaking
        assert rms(ai, start, end) > loud and rms(user, start, end) < quiet
    assert rms(user, 0.0, 0.49) < quiet and rms(user, 3.4, 3.99) < quiet and rms(ai, 3.4, 5.19) < quiet
    assert not list(directory.rglob("*.partial"))


def test_crash_leaves_readable_partial_recording(store: SessionStore, writer: RecordingWriter) -> None:
    clock = FakeClock()
    recorder = new_recorder(store, writer, clock)
    tap = RealtimeTap(recorder)
    play_two_turns(tap, clock)
    clock.at(8.0)
    send_server(tap, "input_audio_buffer.speech_started", audio_start_ms=0, item_id="item_3")
    stream_user_audio(tap, clock, 8.0, 0.5)
    send_server(tap, "input_audio_buffer.committed", item_id="item_3")
    send_server(tap, "response.created", response={"id": "resp_3"})
    send_server(tap, "response.audio.delta", response_id="resp_3", delta=pcm16_b64(tone(0.3)))
    # the gateway dies here: no response.done, no close, no finish
    assert writer.flush(timeout=10)
    directory = store.session_dir(SID)
    session = store.read_session(SID)
    assert session["errors"] == []
    assert session["meta"]["status"] == "recording" and session["meta"]["ended_at"] is None
    turns = session["recording"]["turns"]
    assert [t["status"] for t in turns] == ["completed", "completed", "in_progress"]
    assert turns[0]["assistant_text"] == "Hello there" and turns[0]["ai_audio"][0]["duration_s"] == 1.5
    assert turns[2]["user_audio"]["path"] == "user_audio/turn003.wav"
    assert wav_info(directory / "user_audio/turn003.wav")[2] == pytest.approx(0.5)
    assert "merged_replay.wav" not in session["files"]
    assert not list(directory.rglob("*.partial"))


def test_barge_in_opens_the_next_turn_at_the_speech(store: SessionStore, writer: RecordingWriter) -> None:
    clock = FakeClock()
    recorder = new_recorder(store, writer, clock)
    tap = RealtimeTap(recorder)
    send_client(tap, "conversation.item.create", item={"role": "user", "content": [
        {"type": "input_text", "text": "Tell me a story"}]})
    send_client(tap, "response.create")
    clock.at(1.0)
    send_server(tap, "response.created", response={"id": "resp_1"})
    send_server(tap, "response.audio.delta", delta=pcm16_b64(tone(2.0)))
    stream_user_audio(tap, clock, 1.5, 0.5)
    clock.at(1.6)
    send_server(tap, "input_audio_buffer.speech_started")
    clock.at(1.7)
    send_server(tap, "response.done", response={"id": "resp_1", "status": "cancelled",
                                                "status_details": {"type": "cancelled"}})
    clock.at(2.5)
    send_server(tap, "input_audio_buffer.committed")
    send_server(tap, "response.created", response={"id": "resp_2"})
    send_server(tap, "response.done", response={"id": "resp_2", "status": "failed", "status_details": {
        "type": "failed", "error": {"type": "server_error", "code": "engine_error"}}})
    tap.close("completed")
    writer.flush(timeout=10)
    turns = read_json(store.session_dir(SID) / "recording.json")["turns"]
    assert [t["status"] for t in turns] == ["cancelled", "failed"]
    assert turns[0]["user_text"] == "Tell me a story" and turns[0]["user_audio"] is None
    assert turns[1]["started_at"] == 1.6 and turns[1]["user_audio"]["t_start"] == 1.5
    assert turns[1]["error"] == "engine_error"


def test_input_committed_during_a_response_goes_to_the_next_turn(store: SessionStore,
                                                                 writer: RecordingWriter) -> None:
    clock = FakeClock()
    recorder = new_recorder(store, writer, clock)
    tap = RealtimeTap(recorder)
    send_client(tap, "conversation.item.create", item={"content": [{"type": "input_text", "text": "one"}]})
    send_server(tap, "response.created", response={"id": "resp_1"})
    stream_user_audio(tap, clock, 1.0, 0.3)
    send_client(tap, "input_audio_buffer.commit")
    send_client(tap, "conversation.item.create", item={"content": [{"type": "input_text", "text": "two"}]})
    clock.at(2.0)
    send_server(tap, "response.done", response={"id": "resp_1", "status": "completed"})
    assert recorder.current_turn is not None and recorder.current_turn["index"] == 2
    assert recorder.current_turn["user_text"] == "two" and recorder.current_turn["started_at"] == 1.0
    tap.close("completed")
    writer.flush(timeout=10)
    turns = read_json(store.session_dir(SID) / "recording.json")["turns"]
    assert [(t["user_text"], t["status"]) for t in turns] == [("one", "completed"), ("two", "completed")]
    assert turns[1]["user_audio"]["duration_s"] == 0.3


def test_pause_clear_and_uncommitted_audio_are_not_saved(store: SessionStore, writer: RecordingWriter) -> None:
    clock = FakeClock()
    recorder = new_recorder(store, writer, clock)
    tap = RealtimeTap(recorder)
    send_client(tap, "session.pause")
    stream_user_audio(tap, clock, 0.0, 0.5)
    send_server(tap, "session.paused")
    send_client(tap, "input_audio_buffer.commit")
    send_server(tap, "error", error={"code": "input_audio_buffer_commit_empty", "message": "empty"})
    send_client(tap, "session.resume")
    stream_user_audio(tap, clock, 1.0, 0.5)
    send_client(tap, "input_audio_buffer.clear")
    stream_user_audio(tap, clock, 2.0, 0.2)
    send_server(tap, "input_audio_buffer.speech_started")
    send_server(tap, "input_audio_buffer.committed")  # a VAD commit: not the echo of the refused commit
    stream_user_audio(tap, clock, 3.0, 0.4)
    tap.close("completed")
    writer.flush(timeout=10)
    recording = read_json(store.session_dir(SID) / "recording.json")
    (turn,) = recording["turns"]
    assert turn["user_audio"]["t_start"] == 2.0 and turn["user_audio"]["duration_s"] == 0.2
    assert turn["status"] == "completed"
    kinds = [e["kind"] for e in recording["events"]]
    assert {"session.pause", "session.paused", "session.resume", "error"} <= set(kinds)
    assert recording["events"][-1]["kind"] == "input_audio_buffer.discarded"
    assert recording["events"][-1]["duration_s"] == 0.4


def test_user_audio_chunks_images_and_rates(store: SessionStore, writer: RecordingWriter) -> None:
    clock = FakeClock()
    recorder = new_recorder(store, writer, clock, kind="chat")
    assert recorder.begin_turn() == 1
    clock.at(1.0)
    first = recorder.user_audio((tone(0.5) * 32767).astype(np.int16), RATE)
    second = recorder.user_audio(tone(0.25, rate=16_000), 16_000, t_start=2.0)
    assert (first, second) == ("user_audio/turn001.wav", "user_audio/turn001_2.wav")
    assert recorder.user_image(PNG, "image/png; charset=binary") == "user_images/turn001_1.png"
    with pytest.raises(ValueError, match="mime"):
        recorder.user_image(PNG, "image/svg+xml")
    with pytest.raises(ValueError, match="not a image/jpeg"):
        recorder.user_image(PNG, "image/jpeg")
    with pytest.raises(ValueError, match="limit"):
        recorder.user_image(PNG, "image/png", max_image_bytes=10)
    recorder.ai_audio(tone(0.5, rate=16_000), 16_000)
    recorder.ai_audio(tone(0.5, rate=RATE), RATE)  # resampled to the first chunk's rate
    recorder.end_turn()
    recorder.finish()
    writer.flush(timeout=10)
    directory = store.session_dir(SID)
    turn = read_json(directory / "recording.json")["turns"][0]
    assert turn["user_audio"]["t_start"] == 1.0 and turn["user_audio_extra"][0]["t_start"] == 2.0
    assert wav_info(directory / first) == (1, RATE, pytest.approx(0.5))
    assert wav_info(directory / second) == (1, 16_000, pytest.approx(0.25))
    assert np.allclose(read_wav(directory / first)[0], tone(0.5), atol=1e-3)
    assert (directory / "user_images/turn001_1.png").read_bytes() == PNG
    assert turn["ai_audio"][0]["sample_rate"] == 16_000
    assert wav_info(directory / "ai_audio/turn001.wav") == (1, 16_000, pytest.approx(1.0))


def test_user_videos_are_checked_and_numbered_per_turn(store: SessionStore, writer: RecordingWriter) -> None:
    webm = b"\x1a\x45\xdf\xa3" + b"\x00" * 60
    mp4 = b"\x00\x00\x00\x18ftypisom" + b"\x00" * 60
    recorder = new_recorder(store, writer, FakeClock(), kind="chat")
    recorder.begin_turn()
    assert recorder.user_video(mp4, "video/mp4") == "user_videos/turn001_1.mp4"
    assert recorder.user_video(webm, "video/webm; codecs=vp9") == "user_videos/turn001_2.webm"
    for data, mime, problem in ((mp4, "text/html", "mime"), (webm, "video/mp4", "not a video/mp4"),
                                (b"", "video/mp4", "empty")):
        with pytest.raises(ValueError, match=problem):
            recorder.user_video(data, mime)
    with pytest.raises(ValueError, match="limit"):
        recorder.user_video(mp4, "video/mp4", max_video_bytes=10)
    recorder.end_turn()
    recorder.finish()
    writer.flush(timeout=10)
    directory = store.session_dir(SID)
    turn = read_json(directory / "recording.json")["turns"][0]
    assert [v["path"] for v in turn["user_videos"]] == ["user_videos/turn001_1.mp4", "user_videos/turn001_2.webm"]
    assert (directory / "user_videos/turn001_2.webm").read_bytes() == webm


def test_drawn_images_are_checked_and_numbered_per_turn(store: SessionStore, writer: RecordingWriter) -> None:
    clock = FakeClock()
    recorder = new_recorder(store, writer, clock, kind="chat")
    header = PNG[:8] + (13).to_bytes(4, "big") + b"IHDR" + (8).to_bytes(4, "big") + (6).to_bytes(4, "big")
    clock.at(2.0)
    assert recorder.ai_image(header + b"\x08\x00\x00\x00\x00") == "ai_images/turn001.png"
    assert recorder.ai_image(PNG, "image/png; charset=binary") == "ai_images/turn001_2.png"
    for data, mime, match in ((PNG, "image/jpeg", "must be image/png"), (b"GIF89a....", "image/png", "not a"),
                              (b"", "image/png", "empty")):
        with pytest.raises(ValueError, match=match):
            recorder.ai_image(data, mime)
    with pytest.raises(ValueError, match="limit"):
        recorder.ai_image(PNG, max_image_bytes=len(PNG) - 1)
    assert recorder_module.MAX_AI_IMAGE_BYTES == 4 * 1024 * 1024
    recorder.end_turn()
    recorder.begin_turn()
    assert recorder.ai_image(PNG) == "ai_images/turn002.png"
    recorder.finish()
    writer.flush(timeout=10)
    directory = store.session_dir(SID)
    first, second = read_json(directory / "recording.json")["turns"]
    assert first["ai_images"][0] == {"path": "ai_images/turn001.png", "mime": "image/png",
                                     "size_bytes": len(header) + 5, "width": 8, "height": 6, "t": 2.0}
    assert "width" not in first["ai_images"][1]  # no IHDR chunk where it belongs: no size
    assert [i["path"] for i in second["ai_images"]] == ["ai_images/turn002.png"]
    assert (directory / "ai_images/turn001_2.png").read_bytes() == PNG
    assert not (directory / "merged_replay.wav").exists()


def test_finish_is_idempotent_and_closes_the_open_turn(store: SessionStore, writer: RecordingWriter) -> None:
    clock = FakeClock()
    recorder = new_recorder(store, writer, clock, kind="chat")
    recorder.user_text("hi")
    recorder.assistant_text("hel")
    recorder.assistant_text("lo")
    clock.at(3.0)
    recorder.finish("interrupted", "the gateway stopped")
    clock.at(4.0)
    recorder.finish("completed")
    writer.flush(timeout=10)
    directory = store.session_dir(SID)
    meta = read_json(directory / "meta.json")
    assert (meta["status"], meta["error"], meta["ended_at"]) == ("interrupted", "the gateway stopped", 1003.0)
    (turn,) = read_json(directory / "recording.json")["turns"]
    assert (turn["user_text"], turn["assistant_text"], turn["status"]) == ("hi", "hello", "cancelled")
    assert not (directory / "merged_replay.wav").exists()  # no audio, no replay
    assert recorder.finished


def test_argument_validation(store: SessionStore, writer: RecordingWriter) -> None:
    with pytest.raises(ValueError, match="kind"):
        SessionRecorder(store, SID, "video", writer=writer)
    recorder = new_recorder(store, writer)
    with pytest.raises(ValueError, match="status"):
        recorder.end_turn("done")
    with pytest.raises(ValueError, match="rate"):
        recorder.user_audio(tone(0.1), 0)


def test_event_bursts_are_coalesced(store: SessionStore, writer: RecordingWriter,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[str] = []
    original = recorder_module.atomic_write_bytes

    def counting(path: Path, data: bytes) -> None:
        writes.append(path.name)
        original(path, data)

    monkeypatch.setattr(recorder_module, "atomic_write_bytes", counting)

    async def main() -> None:
        recorder = new_recorder(store, writer)
        await asyncio.to_thread(writer.flush, 10)
        for i in range(300):
            recorder.event("tick", i=i)
        await asyncio.sleep(0.05)  # stays: the loop runs on for less than the write interval, so no rewrite yet
        await asyncio.to_thread(writer.flush, 10)
        path = store.session_dir(SID) / "recording.json"
        assert len(read_json(path)["events"]) < 300
        await wait_for_async(lambda: len(read_json(path)["events"]) == 300, 10, "the delayed rewrite wrote every event")
        await asyncio.to_thread(writer.flush, 10)

    asyncio.run(main())
    events = read_json(store.session_dir(SID) / "recording.json")["events"]
    assert [e["i"] for e in events] == list(range(300))
    assert 2 <= writes.count("recording.json") <= 4


# ---------------------------------------------------------------------------------------------- writer
def test_writer_keeps_lane_order_and_counts_failures() -> None:
    writer = RecordingWriter(max_workers=4)
    seen: dict[str, list[int]] = {"a": [], "b": []}

    def job(lane: str, i: int) -> None:
        time.sleep(0.001 * (i % 3))  # stays: jobs of different lengths, so lanes would overtake one another
        seen[lane].append(i)

    def fail() -> None:
        raise OSError("disk full")

    for i in range(40):
        writer.submit(job, "a", i, lane="a")
        writer.submit(job, "b", i, lane="b")
    writer.submit(fail, lane="a")
    writer.submit(fail)
    assert writer.flush(timeout=10)
    assert seen == {"a": list(range(40)), "b": list(range(40))}
    assert writer.errors == 2
    writer.close()
    assert writer.submit(job, "a", 99) is None and writer.errors == 3


def test_writer_flush_times_out_while_a_job_runs() -> None:
    writer = RecordingWriter(max_workers=1)
    release = threading.Event()
    writer.submit(release.wait, 5)
    assert writer.flush(timeout=0.05) is False
    release.set()
    assert writer.flush(timeout=5) is True
    writer.close()


# ---------------------------------------------------------------------------------------------- replay
def test_merged_replay_places_and_resamples_clips() -> None:
    user = [(0.5, tone(0.5), RATE), (2.0, (tone(0.25, rate=8000) * 32767).astype(np.int16), 8000)]
    ai = [(1.0, tone(1.0, 300.0, rate=16_000), 16_000)]
    replay = merged_replay(user, ai, rate=RATE)
    assert replay.dtype == np.float32 and replay.shape == (round(2.25 * RATE), 2)
    left, right = replay[:, 0], replay[:, 1]
    assert rms(left, 0.5, 1.0) > 0.3 and rms(right, 0.5, 0.99) < 1e-6
    assert rms(right, 1.01, 1.99) > 0.3 and rms(left, 1.01, 1.99) < 1e-6
    assert rms(left, 2.01, 2.24) > 0.3 and rms(left, 0.0, 0.49) < 1e-6
    assert np.allclose(left[round(0.5 * RATE):RATE], tone(0.5), atol=1e-6)


def test_merged_replay_sums_and_clips_overlaps() -> None:
    loud = np.full(RATE, 0.8, dtype=np.float32)
    replay = merged_replay([(0.0, loud, RATE), (0.5, loud, RATE)], [], rate=RATE)
    assert replay.shape == (round(1.5 * RATE), 2)
    assert np.allclose(replay[: RATE // 2, 0], 0.8) and np.allclose(replay[RATE // 2:RATE, 0], 1.0)
    assert not replay[:, 1].any()
    assert merged_replay([], []).shape == (0, 2)
    with pytest.raises(ValueError, match="rate"):
        merged_replay([(0.0, loud, 0)], [])
    with pytest.raises(ValueError, match="start"):
        merged_replay([], [(float("nan"), loud, RATE)])


def test_write_merged_replay_matches_and_can_be_cut(tmp_path: Path) -> None:
    user = [(0.25, tone(0.5), RATE)]
    ai = [(12.0, tone(0.5, 300.0), RATE)]  # beyond one 10 s write block
    path = write_merged_replay(tmp_path / "replay.wav", user, ai)
    with wave.open(str(path)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (2, 2, RATE)
        written = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").reshape(-1, 2) / 32767.0
    assert np.allclose(written, merged_replay(user, ai), atol=1e-4)
    cut = write_merged_replay(tmp_path / "cut.wav", user, ai, max_duration_s=1.0)
    assert wav_info(cut) == (2, RATE, 1.0)
