"""``omnipipe up``, ``omnipipe gateway`` and ``omnipipe sessions`` as a user runs them (real subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from omnipipe.util.net import free_port
from tests.waiting import wait_for, wait_until_answers

pytestmark = pytest.mark.slow  # omnipipe up: worker and gateway processes started, killed and restarted

CLI = [sys.executable, "-m", "omnipipe.cli.main"]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_up_starts_workers_and_gateway_and_ctrl_c_stops_them_all(tmp_path: Path) -> None:
    port, worker_port = free_port(), free_port()
    process = subprocess.Popen([*CLI, "up", "--workers", "2", "--pipeline", "toy", "--port", str(port),
                                "--worker-port", str(worker_port), "--data-dir", str(tmp_path / "data")],
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            assert line, f"omnipipe up ended early: {''.join(lines)}"
            lines.append(line)
            if "ready." in line:
                break
        assert "ready." in lines[-1] and "token " in lines[-1], lines
        token = lines[-1].split("token ")[1].split(")")[0]
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()
        assert set(health["workers"].values()) == {"IDLE"} and len(health["workers"]) == 2, health
        admin = httpx.get(f"http://127.0.0.1:{port}/api/admin/workers", timeout=10,
                          headers={"Authorization": f"Bearer {token}"})
        assert admin.status_code == 200 and len(admin.json()) == 2
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                            json={"model": "toy", "messages": [{"role": "user", "content": "up"}]})
        assert answer.json()["choices"][0]["message"]["content"] == "UP"
        children = psutil.Process(process.pid).children(recursive=True)
        assert len(children) >= 3
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_up_restarts_a_killed_worker_while_the_gateway_serves_on(tmp_path: Path) -> None:
    port, worker_port = free_port(), free_port()
    killed_port = worker_port + 1
    token = "up-restart-test-token"
    process = subprocess.Popen([*CLI, "up", "--workers", "2", "--pipeline", "toy", "--port", str(port),
                                "--worker-port", str(worker_port), "--data-dir", str(tmp_path / "data"),
                                "--admin-token", token],
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []  # `up`'s stderr (its children's too), read all along so that no one blocks on the pipe
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")), daemon=True)
    reader.start()

    def said(text: str) -> bool:
        return any(text in line for line in list(lines))

    def worker_pids() -> list[int]:
        return [c.pid for c in psutil.Process(process.pid).children()
                if c.cmdline()[3:6] == ["worker", "--port", str(killed_port)]]

    def chat(content: str) -> str:
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                            json={"model": "toy", "messages": [{"role": "user", "content": content}]})
        assert answer.status_code == 200, answer.text
        return answer.json()["choices"][0]["message"]["content"]

    def state() -> str | None:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["workers"].get(f"127.0.0.1:{killed_port}")

    def sessions_on_the_victim() -> int:
        workers = httpx.get(f"http://127.0.0.1:{port}/api/admin/workers", timeout=5,
                            headers={"Authorization": f"Bearer {token}"}).json()
        return next(w["active_sessions"] for w in workers if w["address"] == f"127.0.0.1:{killed_port}")

    try:
        wait_for(lambda: said("ready.") or process.poll() is not None, 180, "up said ready (or ended)",
                 interval_s=0.2)
        assert said("ready."), "".join(lines)
        [old_pid] = worker_pids()
        old_group = psutil.Process(old_pid).children(recursive=True)
        # (a) a request that reaches the worker after its SIGKILL but before its process has ended (its sockets are
        # still open: SIGSTOP holds it in that state) is served by the survivor, not answered 502. Of two requests
        # one goes to each worker, unless the gateway has meanwhile taken the stopped one offline (no answers)
        os.kill(old_pid, signal.SIGSTOP)
        with ThreadPoolExecutor(2) as threads:
            try:
                answers = [threads.submit(chat, f"during {i}") for i in range(2)]
                wait_for(lambda: sessions_on_the_victim() > 0 or all(a.done() for a in answers), 60,
                         "a request on the stopped worker", interval_s=0.05)
            finally:
                os.kill(old_pid, signal.SIGKILL)  # whatever happened: no worker stays stopped
            assert sorted(a.result() for a in answers) == ["DURING 0", "DURING 1"]
        # and it goes on answering, on the survivor, right after the kill
        assert [chat(f"after {i}") for i in range(4)] == [f"AFTER {i}" for i in range(4)]
        # (c) `up` says what it does, one line per event
        wait_for(lambda: said(f"worker {killed_port} exited with code -9; restarting in 1 s (restart 1 of 5)"),
                 30, "up said it restarts the worker")
        # (b) a new process serves on that port and the gateway takes it back by itself
        [new_pid] = wait_for(worker_pids, 30, "a new worker process", interval_s=0.2)
        assert new_pid != old_pid
        wait_for(lambda: state() == "IDLE", 120, "the gateway saw the restarted worker IDLE", interval_s=0.2)
        assert httpx.get(f"http://127.0.0.1:{killed_port}/health", timeout=5).json()["state"] == "IDLE"
        wait_for(lambda: said(f"worker {killed_port} is back (restart 1 of 5)"), 30, "up said the worker is back")
        assert process.poll() is None and chat("again") == "AGAIN"
        # (d) Ctrl-C still stops everything
        children = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, "".join(lines)
        gone, alive = psutil.wait_procs([*children, *old_group], timeout=30)
        assert not alive, [p.cmdline() for p in alive]
        assert not said("stopping everything"), "".join(lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(timeout=10)


@pytest.mark.parametrize("args, message", [
    (["gateway", "--workers", "nohost"], "--workers: a worker address must look like 'host:port'"),
    (["gateway", "--workers", "127.0.0.1:1", "--port", "0"], "--port: must be in 1..65535"),
    (["gateway", "--workers", "127.0.0.1:1", "--max-queue", "-1"], "--max-queue: must be >= 0"),
    (["gateway", "--workers", "127.0.0.1:1", "--admin-token", "short"], "--admin-token: use at least 8"),
    (["gateway", "--workers", "127.0.0.1:1,127.0.0.1:1"], "--workers: an address is listed twice"),
    (["gateway", "--workers", "127.0.0.1:1", "--retention-days", "-2"], "--retention-days: must be >= 0"),
    (["up", "--workers", "0"], "--workers: must be in 1..64"),
    (["up", "--capacity", "0"], "--capacity: must be >= 1"),
    (["up", "--pipeline", "nope"], "nope"),
    (["sessions", "cleanup", "--data-dir", "/nonexistent/dir"], "--data-dir: not a directory"),
])
def test_command_mistakes_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_up_refuses_a_port_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("up", "--pipeline", "toy", "--port", str(port), "--data-dir", str(tmp_path))
    assert result.returncode == 2 and f"--port: port {port} on 127.0.0.1 is already in use" in result.stderr


def _session(data: Path, session_id: str, age_days: float, size: int) -> None:
    directory = data / "sessions" / session_id
    (directory / "ai_audio").mkdir(parents=True)
    created = time.time() - age_days * 86400
    (directory / "meta.json").write_text(json.dumps({"session_id": session_id, "type": "chat",
                                                      "created_at": created, "status": "completed"}))
    (directory / "ai_audio" / "turn001.wav").write_bytes(b"\0" * size)


def test_sessions_cleanup_by_age_then_size_with_a_report(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _session(data, "old_chat_1", 40, 1000)
    _session(data, "mid_chat_2", 5, 600_000)
    _session(data, "new_chat_3", 1, 600_000)
    listed = run_cli("sessions", "list", "--data-dir", str(data))
    assert listed.returncode == 0 and [line.split()[0] for line in listed.stdout.splitlines()] == [
        "new_chat_3", "mid_chat_2", "old_chat_1"]
    dry = run_cli("sessions", "cleanup", "--data-dir", str(data), "--retention-days", "30", "--max-storage-gb",
                  "0.001", "--dry-run")
    assert dry.returncode == 0 and (data / "sessions" / "old_chat_1").exists(), dry.stdout
    result = run_cli("sessions", "cleanup", "--data-dir", str(data), "--retention-days", "30",
                     "--max-storage-gb", "0.001")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (data / "sessions").iterdir()) == ["new_chat_3"]
    assert "scanned 3 session(s)" in result.stdout
    assert "deleted 1 past the retention period and 1 over the size limit" in result.stdout, result.stdout
    assert "remaining: 1 session(s)" in result.stdout


def test_gateway_serves_https_with_a_certificate(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    trusted = ssl.create_default_context(cafile=str(cert))
    port = free_port()
    process = subprocess.Popen([*CLI, "gateway", "--workers", f"127.0.0.1:{free_port()}", "--port", str(port),
                                "--data-dir", str(tmp_path / "data"), "--ssl-certfile", str(cert),
                                "--ssl-keyfile", str(key)], stderr=(log := (tmp_path / "gateway.log").open("w")))
    try:
        def check_alive() -> None:
            assert process.poll() is None, (tmp_path / "gateway.log").read_text()

        page = wait_until_answers(f"https://127.0.0.1:{port}/voice", 60, "the gateway answered over https",
                                  check_alive=check_alive, verify=trusted)
        assert page.status_code == 200 and "<html" in page.text.lower()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)  # plain http is not spoken there
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
        log.close()
    mismatched = run_cli("gateway", "--workers", "127.0.0.1:1", "--ssl-certfile", str(cert))
    assert mismatched.returncode == 2 and "--ssl-certfile and --ssl-keyfile go together" in mismatched.stderr
