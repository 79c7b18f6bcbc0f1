"""The chat, voice, session and admin pages against one ``omnipipe worker --pipeline default`` behind a gateway:
streamed text and speech, queue events, the session recording, the realtime voice session with Chromium's fake
microphone playing a spoken question."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.browser.conftest import ADMIN_TOKEN, Stack, expect, screenshot, silence, speech, write_wav
from tests.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.models]
QUESTION = "What is the capital of France?"
ANSWER_TIMEOUT_MS = 180_000
_made: dict[str, str] = {}  # session ids the tests made, for later tests in this module


def wait_turns(page: Any, count: int) -> dict[str, Any]:
    page.wait_for_function(f"() => window.omnipipeChat.turnsCompleted >= {count}", timeout=ANSWER_TIMEOUT_MS)
    return page.evaluate("() => ({...window.omnipipeChat})")


def voice_events(page: Any) -> list[dict[str, Any]]:
    return page.evaluate("() => window.omnipipeVoice.events")


def wait_voice_event(page: Any, type_: str, timeout_ms: int = ANSWER_TIMEOUT_MS) -> None:
    page.wait_for_function(f"() => window.omnipipeVoice.events.some(e => e.type === {type_!r})", timeout=timeout_ms)


@pytest.fixture(scope="module")
def spoken_question(default_stack: Stack) -> np.ndarray:
    return speech(default_stack.workers[0], QUESTION)


def chat_session_id(stack: Stack) -> str:
    """The chat test's recorded session, or a new one made through the API when that test did not run."""
    if "chat" in _made:
        return _made["chat"]
    response = httpx.post(f"{stack.url}/v1/chat/completions", timeout=300, json={
        "model": "default", "messages": [{"role": "user", "content": QUESTION}],
        "modalities": ["text", "audio"], "audio": {"voice": "default", "format": "wav"}})
    assert response.status_code == 200, response.text
    return response.headers["X-Omnipipe-Session-Id"]


def test_chat_streams_the_answer_as_text_and_speech(default_stack: Stack, new_page: Any) -> None:
    page = new_page()
    page.goto(default_stack.url + "/chat")
    page.get_by_role("switch", name="Speak the answer").check()
    page.get_by_label("Your message").fill(QUESTION)
    with page.expect_request("**/v1/chat/completions") as sent:
        page.get_by_role("button", name="Send").click()
    request = sent.value
    assert request.headers["x-omnipipe-queue-events"] == "1"
    body = request.post_data_json
    assert body["stream"] is True and body["modalities"] == ["text", "audio"]
    assert body["audio"] == {"voice": "default", "format": "pcm16"}
    assert body["messages"] == [{"role": "user", "content": QUESTION}]

    hooks = wait_turns(page, 1)
    assert hooks["lastError"] is None
    answer = page.locator(".msg.assistant").last
    expect(answer.locator(".bubble")).to_contain_text("Paris")
    assert hooks["audioChunksReceived"] > 0
    metrics = hooks["lastMetrics"]
    assert 0 < metrics["ttft_s"] <= metrics["total_s"]
    assert 0 < metrics["ttfp_s"] <= metrics["total_s"]
    shown = answer.locator("[data-metrics]")
    expect(shown).to_contain_text("TTFT")
    expect(shown).to_contain_text("TTFP")
    expect(answer.locator("audio")).to_have_count(1)  # the spoken answer, to play again
    session_id = hooks["sessionId"]
    assert session_id
    expect(page.locator("#session-info a")).to_have_attribute("href", f"/s/{session_id}")
    screenshot(page, "chat")

    # a second turn: the first one goes along as history and the session id is sent back
    page.get_by_role("switch", name="Speak the answer").uncheck()
    page.get_by_label("Your message").fill("And what is the capital of Germany?")
    with page.expect_request("**/v1/chat/completions") as sent:
        page.keyboard.press("Enter")
    request = sent.value
    assert request.headers["x-omnipipe-session-id"] == session_id
    body = request.post_data_json
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][0]["content"] == QUESTION and "Paris" in body["messages"][1]["content"]
    assert body["modalities"] == ["text"] and "audio" not in body
    hooks = wait_turns(page, 2)
    assert hooks["lastError"] is None and hooks["lastAnswer"].strip()
    assert hooks["sessionId"] == session_id
    expect(page.locator(".msg.assistant")).to_have_count(2)
    expect(page.locator(".msg.assistant").last.locator("[data-metrics]")).not_to_contain_text("TTFP")
    _made["chat"] = session_id


def test_chat_asks_about_an_attached_image(default_stack: Stack, new_page: Any, tmp_path: Path) -> None:
    models = httpx.get(f"{default_stack.url}/v1/models", timeout=30).json()["data"]
    assert models[0]["id"] == "default" and models[0]["input_modalities"] == ["text", "audio", "image"]
    picture = tmp_path / "red.png"
    Image.new("RGB", (640, 360), (210, 30, 30)).save(picture)
    page = new_page()
    page.goto(default_stack.url + "/chat")
    page.wait_for_function("() => document.body.dataset.capabilities === 'known'")
    expect(page.get_by_role("button", name="Image")).to_be_visible()
    expect(page.get_by_role("button", name="Record")).to_be_visible()
    page.locator("#image-file").set_input_files(str(picture))
    page.get_by_label("Your message").fill("What colour is the attached image mostly? Answer in one word.")
    with page.expect_request("**/v1/chat/completions") as sent:
        page.get_by_role("button", name="Send").click()
    parts = sent.value.post_data_json["messages"][-1]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url"]
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    hooks = wait_turns(page, 1)
    assert hooks["lastError"] is None
    expect(page.locator(".msg.assistant").last.locator(".bubble")).to_contain_text("red", ignore_case=True)
    screenshot(page, "chat-image")


def test_chat_takes_a_spoken_question_from_a_file_or_the_microphone(default_stack: Stack, spoken_question: np.ndarray,
                                                                   mic_browser: Callable[[Path], Any], new_page: Any,
                                                                   tmp_path: Path) -> None:
    wav = write_wav(tmp_path / "question.wav", silence(0.5), spoken_question, silence(1.0))
    page = new_page(mic_browser(wav))
    page.goto(default_stack.url + "/chat")
    page.get_by_role("switch", name="Speak the answer").uncheck()

    # an uploaded file is decoded by the browser and sent again as a 24 kHz WAV
    page.set_input_files("#audio-file", wav)
    expect(page.locator("#attachments")).to_contain_text("question.wav")
    with page.expect_request("**/v1/chat/completions") as sent:
        page.get_by_role("button", name="Send").click()
    part = sent.value.post_data_json["messages"][-1]["content"][0]
    assert part["type"] == "input_audio" and part["input_audio"]["format"] == "wav"
    audio = base64.b64decode(part["input_audio"]["data"])
    assert audio[:4] == b"RIFF" and int.from_bytes(audio[24:28], "little") == 24000
    assert len(audio) - 44 == pytest.approx(wav.stat().st_size - 44, abs=100)
    hooks = wait_turns(page, 1)
    assert hooks["lastError"] is None
    expect(page.locator(".msg.assistant .bubble").last).to_contain_text("Paris")
    expect(page.locator(".msg.user audio")).to_have_count(1)
    # what the server heard is shown under the question, and kept in the recording's turn
    heard = page.locator(".msg.user .heard").first
    expect(heard).to_contain_text("capital", timeout=60_000)
    expect(heard).to_contain_text("Heard:")
    session_id = hooks["sessionId"]
    def transcribed_turns() -> list[dict]:
        turns = httpx.get(f"{default_stack.url}/api/sessions/{session_id}", timeout=10).json()["recording"]["turns"]
        return turns if turns and turns[0].get("user_transcript") else []

    turns = wait_for(transcribed_turns, 15, "the question's transcript recorded")
    assert "capital" in turns[0]["user_transcript"].lower(), turns

    # the microphone (Chromium plays the same question): record, stop, send
    record = page.locator("#record")
    record.click()
    expect(record).to_have_attribute("aria-pressed", "true")
    page.wait_for_timeout(3500)  # stays: the length of the recording
    record.click()
    expect(page.locator("#attachments")).to_contain_text("Recording (")
    with page.expect_request("**/v1/chat/completions") as sent:
        page.get_by_role("button", name="Send").click()
    messages = sent.value.post_data_json["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    # earlier audio is not sent again: the spoken question goes as what the server heard in it
    assert "capital" in messages[0]["content"].lower(), messages[0]
    recorded = base64.b64decode(messages[-1]["content"][0]["input_audio"]["data"])
    assert recorded[:4] == b"RIFF" and (len(recorded) - 44) / 2 / 24000 > 3
    hooks = wait_turns(page, 2)
    assert hooks["lastError"] is None and hooks["lastAnswer"].strip()
    expect(page.locator(".msg.user audio")).to_have_count(2)
    screenshot(page, "chat-spoken")


def test_session_viewer_shows_the_recorded_chat(default_stack: Stack, new_page: Any) -> None:
    session_id = chat_session_id(default_stack)
    page = new_page()
    page.goto(f"{default_stack.url}/s/{session_id}")
    expect(page.locator("#session-id")).to_have_text(session_id)
    turn = page.locator(".turn").first
    expect(turn).to_contain_text(QUESTION, timeout=15_000)  # the page reloads a running session by itself
    expect(turn).to_contain_text("Paris")
    players = turn.locator("audio")
    expect(players).to_have_count(1)  # the spoken answer (the question was typed)
    source = players.first.get_attribute("src")
    assert source.startswith(f"/api/sessions/{session_id}/files/ai_audio/")
    audio = httpx.get(default_stack.url + source, timeout=30)
    assert audio.status_code == 200 and audio.content[:4] == b"RIFF"
    expect(page.locator(".turn .metrics").first).to_contain_text("TTFT")
    expect(page.get_by_role("link", name="Download zip")).to_have_attribute(
        "href", f"/api/sessions/{session_id}/download")
    screenshot(page, "session-chat")


def test_voice_page_answers_a_spoken_question(default_stack: Stack, spoken_question: np.ndarray,
                                             mic_browser: Callable[[Path], Any], new_page: Any, tmp_path: Path) -> None:
    # the trailing silence lets the server VAD hear the question end
    wav = write_wav(tmp_path / "question.wav", silence(0.5), spoken_question, silence(2.0))
    page = new_page(mic_browser(wav))
    page.goto(default_stack.url + "/voice")
    label = page.locator("#state-label")
    expect(label).to_have_text("Ready")
    page.get_by_role("button", name="Start").click()
    wait_voice_event(page, "response.done")
    hooks = page.evaluate("() => ({...window.omnipipeVoice})")
    types = [e["type"] for e in hooks["events"]]
    assert types[:3] == ["queued", "queue_done", "session.created"], types
    for expected in ("session.updated", "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                     "input_audio_buffer.committed", "response.created"):
        assert expected in types, types
    updated = next(e for e in hooks["events"] if e["type"] == "session.updated")
    assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert updated["session"]["output_modalities"] == ["audio"]
    done = next(e for e in hooks["events"] if e["type"] == "response.done")
    assert done["response"]["status"] == "completed", hooks["errors"]
    assert hooks["audioChunksReceived"] > 0
    # the page asks for the server's transcript of what was said; it replaces the "(spoken)" placeholder
    wait_voice_event(page, "conversation.item.input_audio_transcription.completed", 60_000)
    hooks = page.evaluate("() => ({...window.omnipipeVoice})")
    said = [(t["role"], t["text"]) for t in hooks["transcript"]]
    assert said[0][0] == "user" and "capital" in said[0][1].lower(), said
    assert said[1][0] == "assistant" and said[1][1].strip(), said
    expect(page.locator("#transcript .msg.assistant .bubble").first).to_have_text(said[1][1])
    session_id = hooks["sessionId"]
    assert session_id
    expect(page.locator("#session-link a")).to_have_attribute("href", f"/s/{session_id}")
    screenshot(page, "voice")

    page.get_by_role("button", name="Pause").click()
    expect(label).to_have_text("Paused")
    wait_voice_event(page, "session.paused", 30_000)
    screenshot(page, "voice-paused")
    page.get_by_role("button", name="Resume").click()
    wait_voice_event(page, "session.resumed", 30_000)
    expect(label).not_to_have_text("Paused")
    page.get_by_role("button", name="Stop").click()
    expect(label).to_have_text("Session ended")
    expect(page.get_by_role("button", name="Start")).to_be_enabled()
    assert page.evaluate("window.omnipipeVoice.errors") == []

    # the recording: the spoken question, the spoken answer, and the merged replay once the session has ended
    page.goto(f"{default_stack.url}/s/{session_id}")
    turn = page.locator(".turn").first
    expect(turn).to_contain_text(said[1][1], timeout=15_000)
    expect(turn.locator(".part.user")).to_contain_text(said[0][1])
    expect(turn.locator(".part.user audio")).to_have_count(1)
    expect(turn.locator(".part.assistant audio")).to_have_count(1)
    expect(page.locator("#replay audio")).to_have_count(1, timeout=20_000)
    screenshot(page, "session-voice")
    _made["voice"] = session_id


def test_voice_page_answers_when_the_user_finishes_with_semantic_vad(default_stack: Stack, spoken_question: np.ndarray,
                                                                    mic_browser: Callable[[Path], Any], new_page: Any,
                                                                    tmp_path: Path) -> None:
    wav = write_wav(tmp_path / "question.wav", silence(0.5), spoken_question, silence(3.5))
    page = new_page(mic_browser(wav))
    page.goto(default_stack.url + "/voice")
    page.get_by_label("Answer").select_option(label="When I finish")
    page.get_by_role("button", name="Start").click()
    wait_voice_event(page, "response.done")
    hooks = page.evaluate("() => ({...window.omnipipeVoice})")
    assert hooks["turnDetection"]["type"] == "semantic_vad" and hooks["turnDetection"]["eagerness"] == "auto", \
        hooks["turnDetection"]
    done = next(e for e in hooks["events"] if e["type"] == "response.done")
    assert done["response"]["status"] == "completed", hooks["errors"]
    assert hooks["errors"] == [] and hooks["audioChunksReceived"] > 0
    page.get_by_role("button", name="Stop").click()


def test_voice_page_stops_the_answer_when_the_user_talks_over_it(default_stack: Stack, spoken_question: np.ndarray,
                                                                mic_browser: Callable[[Path], Any], new_page: Any,
                                                                tmp_path: Path) -> None:
    """Barge-in: a second utterance 1.8 s after the question ends, while the answer is generated or played."""
    interruption = speech(default_stack.workers[0], "Tell me more about it.")
    wav = write_wav(tmp_path / "barge-in.wav", silence(0.5), spoken_question, silence(1.8), interruption,
                    silence(2.5))
    page = new_page(mic_browser(wav))
    page.goto(default_stack.url + "/voice")
    page.get_by_role("button", name="Start").click()
    page.wait_for_function("() => window.omnipipeVoice.interruptions.length > 0", timeout=ANSWER_TIMEOUT_MS)
    # the page went quiet at once: nothing left scheduled, no longer speaking
    assert page.evaluate("window.omnipipeVoice.state") != "speaking"
    page.wait_for_function(
        "() => window.omnipipeVoice.events.filter(e => e.type === 'response.done').length >= 2",
        timeout=ANSWER_TIMEOUT_MS)
    hooks = page.evaluate("() => ({...window.omnipipeVoice})")
    first = hooks["interruptions"][0]
    assert first["playing"] or first["response_id"], first
    started = [e for e in hooks["events"] if e["type"] == "input_audio_buffer.speech_started"]
    assert len(started) == 2, [e["type"] for e in hooks["events"]]
    done = [e["response"] for e in hooks["events"] if e["type"] == "response.done"]
    if first["response_id"]:  # the answer was still being generated: the server cancelled it
        assert done[0]["id"] == first["response_id"] and done[0]["status"] == "cancelled", done
        assert hooks["transcript"][1]["status"] == "interrupted"
        expect(page.locator("#transcript .msg.assistant .tag").first).to_have_text("interrupted")
    assert done[-1]["status"] == "completed"
    assert [t["role"] for t in hooks["transcript"]] == ["user", "assistant", "user", "assistant"]
    screenshot(page, "voice-barge-in")
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#state-label")).to_have_text("Session ended")


def test_admin_page_lists_the_worker_and_the_recordings(default_stack: Stack, new_page: Any) -> None:
    page = new_page()
    page.goto(default_stack.url + "/admin")
    page.fill("#token", ADMIN_TOKEN)
    page.get_by_role("button", name="Sign in").click()
    row = page.locator("#workers tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text(default_stack.workers[0].address)
    expect(row.locator(".badge")).to_have_text("idle")
    expect(row).to_contain_text("0 / 2")
    recordings = page.locator("#recordings tbody tr")
    expect(recordings.first).to_be_visible()
    for session_id in _made.values():
        expect(page.locator("#recordings").get_by_role("link", name=session_id)).to_have_attribute(
            "href", f"/s/{session_id}")
    screenshot(page, "admin")
