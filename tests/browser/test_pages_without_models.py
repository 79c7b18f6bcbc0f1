"""The pages that need no model: home, navigation, the admin page's token handling and controls, and the session
viewer's not-found message. The gateway's only worker address has nothing listening (it shows as offline)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import ADMIN_TOKEN, Stack, expect, screenshot

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
