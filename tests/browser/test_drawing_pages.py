"""Answers that draw, on the chat and session pages: previews of the image being drawn replace one another, the
finished image stays in the conversation and in the recording.

The first tests fake the worker's answers in the browser (Playwright routes; no model needed); the last one asks a
real ``omnipipe worker --pipeline think-and-draw`` behind a gateway."""

from __future__ import annotations

import base64
import json
import struct
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from omnipipe.gateway.recording.recorder import SessionRecorder
from omnipipe.gateway.recording.store import SessionStore
from omnipipe.gateway.recording.taps import ChatTap
from omnipipe.gateway.recording.writer import RecordingWriter
from tests.browser.conftest import Stack, expect, screenshot, small_png

pytestmark = pytest.mark.browser
ANSWER_TIMEOUT_MS = 180_000
SPIDER = "Draw the number of legs a spider has."
DRAWING_MODEL = {"object": "list", "data": [{
    "id": "think-and-draw", "object": "model", "created": 1, "owned_by": "omnipipe", "input_modalities": ["text"],
    "output_modalities": ["image", "text"], "conversation": True}]}


def data_url(png: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(png).decode()}"


def png_size(url: str) -> tuple[int, int]:
    """Width and height of the PNG in a data URL (its IHDR chunk)."""
    header, _, payload = url.partition(",")
    assert header == "data:image/png;base64", header
    data = base64.b64decode(payload, validate=True)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def tmp_screenshot(page: Any, name: str) -> Path:
    """A full-page screenshot in the temporary directory ($TMPDIR), beside the usual one in test-artifacts."""
    screenshot(page, name)
    path = Path(tempfile.gettempdir()) / "omnipipe-screenshots" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    return path


def sse(*payloads: dict[str, Any] | str) -> str:
    return "".join(f"data: {p if isinstance(p, str) else json.dumps(p)}\n\n" for p in payloads)


def chunk(**delta: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "think-and-draw",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def image(url: str, step: int | None = None, steps: int | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url}}
    if step is not None:
        part.update(step=step, steps=steps)
    return part


def wait_turns(page: Any, count: int, timeout_ms: int = ANSWER_TIMEOUT_MS) -> dict[str, Any]:
    page.wait_for_function(f"() => window.omnipipeChat.turnsCompleted >= {count}", timeout=timeout_ms)
    return page.evaluate("() => ({...window.omnipipeChat})")


# ---------------------------------------------------------------------------------------------- faked answers
def test_chat_shows_previews_then_the_finished_image_and_an_error_mid_drawing(bare_gateway: Stack,
                                                                             new_page: Any) -> None:
    previews = [data_url(small_png(8 + i)) for i in range(3)]
    final = data_url(small_png(8))
    answers = [
        sse(chunk(role="assistant", content=""), chunk(content="A spider has "), chunk(content="eight legs."),
            *(chunk(images=[image(url, 10 * (i + 1), 50)]) for i, url in enumerate(previews)),
            chunk(images=[image(final)]),
            {**chunk(), "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, "[DONE]"),
        sse(chunk(content="Four."), chunk(images=[image(previews[0], 10, 50)]),
            {"error": {"message": "the diffusion stage failed", "type": "server_error", "code": "engine_error"}}),
    ]
    bodies: list[dict[str, Any]] = []

    def answer(route: Any) -> None:
        bodies.append(route.request.post_data_json)
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=answers[len(bodies) - 1])

    page = new_page()
    page.route("**/v1/models", lambda route: route.fulfill(status=200, json=DRAWING_MODEL))
    page.route("**/v1/chat/completions", answer)
    page.goto(bare_gateway.url + "/chat")
    page.wait_for_function("() => document.body.dataset.capabilities === 'known'")
    expect(page.locator("#placeholder")).to_contain_text("drawing")
    page.get_by_label("Your message").fill(SPIDER)
    page.get_by_role("button", name="Send").click()
    hooks = wait_turns(page, 1, 30_000)
    assert hooks["lastError"] is None and hooks["lastAnswer"] == "A spider has eight legs."
    assert (hooks["previewsReceived"], hooks["imagesReceived"], hooks["lastImage"]) == (3, 1, final)
    assert bodies[0]["modalities"] == ["text", "image"] and "audio" not in bodies[0]
    assert bodies[0]["omnipipe"] == {"sampling_params": {"diffusion": {"extra": {"preview_every": 10}}}}
    first = page.locator(".msg.assistant").first
    expect(first.locator(".bubble")).to_have_text("A spider has eight legs.")
    expect(first.locator("img")).to_have_count(1)  # each preview replaced the last, then the finished image did
    drawn = first.locator("img[data-image=final]")
    expect(drawn).to_have_attribute("src", final)
    assert drawn.evaluate("img => getComputedStyle(img).imageRendering") == "pixelated"
    assert drawn.evaluate("img => img.getBoundingClientRect().width") >= 128
    expect(first.get_by_role("link", name="Save the image")).to_have_attribute("download", "drawing.png")
    expect(first.locator("[data-metrics]")).to_contain_text("Image")

    # an error after a preview: the answer reads as an error, the preview stays marked as unfinished; the first
    # answer went along as its text only
    page.get_by_label("Your message").fill("Draw the number of legs a dog has.")
    page.get_by_role("button", name="Send").click()
    hooks = wait_turns(page, 2, 30_000)
    assert bodies[1]["messages"] == [{"role": "user", "content": SPIDER},
                                     {"role": "assistant", "content": "A spider has eight legs."},
                                     {"role": "user", "content": "Draw the number of legs a dog has."}]
    assert "diffusion stage failed" in hooks["lastError"]
    assert (hooks["previewsReceived"], hooks["imagesReceived"]) == (4, 1)
    second = page.locator(".msg.assistant").last
    expect(second).to_have_class("msg assistant error")
    expect(second.locator(".bubble")).to_contain_text("No answer.")
    expect(second.locator(".bubble")).to_contain_text("diffusion stage failed")
    expect(second.locator("figure.drawing.unfinished")).to_contain_text("Not finished")
    expect(second.locator("img[data-image=final]")).to_have_count(0)
    expect(first.locator("img[data-image=final]")).to_have_attribute("src", final)  # the first image stays
    tmp_screenshot(page, "chat-drawing-faked")


def test_an_image_only_answer_hides_the_empty_bubble(bare_gateway: Stack, new_page: Any) -> None:
    model = {"object": "list", "data": [{**DRAWING_MODEL["data"][0], "id": "image", "output_modalities": ["image"],
                                         "conversation": False}]}
    final = data_url(small_png(8))
    sent: list[dict[str, Any]] = []

    def answer(route: Any) -> None:
        sent.append(route.request.post_data_json)
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"},
                      body=sse(chunk(images=[image(final, 25, 50)]), chunk(images=[image(final)]), "[DONE]"))

    page = new_page()
    page.route("**/v1/models", lambda route: route.fulfill(status=200, json=model))
    page.route("**/v1/chat/completions", answer)
    page.goto(bare_gateway.url + "/chat")
    page.wait_for_function("() => document.body.dataset.capabilities === 'known'")
    page.get_by_label("Your message").fill("draw a seven")
    page.get_by_role("button", name="Send").click()
    hooks = wait_turns(page, 1, 30_000)
    assert hooks["lastError"] is None and hooks["imagesReceived"] == 1
    assert sent[0]["modalities"] == ["image"]  # all the model answers with
    message = page.locator(".msg.assistant").last
    expect(message.locator(".bubble")).to_be_hidden()
    expect(message.locator("img[data-image=final]")).to_be_visible()
    expect(message.locator("[data-metrics]")).not_to_contain_text("TTFT")


def test_the_session_page_shows_the_drawn_image_of_a_recording(bare_gateway: Stack, new_page: Any) -> None:
    store = SessionStore(bare_gateway.gateway.data_dir)
    session_id = store.new_session_id("chat")
    writer = RecordingWriter()
    try:
        tap = ChatTap(SessionRecorder(store, session_id, "chat", writer=writer))
        tap.on_request({"stream": True, "modalities": ["text", "image"],
                        "messages": [{"role": "user", "content": SPIDER}]})
        for data in (chunk(content="A spider has eight legs."), chunk(images=[image(data_url(small_png(16)), 10, 50)]),
                     chunk(images=[image(data_url(small_png(8)))])):
            tap.on_sse_data(json.dumps(data))
        tap.end("completed")
        tap.recorder.finish()
        assert writer.flush(timeout=10) and writer.errors == 0
    finally:
        writer.close()
    page = new_page()
    page.goto(f"{bare_gateway.url}/s/{session_id}")
    turn = page.locator(".turn").first
    expect(turn.locator(".part.assistant .text")).to_have_text("A spider has eight legs.")
    drawn = turn.locator(".part.assistant img.drawn")
    expect(drawn).to_have_count(1)  # the finished image; the preview was not recorded
    expect(drawn).to_have_attribute("src", f"/api/sessions/{session_id}/files/ai_images/turn001.png")
    page.wait_for_function("() => document.querySelector('.turn img.drawn').naturalWidth > 0")
    assert drawn.evaluate("img => [img.naturalWidth, img.getBoundingClientRect().width]") == [8, 192]
    expect(turn.locator("figure.drawing figcaption")).to_contain_text("8×8 px")
    expect(page.locator("#files")).to_contain_text("ai_images/turn001.png")


# ---------------------------------------------------------------------------------------------- a real worker
@pytest.mark.models
def test_think_and_draw_draws_in_the_chat_and_the_recording_keeps_the_image(drawing_stack: Stack,
                                                                           new_page: Any) -> None:
    models = httpx.get(f"{drawing_stack.url}/v1/models", timeout=30).json()["data"]
    assert "image" in models[0]["output_modalities"]
    page = new_page()
    page.goto(drawing_stack.url + "/chat")
    page.wait_for_function("() => document.body.dataset.capabilities === 'known'")
    expect(page.get_by_role("switch", name="Speak the answer")).to_be_hidden()  # it does not speak
    page.get_by_label("Your message").fill(SPIDER)
    with page.expect_request("**/v1/chat/completions") as sent:
        page.get_by_role("button", name="Send").click()
    body = sent.value.post_data_json
    assert body["stream"] is True and body["modalities"] == ["text", "image"]
    assert body["omnipipe"]["sampling_params"]["diffusion"]["extra"]["preview_every"] == 10

    hooks = wait_turns(page, 1)
    assert hooks["lastError"] is None, hooks["lastError"]
    answer = page.locator(".msg.assistant").last
    text = answer.locator(".bubble").inner_text().strip()
    assert text and text == hooks["lastAnswer"].strip()
    assert "eight" in text.lower() or "8" in text, text
    assert hooks["previewsReceived"] >= 1 and hooks["imagesReceived"] == 1
    drawn = answer.locator("img[data-image=final]")
    expect(drawn).to_have_count(1)
    src = drawn.get_attribute("src")
    assert src == hooks["lastImage"] and png_size(src) == (8, 8)
    assert drawn.evaluate("img => img.complete && img.naturalWidth") == 8
    assert drawn.evaluate("img => getComputedStyle(img).imageRendering") == "pixelated"
    session_id = hooks["sessionId"]
    assert session_id
    chat_shot = tmp_screenshot(page, "chat-think-and-draw")
    (chat_shot.parent / "drawn-think-and-draw.png").write_bytes(base64.b64decode(src.partition(",")[2]))

    # the session page shows the recorded image: the very bytes the chat got
    page.goto(f"{drawing_stack.url}/s/{session_id}")
    turn = page.locator(".turn").first
    expect(turn.locator(".part.assistant")).to_contain_text(text)
    recorded = turn.locator(".part.assistant img.drawn")
    expect(recorded).to_have_count(1)
    file_path = f"/api/sessions/{session_id}/files/ai_images/turn001.png"
    expect(recorded).to_have_attribute("src", file_path)
    page.wait_for_function("() => document.querySelector('.turn img.drawn').naturalWidth > 0")
    assert recorded.evaluate("img => img.naturalWidth") == 8
    expect(turn.locator("figure.drawing figcaption")).to_contain_text("8×8 px")
    stored = httpx.get(drawing_stack.url + file_path, timeout=30)
    assert stored.status_code == 200 and stored.headers["content-type"] == "image/png"
    assert stored.content == base64.b64decode(src.partition(",")[2])
    session_shot = tmp_screenshot(page, "session-think-and-draw")
    print(f"screenshots: {chat_shot} {session_shot}; {hooks['previewsReceived']} previews; answer {text!r}")
