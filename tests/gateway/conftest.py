"""Real ``omnipipe worker`` and ``omnipipe gateway`` subprocesses on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.server.conftest import free_port

ADMIN_TOKEN = "gateway-test-admin-token"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


class CliProcess:
    """``python -m omnipipe.cli.main ARGS`` with its output in ``log_path``."""

    def __init__(self, name: str, args: list[str], workdir: Path) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self.log = self.log_path.open("wb")
        self.process = subprocess.Popen([sys.executable, "-m", "omnipipe.cli.main", *args], stdout=self.log,
                                        stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {self.log_text()}")

    def stop(self, timeout_s: float = 60) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self.log.close()


class WorkerProcess(CliProcess):
    def __init__(self, pipeline: str, workdir: Path, *, capacity: int = 1, deploy: dict[str, Any] | None = None,
                 extra: list[str] | None = None) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        args = ["worker", "--pipeline", pipeline, "--port", str(self.port), "--capacity", str(capacity)]
        if deploy is not None:
            path = workdir / f"deploy-{pipeline}-{self.port}.yaml"
            path.write_text(yaml.safe_dump(deploy))
            args += ["--deploy", str(path)]
        super().__init__(f"worker-{self.port}", [*args, *(extra or [])], workdir)

    def health(self) -> dict[str, Any]:
        return httpx.get(f"http://{self.address}/health", timeout=5).json()

    def wait_state(self, state: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            self.check_alive()
            with contextlib.suppress(httpx.TransportError, ValueError):
                last = self.health()
                if last.get("state") == state:
                    return last
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not {state} after {timeout_s} s (last {last}): {self.log_text()}")


class GatewayProcess(CliProcess):
    def __init__(self, workers: list[str], workdir: Path, *, extra: list[str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/realtime"
        self.data_dir = workdir / "data"
        args = ["gateway", "--workers", ",".join(workers), "--port", str(self.port), "--admin-token", ADMIN_TOKEN,
                "--data-dir", str(self.data_dir), *(extra or [])]
        super().__init__(f"gateway-{self.port}", args, workdir)

    def wait_ready(self, timeout_s: float = 60, serving: bool = True) -> dict[str, Any]:
        """Wait until the gateway answers; with ``serving``, until it sees every worker IDLE."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            self.check_alive()
            with contextlib.suppress(httpx.TransportError, ValueError):
                last = httpx.get(f"{self.url}/health", timeout=5).json()
                if not serving or set(last.get("workers", {}).values()) == {"IDLE"}:
                    return last
            time.sleep(0.1)
        raise RuntimeError(f"gateway not ready after {timeout_s} s (last {last}): {self.log_text()}")

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, f"{self.url}/api/admin{path}", headers=ADMIN, timeout=30, **kwargs)

    def worker_states(self) -> dict[str, str]:
        return {w["address"]: w["state"] for w in self.admin("GET", "/workers").json()}


@contextlib.contextmanager
def running(*processes: CliProcess) -> Iterator[None]:
    try:
        yield
    finally:
        for process in processes:
            process.stop()
