"""Presets and share links against real processes: a toy worker behind ``omnipipe gateway --presets FILE``.

A share link opens one recorded session read-only and never reveals the session's id (which would let its holder
continue the chat or keep access after a revoke); it survives a gateway restart, and once the admin revokes it,
its page answers 410 and so do its data and files.
"""

from __future__ import annotations

import http.client
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from omnipipe.gateway.config import GatewayConfig
from omnipipe.util.field_error import FieldError
from omnipipe.util.net import free_port
from tests.gateway.conftest import GatewayProcess, WorkerProcess, running
from tests.server.conftest import TOY_DEPLOY

PRESETS = [
    {"name": "Pirate", "instructions": "Answer like a pirate.", "voice": "default", "output_modalities": ["text"]},
    {"name": "Plain", "output_modalities": ["audio", "text"]},
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, WorkerProcess, GatewayProcess]]:
    workdir = tmp_path_factory.mktemp("gateway-shares")
    (workdir / "presets.yaml").write_text(yaml.safe_dump({"presets": PRESETS}))
    worker = WorkerProcess("toy", workdir, deploy=TOY_DEPLOY)
    gateway = GatewayProcess([worker.address], workdir, extra=["--presets", str(workdir / "presets.yaml")])
    with running(gateway, worker):
        worker.wait_state("IDLE", 120)
        gateway.wait_ready(60)
        yield workdir, worker, gateway


def restarted(workdir: Path, worker: WorkerProcess, gateway: GatewayProcess) -> GatewayProcess:
    """Stop ``gateway`` and start a new one on the same data directory."""
    gateway.stop()
    again = GatewayProcess([worker.address], workdir)
    again.wait_ready(60)
    return again


def recorded_chat(gateway: GatewayProcess, question: str) -> str:
    """Ask one question through the gateway; the id of its recording."""
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=60,
                        json={"model": "toy", "messages": [{"role": "user", "content": question}],
                              "modalities": ["text", "audio"], "audio": {"voice": "default", "format": "wav"}})
    assert answer.status_code == 200, answer.text
    return answer.headers["x-omnipipe-session-id"]


def raw_get(gateway: GatewayProcess, path: str) -> tuple[int, str]:
    """GET ``path`` exactly as written (no client-side removal of ``.`` or ``..`` segments)."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        connection.close()


def gateway_command(*args: str) -> subprocess.CompletedProcess[str]:
    """``omnipipe gateway ARGS`` for a worker address where nothing listens, run to its end."""
    return subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "gateway", "--workers",
                           f"127.0.0.1:{free_port()}", "--port", str(free_port()), *args], capture_output=True,
                          text=True, timeout=60)


# ---------------------------------------------------------------------------------------------- presets
def test_the_presets_of_the_config_file_are_served(stack) -> None:
    _, _, gateway = stack
    served = httpx.get(f"{gateway.url}/api/presets", timeout=10).json()
    assert served == {"presets": [
        {"name": "Pirate", "instructions": "Answer like a pirate.", "voice": "default", "output_modalities": ["text"]},
        {"name": "Plain", "instructions": "", "voice": None, "output_modalities": ["text", "audio"]},
    ]}


@pytest.mark.parametrize(("presets", "field"), [
    ([{"name": "a"}, {"name": "b", "voice": "two words"}], "presets[1].voice"),
    ([{"name": "a", "output_modalities": ["audio"]}], "presets[0].output_modalities"),
    ([{"name": "a", "output_modalities": "text"}], "presets[0].output_modalities"),
    ([{"name": "a", "instructions": 5}], "presets[0].instructions"),
    ([{"name": " "}], "presets[0].name"),
    ([{"instructions": "x"}], "presets[0].name"),
    ([{"name": "a"}, {"name": "a"}], "presets[1].name"),
    ([{"name": "a", "temperature": 2}], "presets[0].temperature"),
    (["a"], "presets[0]"),
    ({"name": "a"}, "presets"),
])
def test_a_bad_preset_is_refused_naming_its_field(presets: object, field: str) -> None:
    with pytest.raises(FieldError) as caught:
        GatewayConfig(workers=["127.0.0.1:1"], presets=presets)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_the_gateway_and_up_commands_name_the_bad_preset_field(tmp_path: Path) -> None:
    presets = tmp_path / "presets.yaml"
    presets.write_text(yaml.safe_dump({"presets": [{"name": "ok"}, {"name": "loud", "voice": "no such/voice"}]}))
    done = gateway_command("--presets", str(presets))
    assert done.returncode == 2
    assert f"--presets {presets}: presets[1].voice:" in done.stderr
    done = subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "up", "--pipeline", "toy", "--port",
                           str(free_port()), "--worker-port", str(free_port()), "--presets", str(presets)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"--presets {presets}: presets[1].voice:" in done.stderr  # before any start
    (tmp_path / "broken.yaml").write_text("presets: [name: x")
    done = gateway_command("--presets", str(tmp_path / "broken.yaml"))
    assert done.returncode == 2 and "not valid YAML or JSON" in done.stderr


# ---------------------------------------------------------------------------------------------- share links
def test_a_share_link_opens_one_session_read_only_survives_a_restart_and_ends_when_revoked(stack) -> None:
    workdir, worker, _ = stack
    workdir = workdir / "restarted"  # a gateway of its own, as this test restarts it
    workdir.mkdir()
    gateway = GatewayProcess([worker.address], workdir)
    gateway.wait_ready(60)
    session_id = recorded_chat(gateway, "shared question")
    other_id = recorded_chat(gateway, "private question")
    made = httpx.post(f"{gateway.url}/api/sessions/{session_id}/share", timeout=10)
    assert made.status_code == 201, made.text
    url, share_id = made.json()["url"], made.json()["share_id"]
    token = url.removeprefix("/shared/")
    assert url.startswith("/shared/") and len(token) >= 32
    assert httpx.post(f"{gateway.url}/api/sessions/20260101-000000_chat_00000000ff/share", timeout=10).status_code \
        == 404

    page = httpx.get(f"{gateway.url}{url}", timeout=10)
    assert page.status_code == 200 and 'src="/static/js/session.js"' in page.text
    assert page.headers["referrer-policy"] == "no-referrer" and page.headers["cache-control"] == "no-store"
    shared = httpx.get(f"{gateway.url}/api/shared/{token}", timeout=10)
    assert shared.status_code == 200
    assert shared.json()["recording"]["turns"][0]["user_text"] == "shared question"
    assert session_id not in shared.text and session_id.split("_")[-1] not in shared.text  # nor its random part
    assert "meta.json" not in shared.json()["files"] and "recording.json" not in shared.json()["files"]
    audio = next(name for name in shared.json()["files"] if name.endswith(".wav"))
    recorded = (gateway.data_dir / "sessions" / session_id / audio).read_bytes()
    assert httpx.get(f"{gateway.url}/api/shared/{token}/files/{audio}", timeout=10).content == recorded
    for hidden in ("meta.json", "recording.json", "./meta.json", "ai_audio/./../meta.json", f"../{other_id}/meta.json",
                   "no-such-file.wav"):
        status, body = raw_get(gateway, f"/api/shared/{token}/files/{hidden}")
        assert status in (400, 404) and session_id not in body, hidden
    assert httpx.get(f"{gateway.url}/api/shared/{token}/share", timeout=10).status_code in (404, 405)
    assert httpx.post(f"{gateway.url}/api/shared/{token}/share", timeout=10).status_code in (404, 405)
    assert token not in (gateway.data_dir / "shares.json").read_text()  # only its hash is stored

    unknown = httpx.get(f"{gateway.url}/shared/{'x' * 32}", timeout=10)
    assert unknown.status_code == 404 and "Share link not found" in unknown.text

    gateway = restarted(workdir, worker, gateway)
    try:
        assert httpx.get(f"{gateway.url}/api/shared/{token}", timeout=10).json()["recording"]["turns"][0][
            "user_text"] == "shared question"
        listed = gateway.admin("GET", "/shares").json()
        assert [(s["share_id"], s["session_id"], s["status"]) for s in listed] == [(share_id, session_id, "active")]
        assert httpx.delete(f"{gateway.url}/api/admin/shares/{share_id}", timeout=10).status_code == 401
        revoked = gateway.admin("DELETE", f"/shares/{share_id}")
        assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
        assert gateway.admin("DELETE", "/shares/000000000000").status_code == 404

        page = httpx.get(f"{gateway.url}{url}", timeout=10)
        assert page.status_code == 410 and "Share link revoked" in page.text
        assert httpx.get(f"{gateway.url}/api/shared/{token}", timeout=10).json()["error"]["code"] == "share_revoked"
        assert httpx.get(f"{gateway.url}/api/shared/{token}/files/{audio}", timeout=10).status_code == 410
        assert httpx.get(f"{gateway.url}/api/sessions/{session_id}", timeout=10).status_code == 200  # untouched

        gateway = restarted(workdir, worker, gateway)
        assert httpx.get(f"{gateway.url}{url}", timeout=10).status_code == 410
        assert gateway.admin("GET", "/shares").json()[0]["status"] == "revoked"
    finally:
        gateway.stop()


def test_an_unreadable_shares_file_stops_the_gateway_with_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shares.json").write_text("{not json")
    done = gateway_command("--data-dir", str(tmp_path / "data"))
    assert done.returncode == 2
    assert "--data-dir:" in done.stderr and "shares.json: the share links cannot be read" in done.stderr
    assert (tmp_path / "data" / "shares.json").read_text() == "{not json"  # nothing lost
