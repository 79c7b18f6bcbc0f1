"""Path traversal on the asset and session routes, oversized uploads, and the admin API without a token — against
a real gateway process (its worker address has nothing listening: none of this needs a model); request lines in an
HTTP version no one speaks get 505."""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from omnipipe.util.net import free_port
from tests.gateway.conftest import CliProcess, GatewayProcess, running
from tests.waiting import wait_until_answers

SECRET = "top-secret-content-0451"
SESSION = "20261122-000000_chat_0123456789"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("gateway-security")
    (workdir / "secret.txt").write_text(SECRET)
    session = workdir / "data" / "sessions" / SESSION
    (session / "ai_audio").mkdir(parents=True)
    (session / "meta.json").write_text(json.dumps({"session_id": SESSION, "type": "chat", "created_at": time.time()}))
    (session / "recording.json").write_text(json.dumps({"session_id": SESSION, "turns": []}))
    (session / "ai_audio" / "turn001.wav").write_bytes(b"RIFF....WAVE")
    os.symlink(workdir / "secret.txt", session / "leak.txt")  # a symlink inside pointing out
    os.symlink(workdir, workdir / "data" / "sessions" / "evil_session")  # a session dir that is a symlink
    process = GatewayProcess([f"127.0.0.1:{free_port()}"], workdir, extra=["--max-body-bytes", "100000"])
    with running(process):
        process.wait_ready(60, serving=False)
        yield process


def raw_get(gateway: GatewayProcess, path: str) -> tuple[int, str]:
    """GET ``path`` exactly as written (no client-side normalisation of ``..`` or percent escapes)."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    try:
        connection.putrequest("GET", path, skip_accept_encoding=True)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        connection.close()


def test_a_legitimate_session_file_and_asset_are_served(gateway: GatewayProcess) -> None:
    status, body = raw_get(gateway, f"/api/sessions/{SESSION}/files/ai_audio/turn001.wav")
    assert status == 200 and body.startswith("RIFF")
    status, body = raw_get(gateway, f"/api/sessions/{SESSION}")
    assert status == 200 and json.loads(body)["meta"]["type"] == "chat"
    assert raw_get(gateway, "/static/css/omnipipe.css")[0] == 200
    served = httpx.get(f"{gateway.url}/api/sessions/{SESSION}/files/ai_audio/turn001.wav", timeout=10)
    assert served.headers["x-content-type-options"] == "nosniff"


ASSET_ATTACKS = [
    "/static/../app.py", "/static/%2e%2e/app.py", "/static/..%2fapp.py", "/static/%2e%2e%2f%2e%2e%2fconfig.py",
    "/static/css/../../app.py", "/static/css/%2e%2e/%2e%2e/app.py", "/static//etc/passwd", "/static/%2fetc%2fpasswd",
    "/static/..%5capp.py", "/static/%00", "/static/" + "../" * 12 + "etc/passwd",
]
SESSION_ATTACKS = [
    f"/api/sessions/{SESSION}/files/../../../secret.txt",
    f"/api/sessions/{SESSION}/files/%2e%2e/%2e%2e/%2e%2e/secret.txt",
    f"/api/sessions/{SESSION}/files/..%2f..%2f..%2fsecret.txt",
    f"/api/sessions/{SESSION}/files//etc/passwd", f"/api/sessions/{SESSION}/files/%2fetc%2fpasswd",
    f"/api/sessions/{SESSION}/files/leak.txt", f"/api/sessions/{SESSION}/files/ai_audio%5c..%5c..%5csecret.txt",
    f"/api/sessions/{SESSION}/files/ai_audio/%00", "/api/sessions/..%2f..%2fsecret.txt",
    "/api/sessions/%2e%2e/files/secret.txt", "/api/sessions/evil_session",
    "/api/sessions/evil_session/files/secret.txt",
    "/api/sessions/evil_session/download", "/api/sessions/..", "/s/..%2f..%2fsecret.txt",
    f"/api/sessions/{SESSION}%2f..%2f..%2f/files/secret.txt",
]


@pytest.mark.parametrize("path", ASSET_ATTACKS + SESSION_ATTACKS)
def test_path_traversal_is_refused(gateway: GatewayProcess, path: str) -> None:
    status, body = raw_get(gateway, path)
    assert status in (400, 404), (path, status, body[:200])
    assert SECRET not in body and "root:" not in body and "create_gateway_app" not in body


def test_unknown_and_malformed_session_ids(gateway: GatewayProcess) -> None:
    status, body = raw_get(gateway, "/api/sessions/20261122-000000_chat_ffffffffff")
    assert status == 404 and json.loads(body)["error"]["param"] == "session_id"
    status, body = raw_get(gateway, "/api/sessions/bad.id")
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_session_id"
    assert raw_get(gateway, "/api/sessions/" + "a" * 129)[0] == 400


def test_oversized_uploads_are_refused(gateway: GatewayProcess) -> None:
    big = b"x" * 200_000
    declared = httpx.post(f"{gateway.url}/v1/audio/transcriptions", files={"file": ("a.wav", big)}, timeout=10)
    assert declared.status_code == 413 and declared.json()["error"]["param"] == "body"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the gateway must count as it reads
        for _ in range(20):
            yield b"y" * 10_000

    streamed = httpx.post(f"{gateway.url}/v1/chat/completions", content=chunks(), timeout=10,
                          headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413


def test_admin_is_disabled_without_a_configured_token(tmp_path: Path) -> None:
    process = CliProcess("gateway-no-admin", ["gateway", "--workers", f"127.0.0.1:{free_port()}", "--port",
                                              str(port := free_port()), "--data-dir", str(tmp_path / "data")],
                         tmp_path)
    with running(process):
        url = f"http://127.0.0.1:{port}"
        wait_until_answers(f"{url}/health", 60, "the gateway answered", check_alive=process.check_alive,
                           detail=process.log_text)
        response = httpx.get(f"{url}/api/admin/workers", headers={"Authorization": "Bearer anything-at-all"})
        assert response.status_code == 401 and response.json()["error"]["code"] == "admin_disabled"
        assert "--admin-token" in response.json()["error"]["message"]


def test_cross_origin_websocket_is_refused(gateway: GatewayProcess) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url = f"ws://127.0.0.1:{gateway.port}/v1/realtime"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, origin="http://evil.example", open_timeout=10)
    assert refused.value.response.status_code == 403
    # the gateway's own pages (same origin) and clients without an Origin get in
    with connect(url, origin=f"http://127.0.0.1:{gateway.port}", open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "queued"
    with connect(url, open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "queued"


def test_oversized_request_headers_get_431(gateway: GatewayProcess) -> None:
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        big = client.get("/health", headers={"X-Big": "a" * 70_000})
        many = client.get("/health", headers=[(f"X-H{i}", "1") for i in range(3000)])
        assert client.get("/health").status_code in (200, 503)  # answered as usual (its workers may be down)
    for response in (big, many):
        assert response.status_code == 431, response.text
        assert response.json()["error"]["code"] == "request_headers_too_large"


def raw_status_line(gateway: GatewayProcess, version: str, path: str) -> str:
    """The status line the gateway answers ``GET path HTTP/<version>`` with, sent as raw bytes over a socket."""
    request = f"GET {path} HTTP/{version}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.sendall(request.encode("ascii"))
        answer = b""
        while b"\r\n" not in answer and (data := sock.recv(65536)):
            answer += data
    return answer.split(b"\r\n", 1)[0].decode("latin-1")


def test_unsupported_http_versions_get_505(gateway: GatewayProcess) -> None:
    for version in ("9.9", "0.9", "2.0"):
        status = raw_status_line(gateway, version, "/static/css/omnipipe.css")  # 200 when served
        assert status.split(" ")[1] == "505", (version, status)
    for version in ("1.0", "1.1"):
        status = raw_status_line(gateway, version, "/static/css/omnipipe.css")
        assert status.split(" ")[1] == "200", (version, status)
