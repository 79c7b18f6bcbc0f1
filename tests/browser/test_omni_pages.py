"""The chat page in front of an omni model (``qwen2_5_omni`` on a tiny checkpoint): it offers what the model takes
(images, audio and videos), sends an attached video as a ``video_url`` part with the file's very bytes, shows it in
the conversation, and the answer is the model's own for that request; the session's recording keeps the video."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.browser.conftest import Stack, expect, screenshot
from tests.models import media_files

pytestmark = [pytest.mark.browser, pytest.mark.models]


def test_a_video_goes_to_the_model_and_shows_in_the_conversation(omni_stack: Stack, new_page: Any,
                                                                  tmp_path: Path) -> None:
    frames = np.repeat(np.linspace(0, 255, 6, dtype=np.uint8)[:, None, None, None], 32, 1).repeat(32, 2).repeat(3, 3)
    video = tmp_path / "ramp.mp4"
    video.write_bytes(media_files.mp4(frames, fps=3))
    (tmp_path / "notes.txt").write_text("not a video")
    page = new_page()
    page.goto(omni_stack.url + "/chat")
    page.wait_for_function("() => document.body.dataset.capabilities === 'known'")
    for name in ("Video", "Image", "Audio file", "Record"):
        expect(page.get_by_role("button", name=name)).to_be_visible()
    expect(page.locator("#placeholder")).to_contain_text("attach a video")

    page.set_input_files("#video-file", str(tmp_path / "notes.txt"))
    expect(page.locator("#composer-error")).to_contain_text('"notes.txt" is not a video.')
    page.set_input_files("#video-file", str(video))
    expect(page.locator("#attachments .chip")).to_contain_text("ramp.mp4")
    page.get_by_role("switch", name="Speak the answer").set_checked(False)
    page.get_by_label("Your message").fill("what happens in this video")
    with page.expect_request("**/v1/chat/completions") as sent:
        page.get_by_role("button", name="Send").click()
    body = sent.value.post_data_json
    parts = body["messages"][-1]["content"]
    assert [p["type"] for p in parts] == ["text", "video_url"]
    header, _, payload = parts[1]["video_url"]["url"].partition(",")
    assert header == "data:video/mp4;base64" and base64.b64decode(payload) == video.read_bytes()
    page.wait_for_function("() => window.omnipipeChat.turnsCompleted >= 1", timeout=180_000)
    hooks = page.evaluate("() => ({...window.omnipipeChat})")
    assert hooks["lastError"] is None, hooks["lastError"]
    expect(page.locator(".msg.user video.thumb")).to_have_count(1)
    expect(page.locator("#attachments .chip")).to_have_count(0)
    shown = page.locator(".msg.assistant .bubble").last.inner_text().strip()
    screenshot(page, "chat-omni-video")

    # the same request straight to the worker: the model's answer for that video
    direct = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    worker = omni_stack.workers[0]
    answer = httpx.post(f"http://{worker.address}/v1/chat/completions", json=direct, timeout=180)
    assert answer.status_code == 200, answer.text
    want = answer.json()["choices"][0]["message"]["content"]
    assert want and shown == want.strip() and hooks["lastAnswer"].strip() == shown

    # the recording keeps the video: the session page plays the very file sent
    session_id = hooks["sessionId"]
    page.goto(f"{omni_stack.url}/s/{session_id}")
    recorded = page.locator(".turn .part.user video.sent-video")
    expect(recorded).to_have_count(1)
    path = f"/api/sessions/{session_id}/files/user_videos/turn001_1.mp4"
    expect(recorded).to_have_attribute("src", path)
    stored = httpx.get(omni_stack.url + path, timeout=30)
    assert stored.status_code == 200 and stored.content == video.read_bytes()
    assert stored.headers["content-type"] == "video/mp4"
    screenshot(page, "session-omni-video")
