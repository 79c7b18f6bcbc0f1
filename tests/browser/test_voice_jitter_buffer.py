"""The voice page's jitter buffer against a real toy worker whose vocoder is slower than real time: the answer's
audio arrives at about 0.6 s per second (32 ms of audio per vocoder call, each call 50 ms). Played as it arrives it
runs dry again and again; held by the jitter buffer (sized from the measured arrival rate) it plays through. The
page's per-answer figures (``window.omnipipeVoice.answers``) report both, and between chunks of one answer the page
never says "Thinking" (it says "Buffering" while it waits).

The toy pipeline takes text, so the question is typed into the page's own WebSocket (captured by an init script)
while the fake microphone plays silence."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Stack, _stop_all, silence, write_wav
from tests.gateway.conftest import CliProcess, GatewayProcess, WorkerProcess

pytestmark = pytest.mark.browser

# 32 ms of audio per vocoder call (8 frames of 4 ms), each call 50 ms: audio arrives at ~0.64 s per second
SLOW_VOCODER_DEPLOY = {"stages": {"thinker": {"options": {"step_delay_ms": 2}},
                                  "code2wav": {"options": {"call_delay_ms": 50}}}}
QUESTION = "The sky looks blue because air scatters the short blue wavelengths of sunlight far more than red ones."
CAPTURE = """
window.__states = [];
const NativeSocket = window.WebSocket;
window.WebSocket = class extends NativeSocket {
  constructor(...args) { super(...args); window.__socket = this; }
};
new MutationObserver(() => {
  const orb = document.querySelector('#orb');
  if (orb && window.__states[window.__states.length - 1] !== orb.dataset.state) window.__states.push(orb.dataset.state);
}).observe(document, { subtree: true, attributes: true, attributeFilter: ['data-state'] });
"""


@pytest.fixture(scope="module")
def slow_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("slow-vocoder")
    worker = WorkerProcess("toy", workdir, capacity=2, deploy=SLOW_VOCODER_DEPLOY)
    processes: list[CliProcess] = [worker]
    try:
        worker.wait_state("IDLE", timeout_s=120)
        gateway = GatewayProcess([worker.address], workdir)
        processes.insert(0, gateway)
        gateway.wait_ready(timeout_s=60)
        yield Stack(gateway, [worker], workdir)
    finally:
        _stop_all(processes)


def open_session(stack: Stack, page: Any) -> None:
    page.add_init_script(CAPTURE)
    page.goto(stack.url + "/voice")
    page.get_by_role("button", name="Start").click()
    page.wait_for_function("() => window.omnipipeVoice.events.some(e => e.type === 'session.updated')",
                           timeout=60_000)


def ask(page: Any, jitter_buffer: bool) -> dict[str, Any]:
    """Type the question into the session, wait until its answer has been played out; the answer's figures and
    the states the page showed meanwhile."""
    count = page.evaluate("window.omnipipeVoice.answers.length")
    page.evaluate("""([text, jitter]) => {
        window.omnipipeVoice.jitterBuffer = jitter;
        window.__states = [];
        window.__socket.send(JSON.stringify({ type: 'conversation.item.create', item: { type: 'message',
            role: 'user', content: [{ type: 'input_text', text }] } }));
        window.__socket.send(JSON.stringify({ type: 'response.create' }));
    }""", [QUESTION, jitter_buffer])
    page.wait_for_function(f"""() => {{
        const answers = window.omnipipeVoice.answers;
        if (answers.length <= {count}) return false;
        const id = answers[answers.length - 1].response_id;
        return window.omnipipeVoice.events.some(e => e.type === 'response.done' && e.response.id === id)
            && window.omnipipeVoice.state === 'listening';
    }}""", timeout=120_000)
    figures = page.evaluate("window.omnipipeVoice.answers[window.omnipipeVoice.answers.length - 1]")
    done = [e for e in page.evaluate("window.omnipipeVoice.events") if e["type"] == "response.done"][-1]
    assert done["response"]["status"] == "completed", done
    return {**figures, "states": page.evaluate("window.__states")}


def test_the_jitter_buffer_sized_from_the_arrival_rate_stops_a_slow_answer_running_dry(
        slow_stack: Stack, mic_browser: Callable[[Path], Any], new_page: Any, tmp_path: Path) -> None:
    browser = mic_browser(write_wav(tmp_path / "silence.wav", silence(1.0)))
    page = new_page(browser)
    open_session(slow_stack, page)
    unbuffered = ask(page, jitter_buffer=False)  # each chunk played as it arrives
    learnt = ask(page, jitter_buffer=True)  # sized from the rate measured so far (the previous answer's)
    fresh_page = new_page(browser)
    open_session(slow_stack, fresh_page)
    fresh = ask(fresh_page, jitter_buffer=True)  # a first answer: sized from the rate measured within it

    seen = {"unbuffered": unbuffered, "learnt": learnt, "fresh": fresh}
    for figures in (unbuffered, learnt, fresh):
        assert figures["audio_s"] > 1.5, seen  # the whole answer arrived
        assert 0.2 < figures["arrival_rate"] < 1, seen  # slower than real time, as the deploy makes it
        assert figures["first_chunk_ms"] <= figures["first_audio_ms"], seen
        # between chunks of one answer the page never went back to "Thinking"
        states = figures["states"]
        assert "thinking" not in states[states.index("speaking"):], seen
    assert unbuffered["underruns"] >= 3 and unbuffered["underrun_ms"] > 0, seen
    assert "buffering" in unbuffered["states"], seen  # shown while it ran dry
    assert learnt["underruns"] < unbuffered["underruns"] and fresh["underruns"] < unbuffered["underruns"], seen
    assert learnt["underruns"] == 0, seen  # the rate was known before the answer started
    assert fresh["underruns"] <= 1, seen
    for figures in (learnt, fresh):  # held for more than the floor (150 ms) because the audio comes slowly
        assert figures["buffer_ms"] > 150, seen
