"""The voice page in Chromium with a fake microphone, against one ``omnipipe worker --pipeline moshi`` (a tiny random
checkpoint written here) behind a gateway: a full-duplex model. The page sees from ``session.created`` that the
session has no turns, sends no turn detection, streams the microphone, and plays and shows the one answer that
streams back while the user talks (Moshi's speech and its inner-monologue text); the turn choice and Pause are
disabled, Stop ends the session, and nothing the page sent was refused."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.browser.conftest import RATE, Stack, _worker_behind_gateway, expect, screenshot, silence, write_wav

pytestmark = [pytest.mark.browser, pytest.mark.slow]
AUDIO_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def moshi_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from omnipipe.models.moshi.weights.tiny import write_tiny_checkpoint

    workdir = tmp_path_factory.mktemp("moshi-stack")
    checkpoint = write_tiny_checkpoint(workdir / "checkpoint", seed=0)
    stages = {name: {"threads": 1, "options": {"model": str(checkpoint)}} for name in ("duplex", "mimi")}
    yield from _worker_behind_gateway(workdir, "moshi", deploy={"stages": stages})


def test_the_voice_page_talks_with_a_full_duplex_model(moshi_stack: Stack, mic_browser: Callable[[Path], Any],
                                                       new_page: Any, tmp_path: Path) -> None:
    t = np.arange(int(4 * RATE)) / RATE
    voice = (0.3 * 32767 * np.sin(2 * np.pi * 180 * t + 2 * np.sin(2 * np.pi * 3 * t))).astype("<i2")
    page = new_page(mic_browser(write_wav(tmp_path / "talk.wav", silence(0.5), voice, silence(1.0))))
    page.goto(moshi_stack.url + "/voice")
    label = page.locator("#state-label")
    expect(label).to_have_text("Ready")
    page.get_by_role("button", name="Start").click()
    expect(label).to_have_text("Talking", timeout=AUDIO_TIMEOUT_MS)
    page.wait_for_function("() => window.omnipipeVoice.audioChunksReceived >= 10", timeout=AUDIO_TIMEOUT_MS)
    hooks = page.evaluate("() => ({...window.omnipipeVoice})")
    assert hooks["duplex"] is True
    types = [e["type"] for e in hooks["events"]]
    assert types[:3] == ["queued", "queue_done", "session.created"], types
    assert "session.updated" not in types and "error" not in types, types  # nothing to update, nothing refused
    created = next(e for e in hooks["events"] if e["type"] == "session.created")
    assert created["session"]["audio"]["input"]["turn_detection"] is None
    assert types.count("response.created") == 1, types
    assert "response.output_audio_transcript.delta" in types
    said = [(entry["role"], entry["text"]) for entry in hooks["transcript"]]
    assert said and said[0][0] == "assistant" and said[0][1], said  # Moshi's inner monologue, shown as it comes
    expect(page.get_by_role("button", name="Pause")).to_be_disabled()
    expect(page.locator("#turn-detection-choice")).to_be_disabled()
    screenshot(page, "voice-duplex")
    page.get_by_role("button", name="Stop").click()
    expect(label).to_have_text("Session ended")
    assert page.evaluate("window.omnipipeVoice.errors") == []
