"""Recordings of live camera frames through a real gateway and toy worker: ``user_frames/`` with their times in
``recording.json``, ``merged_replay.mp4`` decoded with PyAV, and a session cut by killing the gateway that gets
its replays on the next cleanup pass (the restarted gateway's first), while a session its recorder still holds is
left alone."""

from __future__ import annotations

import base64
import io
import json
import math
import signal
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
from PIL import Image
from websockets.sync.client import ClientConnection, connect

from omnipipe.gateway.recording.cleanup import cleanup_sessions
from omnipipe.gateway.recording.recorder import SessionRecorder
from omnipipe.gateway.recording.store import SessionStore
from omnipipe.gateway.recording.user_frames import MAX_FRAME_BYTES
from omnipipe.gateway.recording.video_replay import VIDEO_REPLAY_FPS
from omnipipe.gateway.recording.writer import RecordingWriter
from tests.gateway.conftest import GatewayProcess, WorkerProcess, running
from tests.server.conftest import TOY_DEPLOY
from tests.waiting import wait_for

RATE = 24_000
PALETTE = {"red": (230, 20, 20), "green": (20, 200, 40), "blue": (20, 40, 230), "yellow": (240, 230, 20),
           "magenta": (220, 30, 220), "cyan": (30, 220, 230), "white": (245, 245, 245), "black": (0, 0, 0)}
SENT = ["red", "green", "blue", "yellow", "magenta", "cyan", "white"]
FRAME_SPACING_MS = 400.0
AAC_TOLERANCE_S = 0.1
"""The decoded AAC stream is whole 1024-sample frames (43 ms at 24 kHz) and may end on a padded one; 0.1 s holds
two such frames."""


def image_url(colour: str, mime: str = "image/jpeg", size: tuple[int, int] = (64, 48)) -> str:
    out = io.BytesIO()
    Image.new("RGB", size, PALETTE[colour]).save(out, format="PNG" if mime == "image/png" else "JPEG")
    return f"data:{mime};base64,{base64.b64encode(out.getvalue()).decode()}"


def nearest_colour(rgb: np.ndarray) -> str:
    return min(PALETTE, key=lambda name: float(np.sum((np.asarray(PALETTE[name]) - rgb) ** 2)))


def tone_b64(seconds: float, freq: float = 330.0) -> str:
    t = np.arange(round(seconds * RATE)) / RATE
    return base64.b64encode(np.round(0.4 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2").tobytes()).decode()


def recv(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(ws.recv(timeout=60))


def open_session(gateway: GatewayProcess) -> tuple[ClientConnection, str]:
    """A realtime session through the gateway, served: ``(connection, session id)``."""
    ws = connect(gateway.ws_url, max_size=None, open_timeout=30).__enter__()
    while (event := recv(ws))["type"] != "queue_done":
        assert event["type"] in ("queued", "queue_update"), event
    session_id = event["session_id"]
    assert recv(ws)["type"] == "session.created"
    send(ws, "session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    assert recv(ws)["type"] == "session.updated"  # the client commits its speech
    return ws, session_id


def send(ws: ClientConnection, kind: str, **fields: Any) -> None:
    ws.send(json.dumps({"type": kind, **fields}))


def send_frames_and_speech(ws: ClientConnection, colours: list[str]) -> None:
    """One frame per colour, ``FRAME_SPACING_MS`` apart in real time (PNG and JPEG by turns), with the user's
    microphone streaming beside them, committed at the end."""
    base_ms = 50_000.0  # the client's clock has its own origin
    for i, colour in enumerate(colours):
        send(ws, "input_video_frame.append", image=image_url(colour, "image/png" if i % 2 else "image/jpeg"),
             captured_at_ms=base_ms + i * FRAME_SPACING_MS)
        for _ in range(4):
            send(ws, "input_audio_buffer.append", audio=tone_b64(0.1))
            time.sleep(FRAME_SPACING_MS / 4000)
    send(ws, "input_audio_buffer.commit")


def send_refused_frames(ws: ClientConnection) -> None:
    """Frames the worker refuses and the recording leaves out (none may end the session)."""
    big = Image.fromarray(np.random.default_rng(0).integers(0, 255, (700, 700, 3), dtype=np.uint8))
    out = io.BytesIO()
    big.save(out, format="PNG")
    assert len(out.getvalue()) > MAX_FRAME_BYTES
    for image, captured_at_ms in [
            ("data:image/png;base64," + base64.b64encode(out.getvalue()).decode(), 90_000.0),  # too large
            ("data:text/plain;base64," + base64.b64encode(b"hello").decode(), 90_000.0),  # not an image
            ("data:image/gif;base64,R0lGODlhAQABAAAAACw=", 90_000.0),  # a type frames are not
            ("data:image/jpeg;base64,not base64!", 90_000.0),
            (image_url("black", "image/png").replace("image/png", "image/jpeg"), 90_000.0),  # PNG bytes named JPEG
            (image_url("black"), 40_000.0)]:  # captured before the previous frame
        send(ws, "input_video_frame.append", image=image, captured_at_ms=captured_at_ms)


def ask_for_speech(ws: ClientConnection) -> float:
    """A spoken answer; waits as long as it plays (as a client playing it would) and returns its length."""
    send(ws, "conversation.item.create", item={"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "what do you see"}]})
    send(ws, "response.create", response={"output_modalities": ["audio"]})
    audio_bytes = 0
    while (event := recv(ws))["type"] != "response.done":
        if event["type"] == "response.output_audio.delta":
            audio_bytes += len(base64.b64decode(event["delta"]))
    assert event["response"]["status"] == "completed", event
    seconds = audio_bytes / 2 / RATE
    assert seconds > 0.2
    time.sleep(seconds + 0.3)
    return seconds


def session_data(gateway: GatewayProcess, session_id: str) -> dict[str, Any]:
    return httpx.get(f"{gateway.url}/api/sessions/{session_id}", timeout=10).json()


def decoded_replay(path: Path) -> tuple[list[str], float, np.ndarray]:
    """The colour of every video frame, the audio stream's length in seconds and its samples ``[2, n]``."""
    with av.open(str(path)) as container:
        assert container.streams.video[0].average_rate == VIDEO_REPLAY_FPS
        colours = [nearest_colour(frame.to_ndarray(format="rgb24").reshape(-1, 3).mean(axis=0))
                   for frame in container.decode(video=0)]
    with av.open(str(path)) as container:
        audio = np.concatenate([frame.to_ndarray() for frame in container.decode(audio=0)], axis=1)
        assert container.streams.audio[0].channels == 2
    return colours, audio.shape[1] / RATE, audio


def runs(colours: list[str]) -> list[str]:
    return [c for i, c in enumerate(colours) if i == 0 or colours[i - 1] != c]


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    worker = WorkerProcess("toy", tmp_path_factory.mktemp("frames-worker"), capacity=2, deploy=TOY_DEPLOY)
    with running(worker):
        worker.wait_state("IDLE", 120)
        yield worker


@pytest.mark.slow  # a worker and a gateway, ~8 s
def test_frames_are_recorded_and_replayed_as_video_with_the_sessions_audio(worker: WorkerProcess,
                                                                          tmp_path: Path) -> None:
    gateway = GatewayProcess([worker.address], tmp_path)
    with running(gateway):
        gateway.wait_ready(60)
        ws, session_id = open_session(gateway)
        send_frames_and_speech(ws, SENT[:4])
        send_refused_frames(ws)
        last_ms = 50_000.0 + 3 * FRAME_SPACING_MS
        send(ws, "input_video_frame.append", image=image_url("black"), captured_at_ms=last_ms + 100)  # too soon
        for i, colour in enumerate(SENT[4:]):  # the capture clock goes on from the fourth frame
            time.sleep(FRAME_SPACING_MS / 1000)
            send(ws, "input_video_frame.append", image=image_url(colour, "image/png"),
                 captured_at_ms=50_000.0 + (4 + i) * FRAME_SPACING_MS)
        ask_for_speech(ws)
        ws.close()
        data = wait_for(lambda: (d := session_data(gateway, session_id)) and d["meta"]["status"] == "completed"
                        and "merged_replay.mp4" in d["files"] and d, 60, "the session's replays",
                        detail=lambda: session_data(gateway, session_id))
        directory = gateway.data_dir / "sessions" / session_id

    frames = data["recording"]["frames"]
    assert [f["path"] for f in frames] == [f"user_frames/{i:06d}.jpg" for i in range(1, len(SENT) + 1)]
    assert [f["captured_at_ms"] for f in frames] == [50_000.0 + i * FRAME_SPACING_MS for i in range(len(SENT))]
    times = [f["t"] for f in frames]  # placed by capture time: the client's spacing, from the first arrival
    assert np.allclose(np.diff(times), FRAME_SPACING_MS / 1000, atol=0.002), times
    assert 0 < times[0] < times[-1] < data["meta"]["ended_at"] - data["meta"]["created_at"]
    for frame, colour in zip(frames, SENT, strict=True):  # PNGs were converted: every file is a JPEG
        with Image.open(directory / frame["path"]) as image:
            assert image.format == "JPEG" and image.size == (64, 48)
            assert nearest_colour(np.asarray(image.convert("RGB")).reshape(-1, 3).mean(axis=0)) == colour
    assert sorted(p.name for p in (directory / "user_frames").iterdir()) == [Path(f["path"]).name for f in frames]

    colours, audio_s, audio = decoded_replay(directory / "merged_replay.mp4")
    replay_s = replay_length(directory, data)
    assert abs(audio_s - replay_s) < AAC_TOLERANCE_S, (audio_s, replay_s)
    assert len(colours) == math.ceil(replay_s * VIDEO_REPLAY_FPS - 1e-6)  # the video spans the replay too
    assert runs(colours) == ["black", *SENT]  # black until the first frame, then each frame sent, in order
    for frame, colour in zip(frames, SENT, strict=True):  # each from its time on
        assert colours[math.ceil(frame["t"] * VIDEO_REPLAY_FPS - 1e-6)] == colour
    user_clip = data["recording"]["turns"][0]["user_audio"]
    start = round((user_clip["t_start"] + 0.1) * RATE)
    assert np.sqrt(np.mean(audio[0, start:start + RATE // 2] ** 2)) > 0.1  # the microphone, on the left
    ai_clip = data["recording"]["turns"][-1]["ai_audio"][0]
    start = round(ai_clip["t_start"] * RATE)
    assert np.abs(audio[1, start:start + round(ai_clip["duration_s"] * RATE)]).max() > 0.05  # the answer, right


def replay_length(directory: Path, data: dict[str, Any]) -> float:
    """How long the replay is documented to last (``video_replay.replay_duration``): the session, or longer to the
    end of the audio mix (an answer whose audio came faster than it plays can end after the session did) or the
    last frame's slot."""
    with wave.open(str(directory / "merged_replay.wav"), "rb") as mixed:
        mix_s = mixed.getnframes() / mixed.getframerate()
    frames = data["recording"]["frames"]
    last_slot_s = frames[-1]["t"] + 1 / VIDEO_REPLAY_FPS if frames else 0.0
    return max(data["meta"]["ended_at"] - data["meta"]["created_at"], mix_s, last_slot_s)


@pytest.mark.slow  # a worker and a gateway, ~8 s
def test_a_session_cut_by_a_gateway_crash_gets_its_replays_on_the_next_cleanup_pass(worker: WorkerProcess,
                                                                                    tmp_path: Path) -> None:
    gateway = GatewayProcess([worker.address], tmp_path)
    with running(gateway):
        gateway.wait_ready(60)
        ws, session_id = open_session(gateway)
        send_frames_and_speech(ws, SENT[:3])
        ask_for_speech(ws)
        directory = gateway.data_dir / "sessions" / session_id
        wait_for(lambda: len(list((directory / "user_frames").glob("*.jpg"))) == 3, 30, "the frames on disk")
        gateway.process.send_signal(signal.SIGKILL)
        gateway.process.wait(30)
    meta = json.loads((directory / "meta.json").read_text())
    assert meta["status"] == "recording" and meta["ended_at"] is None
    assert not (directory / "merged_replay.mp4").exists() and not (directory / "merged_replay.wav").exists()
    recorded = json.loads((directory / "recording.json").read_text())
    assert len(recorded["frames"]) == 3

    restarted = GatewayProcess([worker.address], tmp_path)  # the same data directory
    with running(restarted):
        restarted.wait_ready(60)
        data = wait_for(lambda: (d := session_data(restarted, session_id))["meta"]["status"] == "interrupted" and d,
                        60, "the cut session finished", detail=lambda: session_data(restarted, session_id))
    assert {"merged_replay.mp4", "merged_replay.wav"} <= set(data["files"])
    assert data["meta"]["error"] and data["meta"]["ended_at"] > data["meta"]["created_at"]
    colours, audio_s, _ = decoded_replay(directory / "merged_replay.mp4")
    assert runs(colours) == ["black", *SENT[:3]]
    replay_s = replay_length(directory, data)  # from the last moment the recording mentions
    assert abs(audio_s - replay_s) < AAC_TOLERANCE_S, (audio_s, replay_s)
    assert data["size_bytes"] == sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def test_the_cleanup_leaves_a_session_its_recorder_still_holds(tmp_path: Path) -> None:
    store, writer = SessionStore(tmp_path), RecordingWriter()
    session_id = "20260101-000000_voice_live000001"
    recorder = SessionRecorder(store, session_id, "voice", writer=writer)
    recorder.user_frame(base64.b64decode(image_url("red").split(",", 1)[1]), "image/jpeg", t=0.1,
                        captured_at_ms=0.0)
    assert writer.flush(timeout=30)
    report = cleanup_sessions(store, retention_days=None, max_storage_gb=None)  # not protected: the lock keeps it
    assert report.finished == [] and store.list_sessions()[0].status == "recording"
    recorder.finish()
    writer.close(timeout=60)
    assert store.list_sessions()[0].status == "completed"
    assert "merged_replay.mp4" in store.read_session(session_id)["files"]
    assert cleanup_sessions(store, retention_days=None, max_storage_gb=None).finished == []
