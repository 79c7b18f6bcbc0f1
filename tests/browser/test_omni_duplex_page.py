"""The omni page (camera and microphone in one live session) in Chromium with a fake camera and a fake microphone.

Against one ``omnipipe worker --pipeline default`` behind a gateway: the fake camera plays a generated clip, red for
its first half and blue for its second (Chromium loops it), and the fake microphone asks "What colour do you see?"
once while each colour shows. The frames the page sends go with each question (the server lists them in the user
item); every answer is transcribed from the audio the page received and names the colour of its question's frames,
red then blue. The session's recording keeps the frames sent (``user_frames/``) and replays them as
``merged_replay.mp4`` with the session's audio, which the session page plays. Talking over an answer stops it; a
frame the server refuses is shown as a plain error while the session goes on. Without a model that takes images the
page (and its links) are not offered."""

from __future__ import annotations

import base64
import io
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.browser.conftest import RATE, Stack, expect, launch_chromium, screenshot, silence, speech, write_wav

pytestmark = [pytest.mark.browser, pytest.mark.models]
QUESTION = "What colour do you see?"
RED, BLUE = (200, 30, 30), (30, 70, 200)  # as the default thinker's colour names have them
CAMERA_FPS = 4
CAMERA_SIZE = (160, 120)
QUESTION_AT_S = 3.0  # the session is live by then (the page keeps the last second said before it is)
SECOND_QUESTION_AFTER_SWITCH_S = 4.5  # blue frames, one a second, before and while the second question is asked
ANSWER_TIMEOUT_MS = 240_000


def write_y4m(path: Path, *scenes: tuple[tuple[int, int, int], float]) -> Path:
    """A raw 4:2:0 Y4M clip (what Chromium's fake camera plays): each scene an RGB colour held for some seconds."""
    width, height = CAMERA_SIZE
    header = f"YUV4MPEG2 W{width} H{height} F{CAMERA_FPS}:1 Ip A1:1 C420jpeg\n".encode()
    frames = []
    for (red, green, blue), seconds in scenes:
        # full-range BT.601 (JPEG's), which C420jpeg names
        y = 0.299 * red + 0.587 * green + 0.114 * blue
        cb = 128 - 0.168736 * red - 0.331264 * green + 0.5 * blue
        cr = 128 + 0.5 * red - 0.418688 * green - 0.081312 * blue
        planes = (np.full(width * height, round(y), np.uint8).tobytes()
                  + np.full(width * height // 4, round(cb), np.uint8).tobytes()
                  + np.full(width * height // 4, round(cr), np.uint8).tobytes())
        frames += [b"FRAME\n" + planes] * round(seconds * CAMERA_FPS)
    path.write_bytes(header + b"".join(frames))
    return path


def main_colour(data_url: str) -> str:
    """The main colour of a frame the page sent (a JPEG data URL): "red" or "blue"."""
    header, _, payload = data_url.partition(",")
    assert header == "data:image/jpeg;base64", header
    with Image.open(io.BytesIO(base64.b64decode(payload))) as image:
        mean = np.asarray(image.convert("RGB"), dtype=np.float64).mean(axis=(0, 1))
    distances = {name: float(np.sum((mean - np.array(rgb)) ** 2)) for name, rgb in (("red", RED), ("blue", BLUE))}
    return min(distances, key=distances.__getitem__)


class Wire:
    """What went over the page's realtime WebSocket: the frames sent (capture time -> data URL) and each answer's
    audio as received (response id -> pcm16 bytes)."""

    def __init__(self, page: Any) -> None:
        self.frames: dict[float, str] = {}
        self.audio: dict[str, bytearray] = {}
        page.on("websocket", self._watch)

    def _watch(self, socket: Any) -> None:
        socket.on("framesent", self._sent)
        socket.on("framereceived", self._received)

    def _sent(self, payload: str | bytes) -> None:
        event = json.loads(payload)
        if event.get("type") == "input_video_frame.append":
            self.frames[float(event["captured_at_ms"])] = event["image"]

    def _received(self, payload: str | bytes) -> None:
        event = json.loads(payload)
        if event.get("type") == "response.output_audio.delta":
            self.audio.setdefault(event["response_id"], bytearray()).extend(base64.b64decode(event["delta"]))


def transcribe(stack: Stack, pcm16: bytes | bytearray, scratch: Path) -> str:
    """What the worker's transcription pipeline hears in 24 kHz pcm16 audio (written to ``scratch`` as a WAV)."""
    wav = write_wav(scratch, np.frombuffer(bytes(pcm16), dtype="<i2"))
    reply = httpx.post(f"http://{stack.workers[0].address}/v1/audio/transcriptions", timeout=300,
                       data={"model": "asr"}, files={"file": ("answer.wav", wav.read_bytes(), "audio/wav")})
    assert reply.status_code == 200, reply.text
    return str(reply.json()["text"])


def answer_seconds(stack: Stack) -> float:
    """How long the worker takes to answer the question about a red picture, in speech: it sizes the gap between
    the two spoken questions (the first answer must be complete before the second question starts). Asked in
    writing: chat completions take a picture only with a written question."""
    buffer = io.BytesIO()
    Image.new("RGB", CAMERA_SIZE, RED).save(buffer, "JPEG")
    picture = "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()
    started = time.monotonic()
    reply = httpx.post(f"http://{stack.workers[0].address}/v1/chat/completions", timeout=300, json={
        "model": "default", "modalities": ["text", "audio"], "audio": {"voice": "default", "format": "wav"},
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": picture}}]}]})
    assert reply.status_code == 200, reply.text
    return time.monotonic() - started


def omni_hooks(page: Any) -> dict[str, Any]:
    return page.evaluate("() => ({...window.omnipipeOmni})")


def completed_answers(page: Any) -> list[dict[str, Any]]:
    return page.evaluate("""() => window.omnipipeOmni.events
        .filter(e => e.type === 'response.done').map(e => e.response)""")


@pytest.fixture(scope="module")
def spoken_question(default_stack: Stack) -> np.ndarray:
    return speech(default_stack.workers[0], QUESTION)


@pytest.fixture(scope="module")
def camera_browser(playwright: Any) -> Iterator[Callable[[Path, Path], Any]]:
    """``camera_browser(y4m, wav)``: a Chromium whose fake camera loops ``y4m`` and whose fake microphone plays
    ``wav`` once, then silence."""
    launched: list[Any] = []

    def launch(y4m: Path, wav: Path) -> Any:
        browser = launch_chromium(playwright, f"--use-file-for-fake-video-capture={y4m}",
                                  f"--use-file-for-fake-audio-capture={wav}%noloop")
        launched.append(browser)
        return browser

    yield launch
    for browser in launched:
        browser.close()


def test_the_page_is_not_offered_for_a_model_that_takes_no_images(bare_gateway: Stack, new_page: Any) -> None:
    """No worker answers /v1/models here, so nothing says the model takes images: no link, and no session."""
    page = new_page()
    page.goto(bare_gateway.url + "/")
    expect(page.locator("main").get_by_role("link", name="Voice")).to_be_visible()
    expect(page.locator("#omni-link")).to_be_hidden()
    expect(page.get_by_role("navigation", name="Main").get_by_role("link", name="Omni")).to_have_count(0)
    page.goto(bare_gateway.url + "/omni")
    page.wait_for_function("() => document.body.dataset.capabilities === 'known'")
    expect(page.locator("#unsupported")).to_contain_text("takes no images or video")
    expect(page.get_by_role("button", name="Start")).to_be_hidden()
    expect(page.get_by_role("navigation", name="Main").locator("[aria-current=page]")).to_have_text("Omni")
    screenshot(page, "omni-not-offered")


def test_the_spoken_answer_names_the_colour_the_camera_shows(default_stack: Stack, spoken_question: np.ndarray,
                                                            camera_browser: Callable[[Path, Path], Any],
                                                            new_page: Any, tmp_path: Path) -> None:
    question_s = len(spoken_question) / RATE
    # the colour switches once the first answer is surely complete; the clip then loops back to red only after the
    # second question was asked
    switch_s = QUESTION_AT_S + question_s + 2 * answer_seconds(default_stack) + 8
    second_at_s = switch_s + SECOND_QUESTION_AFTER_SWITCH_S
    y4m = write_y4m(tmp_path / "red-then-blue.y4m", (RED, switch_s), (BLUE, switch_s))
    wav = write_wav(tmp_path / "two-questions.wav", silence(QUESTION_AT_S), spoken_question,
                    silence(second_at_s - QUESTION_AT_S - question_s), spoken_question, silence(3.0))
    page = new_page(camera_browser(y4m, wav))
    wire = Wire(page)

    page.goto(default_stack.url + "/")
    page.locator("main").get_by_role("link", name="Omni").click()
    expect(page).to_have_url(default_stack.url + "/omni")
    expect(page.get_by_role("navigation", name="Main").locator("[aria-current=page]")).to_have_text("Omni")
    page.wait_for_function("() => document.body.dataset.capabilities === 'known'")
    expect(page.locator("#unsupported")).to_be_hidden()
    page.get_by_role("switch", name="Mirror").check()
    expect(page.locator("#camera-preview")).to_have_class(re.compile(r"\bmirrored\b"))
    page.get_by_role("button", name="Start").click()
    page.wait_for_function("() => window.omnipipeOmni.framesSent.length >= 2", timeout=60_000)
    expect(page.locator("#state-label")).to_have_text("Listening")
    expect(page.locator("#frame-strip figure.frame").first).to_be_visible()
    screenshot(page, "omni-listening")

    page.wait_for_function(
        "() => window.omnipipeOmni.events.filter(e => e.type === 'response.done').length >= 2",
        timeout=ANSWER_TIMEOUT_MS)
    hooks = omni_hooks(page)
    answers = completed_answers(page)
    assert [a["status"] for a in answers] == ["completed", "completed"], (answers, hooks["errors"])
    assert hooks["errors"] == [], hooks["errors"]
    assert hooks["interruptions"] == [], hooks["interruptions"]
    assert len(hooks["framesUsed"]) == 2, hooks["framesUsed"]
    expect(page.locator("#frame-strip figure.used").first).to_be_visible()
    expect(page.locator("#frame-strip figure.used figcaption").last).to_contain_text("turn 2")
    screenshot(page, "omni-two-answers")

    said = [t for t in hooks["transcript"] if t["role"] == "assistant"]
    for turn, (used, answer, written) in enumerate(zip(hooks["framesUsed"], answers, said, strict=True), start=1):
        assert used["captured_at_ms"], used
        # the frames that went with the question: every one was sent by the page, all of one colour
        colours = {main_colour(wire.frames[float(at)]) for at in used["captured_at_ms"]}
        assert len(colours) == 1, (turn, colours)
        colour = colours.pop()
        assert colour == ("red" if turn == 1 else "blue"), (turn, colour)
        heard = transcribe(default_stack, wire.audio[answer["id"]], tmp_path / f"answer-{turn}.wav")
        assert colour in heard.lower(), (turn, colour, heard, written["text"])
        assert colour in written["text"].lower(), (turn, colour, written["text"])

    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#state-label")).to_have_text("Session ended")
    expect(page.locator("#camera-preview")).to_have_js_property("srcObject", None)
    check_the_recording(default_stack, hooks["sessionId"], omni_hooks(page)["framesSent"], page)


def check_the_recording(stack: Stack, session_id: str, sent: list[dict[str, Any]], page: Any) -> None:
    """The omni session's recording: the frames the page sent, under user_frames/ with their capture times, and
    merged_replay.mp4 (the camera red, then blue; the session's audio), which the session page plays."""
    from omnipipe.gateway.recording.video_replay import VIDEO_REPLAY_FPS
    from tests.gateway.test_recording_frames import AAC_TOLERANCE_S, decoded_replay, runs
    from tests.waiting import wait_for

    def finished() -> dict[str, Any] | None:
        data = httpx.get(f"{stack.url}/api/sessions/{session_id}", timeout=30).json()
        return data if data["meta"]["status"] == "completed" and "merged_replay.mp4" in data["files"] else None

    data = wait_for(finished, 120, "the omni session's replay")
    recorded = [frame["captured_at_ms"] for frame in data["recording"]["frames"]]
    sent_at = [frame["captured_at_ms"] for frame in sent]
    assert recorded and set(recorded) <= set(sent_at) and len(recorded) >= len(sent_at) - 1, (recorded, sent_at)
    directory = stack.gateway.data_dir / "sessions" / session_id
    assert sorted(p.name for p in (directory / "user_frames").iterdir()) == \
        [Path(frame["path"]).name for frame in data["recording"]["frames"]]
    colours, audio_s, _ = decoded_replay(directory / "merged_replay.mp4")
    # the replay lasts the session, and at least until the last frame has had its slot and the audio has played
    # (video_replay.replay_duration): an answer whose audio came faster than it plays may end after the session did
    import wave

    with wave.open(str(directory / "merged_replay.wav"), "rb") as mixed:
        mix_s = mixed.getnframes() / mixed.getframerate()
    session_s = data["meta"]["ended_at"] - data["meta"]["created_at"]
    replay_s = max(session_s, mix_s, data["recording"]["frames"][-1]["t"] + 1 / VIDEO_REPLAY_FPS)
    assert abs(audio_s - replay_s) < AAC_TOLERANCE_S, (audio_s, session_s, replay_s)
    assert [c for c in runs(colours) if c != "black"] == ["red", "blue"], runs(colours)

    page.goto(f"{stack.url}/s/{session_id}")
    video = "document.querySelector('#replay video')"
    page.wait_for_function(f"{video} && {video}.readyState >= 1", timeout=20_000)
    page.evaluate(f"(v => {{ v.muted = true; return v.play(); }})({video})")
    page.wait_for_function(f"{video}.currentTime > 0.5", timeout=20_000)
    assert page.evaluate(f"{video}.error") is None
    screenshot(page, "omni-session-replay")


def test_talking_over_the_answer_stops_it_and_a_refused_frame_is_shown(default_stack: Stack,
                                                                       spoken_question: np.ndarray,
                                                                       camera_browser: Callable[[Path, Path], Any],
                                                                       new_page: Any, tmp_path: Path) -> None:
    interruption = speech(default_stack.workers[0], "Tell me more about it.")
    y4m = write_y4m(tmp_path / "red.y4m", (RED, 2.0))
    # the interruption starts 1 s after the question: past the VAD's 500 ms silence window (the answer is running
    # from then on) and before the short answer ("I see red.", under a second of audio) has played out; after 1.8 s,
    # as the voice page's test waits for its longer answer, a quick answer was sometimes already over
    wav = write_wav(tmp_path / "barge-in.wav", silence(QUESTION_AT_S), spoken_question, silence(1.0), interruption,
                    silence(3.0))
    page = new_page(camera_browser(y4m, wav))
    page.goto(default_stack.url + "/omni")
    page.get_by_label("Frame rate").select_option("2")
    page.get_by_role("button", name="Start").click()
    page.wait_for_function("() => window.omnipipeOmni.interruptions.length > 0", timeout=ANSWER_TIMEOUT_MS)
    assert page.evaluate("window.omnipipeOmni.state") != "speaking"  # quiet at once
    page.wait_for_function(
        "() => window.omnipipeOmni.events.filter(e => e.type === 'response.done').length >= 2",
        timeout=ANSWER_TIMEOUT_MS)
    hooks = omni_hooks(page)
    first = hooks["interruptions"][0]
    answers = completed_answers(page)
    if first["response_id"]:  # the answer was still being generated: the server cancelled it
        assert answers[0]["id"] == first["response_id"] and answers[0]["status"] == "cancelled", answers
        expect(page.locator("#transcript .msg.assistant .tag").first).to_have_text("interrupted")
    else:
        assert first["playing"], first
    assert answers[-1]["status"] == "completed", answers
    assert [t["role"] for t in hooks["transcript"]] == ["user", "assistant", "user", "assistant"]
    # at 2 frames a second: the frames sent are at least 250 ms apart (the server's limit), none refused
    sent = [f["captured_at_ms"] for f in hooks["framesSent"]]
    assert len(sent) >= 4 and min(np.diff(sent)) >= 250, sent
    assert hooks["errors"] == [], hooks["errors"]
    screenshot(page, "omni-barge-in")

    # a frame that is no image: the server's error is shown plainly, and the session goes on (its capture time is
    # well after the page's frames, so that the frame rate is not what is refused)
    page.evaluate("""async () => {
        const { sendEvent } = await import("/static/js/duplex-page.js");
        sendEvent({ type: "input_video_frame.append", image: "data:text/plain;base64,aGVsbG8=",
                    captured_at_ms: performance.now() + 10000 });
    }""")
    error = page.locator("#error")
    expect(error).to_be_visible(timeout=30_000)
    expect(error).to_contain_text("image")
    event = page.evaluate("window.omnipipeOmni.events.filter(e => e.type === 'error').at(-1)")
    assert event["error"]["param"] == "image" and event["error"]["code"] == "invalid_image", event
    expect(page.locator("#state-label")).to_have_text("Listening", timeout=30_000)  # once the answer has played
    screenshot(page, "omni-refused-frame")
    page.get_by_role("button", name="Pause").click()
    expect(page.locator("#state-label")).to_have_text("Paused")
    page.wait_for_function("() => window.omnipipeOmni.events.some(e => e.type === 'session.paused')")
    # the worker's pause timeout (session.paused pause_timeout_s), after which it ends the session
    expect(page.locator("#state-detail")).to_contain_text("ends the session")
    screenshot(page, "omni-paused")
    count = page.evaluate("window.omnipipeOmni.framesSent.length")
    page.wait_for_timeout(1500)
    assert page.evaluate("window.omnipipeOmni.framesSent.length") == count  # no frames while paused
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#state-label")).to_have_text("Session ended")
