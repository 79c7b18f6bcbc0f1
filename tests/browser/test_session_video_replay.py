"""The session viewer plays a live session's video replay (``merged_replay.mp4``) in a ``<video>``, and keeps the
audio replay for a session without camera frames. The sessions are recorded by the gateway's own recorder and
realtime tap, from the events a client would send, into a real gateway's data directory."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import numpy as np
import pytest
from PIL import Image

from omnipipe.gateway.recording.recorder import SessionRecorder
from omnipipe.gateway.recording.store import SessionStore
from omnipipe.gateway.recording.taps import RealtimeTap
from omnipipe.gateway.recording.writer import RecordingWriter
from tests.browser.conftest import Stack, expect, screenshot

pytestmark = pytest.mark.browser
RATE = 24_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_767_225_600.0

    def __call__(self) -> float:
        return self.now


def frame_url(rgb: tuple[int, int, int]) -> str:
    out = io.BytesIO()
    Image.new("RGB", (160, 120), rgb).save(out, format="JPEG")
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()


def tone_b64(seconds: float, freq: float) -> str:
    t = np.arange(round(seconds * RATE)) / RATE
    return base64.b64encode(np.round(0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2").tobytes()).decode()


def record_session(stack: Stack, session_id: str, *, with_frames: bool) -> None:
    """A 4-second live session: the user speaks for 1 s (with camera frames, red then green, if ``with_frames``) and
    the model answers for 1.5 s."""
    clock = Clock()
    writer = RecordingWriter()
    recorder = SessionRecorder(SessionStore(stack.gateway.data_dir), session_id, "voice", writer=writer, clock=clock)
    tap = RealtimeTap(recorder)
    start = clock.now
    for i in range(10):
        clock.now = start + 0.2 + i * 0.1
        if with_frames and i % 5 == 0:
            tap.on_client_event(json.dumps({"type": "input_video_frame.append", "captured_at_ms": 1000.0 + i * 100,
                                            "image": frame_url((220, 20, 20) if i == 0 else (20, 200, 40))}))
        tap.on_client_event(json.dumps({"type": "input_audio_buffer.append", "audio": tone_b64(0.1, 330)}))
    tap.on_client_event(json.dumps({"type": "input_audio_buffer.commit"}))
    clock.now = start + 1.5
    tap.on_server_event(json.dumps({"type": "response.created", "response": {"id": "resp_1"}}))
    tap.on_server_event(json.dumps({"type": "response.output_audio.delta", "delta": tone_b64(1.5, 550)}))
    clock.now = start + 3.0
    tap.on_server_event(json.dumps({"type": "response.done", "response": {"id": "resp_1", "status": "completed"}}))
    clock.now = start + 4.0
    tap.close()
    writer.close(timeout=60)


def test_session_viewer_plays_the_video_replay(bare_gateway: Stack, new_page: Any) -> None:
    session_id = "20260101-000000_voice_video00001"
    record_session(bare_gateway, session_id, with_frames=True)
    page = new_page()
    page.goto(f"{bare_gateway.url}/s/{session_id}")
    video = page.locator("#replay video")
    expect(video).to_have_count(1)
    expect(page.locator("#replay audio")).to_have_count(0)
    assert video.get_attribute("src").endswith("/files/merged_replay.mp4")
    page.wait_for_function("document.querySelector('#replay video').readyState >= 1", timeout=20_000)
    assert page.evaluate("document.querySelector('#replay video').duration") == pytest.approx(4.0, abs=0.1)
    assert page.evaluate("document.querySelector('#replay video').videoWidth") == 160
    page.evaluate("(v => { v.muted = true; return v.play(); })(document.querySelector('#replay video'))")
    page.wait_for_function("document.querySelector('#replay video').currentTime > 0.6", timeout=20_000)
    assert page.evaluate("document.querySelector('#replay video').readyState") >= 2  # a picture to show
    assert page.evaluate("document.querySelector('#replay video').error") is None
    page.evaluate("document.querySelector('#replay video').pause()")
    page.locator("#replay video").scroll_into_view_if_needed()
    screenshot(page, "session-video-replay")


def test_session_viewer_keeps_the_audio_replay_without_frames(bare_gateway: Stack, new_page: Any) -> None:
    session_id = "20260101-000000_voice_audio00001"
    record_session(bare_gateway, session_id, with_frames=False)
    page = new_page()
    page.goto(f"{bare_gateway.url}/s/{session_id}")
    expect(page.locator("#replay audio")).to_have_count(1)
    expect(page.locator("#replay video")).to_have_count(0)
    assert page.locator("#replay audio").get_attribute("src").endswith("/files/merged_replay.wav")
    expect(page.locator("#files")).not_to_contain_text("merged_replay.mp4")
