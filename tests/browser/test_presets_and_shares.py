"""Presets and share links in Chromium, against ``omnipipe worker --pipeline default`` behind
``omnipipe gateway --presets FILE``: a preset chosen on the chat page goes into each request (system message, voice,
spoken or not) and on the voice page into its ``session.update``; a recorded session shared from its viewer opens
read-only by the link, and the link is refused once the admin revokes it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from tests.browser.conftest import ADMIN_TOKEN, Stack, expect, screenshot
from tests.gateway.conftest import GatewayProcess, WorkerProcess, running
from tests.server.conftest import DEFAULT_DEPLOY

pytestmark = [pytest.mark.browser, pytest.mark.models]
ANSWER_TIMEOUT_MS = 180_000
PIRATE = {"name": "Pirate", "instructions": "Talk like a pirate.", "output_modalities": ["text"]}
SPEAKER = {"name": "Speaker", "instructions": "Answer in one short sentence.", "voice": "default",
           "output_modalities": ["text", "audio"]}


@pytest.fixture(scope="module")
def preset_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("preset-stack")
    (workdir / "presets.yaml").write_text(yaml.safe_dump({"presets": [PIRATE, SPEAKER]}))
    worker = WorkerProcess("default", workdir, capacity=2, deploy=DEFAULT_DEPLOY)
    with running(worker):
        worker.wait_state("IDLE", timeout_s=600)
        gateway = GatewayProcess([worker.address], workdir, extra=["--presets", str(workdir / "presets.yaml")])
        with running(gateway):
            gateway.wait_ready(timeout_s=60)
            yield Stack(gateway, [worker], workdir)


def ask(page: Any, question: str, turns: int) -> dict[str, Any]:
    """Send ``question`` from the chat page; the request's JSON body, once the answer is complete."""
    page.get_by_label("Your message").fill(question)
    with page.expect_request("**/v1/chat/completions") as sent:
        page.get_by_role("button", name="Send").click()
    page.wait_for_function(f"() => window.omnipipeChat.turnsCompleted >= {turns}", timeout=ANSWER_TIMEOUT_MS)
    return json.loads(sent.value.post_data)


def test_the_preset_selector_is_hidden_without_presets(bare_gateway: Stack, new_page: Any) -> None:
    page = new_page()
    for path in ("/chat", "/voice"):
        page.goto(bare_gateway.url + path)
        expect(page.locator("#presets")).to_have_attribute("data-presets", "0")  # the list has arrived: empty
        expect(page.locator("#presets")).to_be_hidden()


def test_a_preset_chosen_on_the_chat_page_changes_what_is_sent(preset_stack: Stack, new_page: Any) -> None:
    page = new_page()
    page.goto(preset_stack.url + "/chat")
    selector = page.get_by_label("Preset")
    expect(selector).to_be_visible()
    assert selector.locator("option").all_inner_texts() == ["None", "Pirate", "Speaker"]
    speak = page.get_by_role("switch", name="Speak the answer")

    selector.select_option("Pirate")
    expect(speak).not_to_be_checked()
    expect(page.locator("#preset-hint")).to_have_text("Written answers, own instructions.")
    sent = ask(page, "Who are you?", 1)
    assert sent["messages"][0] == {"role": "system", "content": "Talk like a pirate."}
    assert sent["messages"][-1] == {"role": "user", "content": "Who are you?"}
    assert sent["modalities"] == ["text"] and "audio" not in sent

    selector.select_option("Speaker")
    expect(speak).to_be_checked()
    sent = ask(page, "What is 10 minus 3?", 2)
    assert sent["messages"][0] == {"role": "system", "content": "Answer in one short sentence."}
    assert sum(m["role"] == "system" for m in sent["messages"]) == 1  # the earlier preset's is not kept
    assert sent["modalities"] == ["text", "audio"] and sent["audio"]["voice"] == "default"
    hooks = page.evaluate("() => ({...window.omnipipeChat})")
    assert hooks["lastError"] is None and hooks["lastAnswer"].strip() and hooks["audioChunksReceived"] > 0
    screenshot(page, "chat-with-preset")

    page.reload()  # the choice is remembered
    expect(page.get_by_label("Preset")).to_have_value("Speaker")
    page.get_by_label("Preset").select_option("None")
    sent = ask(page, "Hi there!", 1)
    assert all(m["role"] != "system" for m in sent["messages"])


def test_a_preset_chosen_on_the_voice_page_goes_into_its_session_update(preset_stack: Stack, new_page: Any) -> None:
    page = new_page()
    frames: list[dict[str, Any]] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: frames.append(json.loads(payload))))
    page.goto(preset_stack.url + "/voice")
    page.get_by_label("Preset").select_option("Speaker")
    page.get_by_role("button", name="Start").click()
    page.wait_for_function("() => window.omnipipeVoice.events.some(e => e.type === 'session.updated' "
                           "&& e.session && e.session.instructions)", timeout=ANSWER_TIMEOUT_MS)
    expect(page.get_by_label("Preset")).to_be_disabled()  # it applies when a session starts
    update = next(f for f in frames if f.get("type") == "session.update")
    assert update["session"]["instructions"] == "Answer in one short sentence."
    assert update["session"]["output_modalities"] == ["audio"]
    assert update["session"]["audio"]["output"]["voice"] == "default"
    assert update["session"]["audio"]["input"]["turn_detection"] == {"type": "server_vad"}  # the page's own kept
    updated = next(e for e in page.evaluate("() => window.omnipipeVoice.events")
                   if e["type"] == "session.updated" and e["session"].get("instructions"))
    assert updated["session"]["instructions"] == "Answer in one short sentence."
    screenshot(page, "voice-with-preset")
    page.get_by_role("button", name="Stop").click()
    expect(page.get_by_label("Preset")).to_be_enabled()


def test_a_shared_link_opens_the_session_read_only_until_the_admin_revokes_it(preset_stack: Stack,
                                                                               new_page: Any) -> None:
    answer = httpx.post(f"{preset_stack.url}/v1/chat/completions", timeout=300, json={
        "model": "default", "messages": [{"role": "user", "content": "What is salt made of?"}],
        "modalities": ["text", "audio"], "audio": {"voice": "default", "format": "wav"}})
    assert answer.status_code == 200, answer.text
    session_id = answer.headers["X-Omnipipe-Session-Id"]

    owner = new_page()
    owner.goto(f"{preset_stack.url}/s/{session_id}")
    expect(owner.locator(".turn")).to_have_count(1)
    owner.get_by_role("button", name="Share").click()
    link = owner.get_by_label("Share link")
    owner.wait_for_function("() => document.querySelector('#share-url').value.includes('/shared/')")
    url = link.input_value()
    assert url.startswith(f"{preset_stack.url}/shared/")
    screenshot(owner, "session-share-link")

    viewer = new_page()
    viewer.goto(url)
    expect(viewer.locator(".turn")).to_have_count(1)
    expect(viewer.locator(".turn")).to_contain_text("What is salt made of?")
    expect(viewer.locator("#session-id")).to_have_text("(shared, read-only)")
    expect(viewer.locator("#download")).to_be_hidden()
    expect(viewer.get_by_role("button", name="Share")).to_have_count(0)
    viewer.wait_for_function("() => [...document.querySelectorAll('audio')].every(a => a.readyState >= 1)")
    assert session_id not in viewer.content() and session_id.split("_")[-1] not in viewer.content()
    screenshot(viewer, "shared-session")

    admin = new_page()
    admin.goto(preset_stack.url + "/admin")
    admin.fill("#token", ADMIN_TOKEN)
    admin.get_by_role("button", name="Sign in").click()
    row = admin.locator("#shares tr", has_text=session_id)
    expect(row).to_contain_text("active")
    row.get_by_role("button", name="Revoke").click()
    expect(row).to_contain_text("revoked")
    expect(row.get_by_role("button", name="Revoke")).to_have_count(0)
    screenshot(admin, "admin-share-revoked")

    refused = viewer.goto(url)
    assert refused is not None and refused.status == 410
    expect(viewer.get_by_role("alert")).to_contain_text("Share link revoked")
    screenshot(viewer, "shared-session-revoked")
    owner.reload()  # the session itself is untouched
    expect(owner.locator(".turn")).to_have_count(1)
