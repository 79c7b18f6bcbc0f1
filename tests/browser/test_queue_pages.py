"""The chat page while its question waits in the queue, in front of real toy workers: the estimated wait counts down
by itself between the gateway's updates and ends at "any moment now", and while the only worker still loads its
models the page says the service is starting instead of a number."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from websockets.sync.client import connect

from tests.browser.conftest import ADMIN_TOKEN, Stack, _stop_all, expect, screenshot
from tests.gateway.conftest import CliProcess, GatewayProcess, WorkerProcess
from tests.server.conftest import TOY_DEPLOY
from tests.waiting import wait_for

pytestmark = pytest.mark.browser
SLOW_LOAD_DEPLOY = {"stages": {"thinker": {"options": {"step_delay_ms": 2, "load_delay_ms": 600_000}}}}


def _stack(workdir: Any, deploy: dict[str, Any], state: str) -> tuple[Stack, list[CliProcess]]:
    worker = WorkerProcess("toy", workdir, capacity=1, deploy=deploy)
    processes: list[CliProcess] = [worker]
    worker.wait_state(state, timeout_s=120)
    gateway = GatewayProcess([worker.address], workdir)
    processes.insert(0, gateway)
    gateway.wait_ready(timeout_s=60, serving=state == "IDLE")
    return Stack(gateway, [worker], workdir), processes


@pytest.fixture(scope="module")
def toy_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One toy worker with room for one session behind a gateway."""
    stack, processes = _stack(tmp_path_factory.mktemp("toy-stack"), TOY_DEPLOY, "IDLE")
    try:
        yield stack
    finally:
        _stop_all(processes)


@pytest.fixture(scope="module")
def loading_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A gateway whose only worker takes ten minutes to load its models (it answers /health LOADING meanwhile)."""
    stack, processes = _stack(tmp_path_factory.mktemp("loading-stack"), SLOW_LOAD_DEPLOY, "LOADING")
    try:
        yield stack
    finally:
        # still loading: the worker and its stages would only stop on SIGINT once the load has ended
        worker = psutil.Process(stack.workers[0].process.pid)
        for process in [*worker.children(recursive=True), worker]:
            process.kill()
        _stop_all(processes)


def shown_seconds(page: Any) -> int:
    text = page.locator("#queue-wait").inner_text()
    match = re.search(r"estimated wait about (\d+) s", text)
    assert match, text
    return int(match.group(1))


def test_chat_counts_the_estimated_wait_down_while_queued(toy_stack: Stack, new_page: Any) -> None:
    assert toy_stack.admin("PUT", "/eta", json={"baselines": {"voice": 40}}).status_code == 200
    with connect(toy_stack.gateway.ws_url, max_size=None, open_timeout=30) as voice:  # holds the only worker
        assert json.loads(voice.recv(timeout=30))["position"] == 0
        assert json.loads(voice.recv(timeout=30))["type"] == "queue_done"
        page = new_page()
        page.goto(toy_stack.url + "/chat")
        page.wait_for_function("() => document.body.dataset.capabilities === 'known'")
        page.get_by_role("switch", name="Speak the answer").uncheck()
        page.get_by_label("Your message").fill("hello queue")
        page.get_by_role("button", name="Send").click()
        expect(page.locator("#queue-text")).to_have_text("You are next in the queue")
        expect(page.locator("#queue-wait")).to_contain_text("estimated wait about")
        first = shown_seconds(page)
        assert 0 < first <= 40
        screenshot(page, "chat-queued-countdown")
        # no message comes from the gateway meanwhile (its estimate follows the countdown): the page counts itself
        page.wait_for_function("""(first) => {
            const m = /about (\\d+) s/.exec(document.querySelector('#queue-wait').textContent);
            return m && Number(m[1]) < first;
        }""", arg=first, timeout=30_000)
        second = shown_seconds(page)
        assert 0 < second < first

        # the voice session's typical duration drops to 1 s: it is past it, so the gateway says 0 and the page
        # shows "any moment now" (never a negative wait), however long it stays there
        assert toy_stack.admin("PUT", "/eta", json={"baselines": {"voice": 1}}).status_code == 200
        expect(page.locator("#queue-wait")).to_have_text(" · any moment now")
        page.wait_for_timeout(2500)  # stays: "however long it stays there" is this stretch of time
        expect(page.locator("#queue-wait")).to_have_text(" · any moment now")
        screenshot(page, "chat-queued-any-moment")
    # the voice session ended: the question is answered and the queue line goes away
    expect(page.locator(".msg.assistant .bubble").last).to_have_text("HELLO QUEUE", timeout=60_000)
    expect(page.locator("#queue-status")).to_be_hidden()


def test_chat_says_the_service_is_starting_while_the_worker_loads(loading_stack: Stack, new_page: Any) -> None:
    page = new_page()
    page.goto(loading_stack.url + "/chat")
    page.wait_for_function("() => document.body.dataset.capabilities === 'known'")
    page.get_by_role("switch", name="Speak the answer").uncheck()
    page.get_by_label("Your message").fill("Is it up yet?")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#queue-text")).to_have_text("You are next in the queue")
    expect(page.locator("#queue-wait")).to_have_text(" · the service is starting (models loading)")
    screenshot(page, "chat-queued-service-starting")
    admin = new_page()  # the admin page lists the waiter as starting, not with a number
    admin.goto(loading_stack.url + "/admin")
    admin.fill("#token", ADMIN_TOKEN)
    admin.get_by_role("button", name="Sign in").click()
    expect(admin.locator("#queue tbody tr")).to_have_count(1)
    expect(admin.locator("#queue tbody tr")).to_contain_text("starting (models loading)")
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#queue-status")).to_be_hidden()
    page.wait_for_function("() => window.omnipipeChat.turnsCompleted >= 1")
    expect(page.get_by_label("Your message")).to_have_value("Is it up yet?")
    home = new_page()
    home.goto(loading_stack.url + "/")
    expect(home.locator("#status-note")).to_contain_text("the service is starting (models loading)")


def test_voice_counts_the_estimated_wait_down_while_queued(toy_stack: Stack, new_page: Any) -> None:
    assert toy_stack.admin("PUT", "/eta", json={"baselines": {"voice": 40}}).status_code == 200
    with connect(toy_stack.gateway.ws_url, max_size=None, open_timeout=30) as voice:  # holds the only worker
        assert json.loads(voice.recv(timeout=30))["position"] == 0
        assert json.loads(voice.recv(timeout=30))["type"] == "queue_done"
        page = new_page()
        page.goto(toy_stack.url + "/voice")
        page.get_by_role("button", name="Start").click()  # Chromium's fake microphone
        detail = page.locator("#state-detail")
        expect(page.locator("#state-label")).to_have_text("In the queue")
        expect(detail).to_contain_text("You are next in the queue · estimated wait about")
        first = int(re.search(r"about (\d+) s", detail.inner_text()).group(1))  # type: ignore[union-attr]
        page.wait_for_function("""(first) => {
            const m = /about (\\d+) s/.exec(document.querySelector('#state-detail').textContent);
            return m && Number(m[1]) < first;
        }""", arg=first, timeout=30_000)
        screenshot(page, "voice-queued-countdown")
        page.get_by_role("button", name="Leave queue").click()
        expect(page.get_by_role("button", name="Start")).to_be_enabled()
        wait_for(lambda: toy_stack.admin("GET", "/queue").json() == [], 30, "the queue emptied")
