"""The pages that need no model: home, navigation, the admin page's token handling and controls, and the session
viewer's not-found message. The gateway's only worker address has nothing listening (it shows as offline)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.browser.conftest import ADMIN_TOKEN, Stack, expect, screenshot
from tests.waiting import wait_for

pytestmark = pytest.mark.browser
PAGES = {"/": "Home", "/chat": "Chat", "/voice": "Voice", "/admin": "Admin"}


def test_every_page_has_the_shared_nav_with_the_current_page_marked(bare_gateway: Stack, new_page: Any) -> None:
    page = new_page()
    for path, current in PAGES.items():
        page.goto(bare_gateway.url + path)
        nav = page.get_by_role("navigation", name="Main")
        expect(nav.get_by_role("link")).to_have_text(list(PAGES.values()))
        expect(nav.locator("[aria-current=page]")).to_have_text(current)
        expect(page.locator("link[rel=stylesheet]")).to_have_attribute("href", "/static/css/omnipipe.css")


def test_home_page_links_the_apps_and_shows_the_queue_status(bare_gateway: Stack, new_page: Any) -> None:
    page = new_page()
    page.goto(bare_gateway.url + "/")
    main = page.locator("main")
    for name, href in (("Chat", "/chat"), ("Voice", "/voice"), ("Admin", "/admin")):
        expect(main.get_by_role("link", name=name)).to_have_attribute("href", href)
    # GET /api/queue: one worker configured, none reachable, nobody waiting
    expect(page.locator("#stat-workers")).to_have_text("0 / 1")
    expect(page.locator("#stat-queue")).to_have_text("0")
    expect(page.locator("#status-note")).to_contain_text("No worker is ready")
    expect(page.locator("#status-updated")).to_contain_text("Updated")
    expect(page.locator("#api-example")).to_contain_text(f"{bare_gateway.url}/v1/chat/completions")
    screenshot(page, "home")


def test_admin_page_refuses_a_missing_or_wrong_token_and_works_with_the_right_one(bare_gateway: Stack,
                                                                                 new_page: Any) -> None:
    page = new_page()
    page.goto(bare_gateway.url + "/admin")
    message = page.locator("#auth-message")
    expect(message).to_contain_text("Admin token required")
    expect(page.locator("#admin-content")).to_be_hidden()
    screenshot(page, "admin-token-required")

    page.fill("#token", "not-the-admin-token")
    page.get_by_role("button", name="Sign in").click()
    expect(message).to_contain_text("Admin token refused")
    expect(page.locator("#admin-content")).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('omnipipe.adminToken')") is None
    screenshot(page, "admin-token-refused")

    page.fill("#token", ADMIN_TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#admin-content")).to_be_visible()
    expect(message).to_be_hidden()
    worker = bare_gateway.gateway.admin("GET", "/workers").json()[0]
    row = page.locator("#workers tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text(worker["address"])
    expect(row.locator(".badge")).to_have_text("offline")
    expect(page.locator("#queue")).to_contain_text("Nobody is waiting")
    expect(page.locator("#running")).to_contain_text("No session is running")
    expect(page.locator("#recordings")).to_contain_text("No recordings yet")

    # apps: switching one off reaches the gateway, and back on
    voice_switch = page.get_by_role("switch", name="voice")
    expect(voice_switch).to_be_checked()
    voice_switch.uncheck()
    expect(page.locator("#apps-status")).to_have_text("voice disabled.")
    assert bare_gateway.admin("GET", "/apps").json()["voice"] is False
    page.get_by_role("switch", name="voice").check()
    expect(page.locator("#apps-status")).to_have_text("voice enabled.")
    assert bare_gateway.admin("GET", "/apps").json()["voice"] is True

    # ETA baselines: edit and save
    page.fill("#eta-chat", "12.5")
    page.get_by_role("button", name="Save estimates").click()
    expect(page.locator("#eta-status")).to_contain_text("Saved")
    assert bare_gateway.admin("GET", "/eta").json()["chat"]["baseline_s"] == 12.5
    # one statement per value: this value is in use until enough sessions are measured
    expect(page.locator("#eta-fields .field").first.locator(".hint")).to_have_text(
        "In use: 0 sessions measured so far; the average replaces this after 5.")

    page.get_by_role("button", name="Run cleanup now").click()
    expect(page.locator("#cleanup-report")).to_contain_text("Scanned 0 session(s)")
    screenshot(page, "admin-signed-in-no-worker")

    # the token lives in sessionStorage: a reload stays signed in, "Forget token" signs out
    page.reload()
    expect(page.locator("#admin-content")).to_be_visible()
    page.get_by_role("button", name="Forget token").click()
    expect(page.locator("#admin-content")).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('omnipipe.adminToken')") is None


def test_session_viewer_says_when_a_session_does_not_exist(bare_gateway: Stack, new_page: Any) -> None:
    page = new_page()
    page.goto(bare_gateway.url + "/s/no-such-session")
    message = page.locator("#message")
    expect(message).to_contain_text("Session not found")
    expect(message).to_contain_text("no-such-session")
    expect(page.locator("#content")).to_be_hidden()
    expect(page.locator("#download")).to_be_hidden()
    screenshot(page, "session-not-found")


def test_chat_offers_what_the_model_takes_and_a_question_cancelled_in_the_queue_stays(bare_gateway: Stack,
                                                                                      new_page: Any) -> None:
    """No worker answers /v1/models: no Image button. A question that waits (no worker is online) and loses its
    place gets a worded error, stays in the box, and no link to a recording that was never made."""
    page = new_page()
    page.goto(bare_gateway.url + "/chat")
    page.wait_for_function("() => document.body.dataset.capabilities === 'known'")
    expect(page.get_by_role("button", name="Image")).to_be_hidden()
    expect(page.get_by_role("button", name="Record")).to_be_visible()
    page.get_by_role("switch", name="Speak the answer").uncheck()
    page.get_by_label("Your message").fill("Is anyone there?")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#queue-status")).to_be_visible()
    waiting = wait_for(lambda: bare_gateway.admin("GET", "/queue").json(), 30, "the question queued")
    assert bare_gateway.admin("DELETE", f"/queue/{waiting[0]['ticket_id']}").status_code == 200
    page.wait_for_function("() => window.omnipipeChat.turnsCompleted >= 1")
    error = page.locator(".msg.assistant.error .bubble")
    expect(error).to_contain_text("Your place in the queue was cancelled.")
    expect(error).not_to_contain_text("queue_cancelled")
    expect(error).not_to_contain_text("HTTP")
    expect(page.get_by_label("Your message")).to_have_value("Is anyone there?")
    expect(page.locator("#session-info")).to_have_text("New conversation")
    expect(page.locator("#session-info a")).to_have_count(0)
    screenshot(page, "chat-cancelled-in-queue")

    # a model that takes images (and answers only in text): Image shows, Record and Speak do not
    page.route("**/v1/models", lambda route: route.fulfill(json={"object": "list", "data": [
        {"id": "seer", "object": "model", "created": 0, "owned_by": "omnipipe",
         "input_modalities": ["text", "image"], "output_modalities": ["text"]}]}))
    page.reload()
    page.wait_for_function("() => document.body.dataset.capabilities === 'known'")
    expect(page.get_by_role("button", name="Image")).to_be_visible()
    expect(page.get_by_role("button", name="Record")).to_be_hidden()
    expect(page.get_by_role("button", name="Audio file")).to_be_hidden()
    expect(page.get_by_role("switch", name="Speak the answer")).to_be_hidden()
    screenshot(page, "chat-model-takes-images")


def test_voice_asks_for_the_microphone_before_taking_a_place_in_the_queue(bare_gateway: Stack,
                                                                          new_page: Any) -> None:
    page = new_page()
    page.add_init_script("""navigator.mediaDevices.getUserMedia = () =>
        Promise.reject(new DOMException("denied", "NotAllowedError"));""")
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.goto(bare_gateway.url + "/voice")
    page.get_by_role("button", name="Start").click()
    expect(page.locator("#error")).to_contain_text("permission was denied")
    expect(page.get_by_role("button", name="Start")).to_be_enabled()
    page.wait_for_timeout(300)  # stays: a stretch in which no socket may open
    assert sockets == [] and bare_gateway.admin("GET", "/queue").json() == []
    screenshot(page, "voice-microphone-denied")


@pytest.mark.parametrize("path", ["/voice", "/omni"])
def test_the_spoken_pages_offer_when_the_turn_ends_and_remember_the_choice(bare_gateway: Stack, new_page: Any,
                                                                          path: str) -> None:
    page = new_page()
    page.goto(bare_gateway.url + path)
    choice = page.get_by_label("Answer")
    expect(choice).to_have_value("pause")  # the server VAD until a choice is made
    assert [o.strip() for o in choice.locator("option").all_inner_texts()] == [
        "When I pause", "When I finish", "When I finish, patiently", "When I finish, quickly"]
    choice.select_option(label="When I finish, patiently")
    expect(page.locator("#turn-detection-hint")).to_have_text("Waits up to 3 s on an unfinished sentence.")
    page.reload()
    expect(page.get_by_label("Answer")).to_have_value("finish-patient")
    chosen = page.evaluate("""async () => {
        const { TURN_CHOICES } = await import("/static/js/turn-detection.js");
        return TURN_CHOICES.map((c) => [c.value, c.detection]);
    }""")
    assert chosen == [["pause", {"type": "server_vad"}],
                      ["finish", {"type": "semantic_vad", "eagerness": "auto"}],
                      ["finish-patient", {"type": "semantic_vad", "eagerness": "low"}],
                      ["finish-quick", {"type": "semantic_vad", "eagerness": "high"}]]
    screenshot(page, f"{path.strip('/')}-turn-choice")


def test_session_viewer_shows_settings_transcripts_and_token_counts_readably(bare_gateway: Stack,
                                                                            new_page: Any) -> None:
    session_id = "20260101-000000_chat_viewer0001"
    directory = bare_gateway.gateway.data_dir / "sessions" / session_id
    directory.mkdir(parents=True)
    (directory / "meta.json").write_text(json.dumps({
        "session_id": session_id, "type": "chat", "created_at": 1767225600.0, "ended_at": 1767225612.0,
        "status": "completed", "worker": "127.0.0.1:1", "error": None,
        "config": {"path": "/v1/chat/completions", "turn_detection": {"type": "server_vad", "silence_ms": 500}}}))
    (directory / "recording.json").write_text(json.dumps({"session_id": session_id, "type": "chat", "events": [],
        "turns": [{"index": 1, "started_at": 0.0, "ended_at": 2.5, "status": "completed", "user_text": "",
                   "user_transcript": "What is the capital of France?", "assistant_text": "Paris.",
                   "user_audio": None, "user_audio_extra": [], "ai_audio": [], "user_images": [],
                   "metrics": {"ttft_ms": 420.0, "usage": {"prompt_tokens": 0, "completion_tokens": 3,
                                                           "total_tokens": 3}}}]}))
    assert httpx.get(f"{bare_gateway.url}/api/sessions/{session_id}", timeout=10).status_code == 200
    page = new_page()
    page.goto(f"{bare_gateway.url}/s/{session_id}")
    settings = page.locator("#meta ul.settings li")
    expect(settings).to_have_text(["Endpoint: /v1/chat/completions",
                                   "Turn detection: type: server_vad; silence ms: 500"])
    expect(page.locator("#meta")).not_to_contain_text("{")
    heard = page.locator(".turn .part.user .heard")
    expect(heard).to_contain_text("What is the capital of France?")
    assert heard.bounding_box()["height"] < 60  # one line, not the voice page's tall transcript box
    metrics = page.locator(".turn .metrics")
    expect(metrics).to_contain_text("completion tokens 3")
    expect(metrics).not_to_contain_text("prompt tokens")
    screenshot(page, "session-viewer-readable")
