"""Real ``omnipipe worker`` and ``omnipipe gateway`` subprocesses on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from omnipipe.util.net import free_port
from tests.waiting import wait_until_answers

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
        return wait_until_answers(f"http://{self.address}/health", timeout_s, f"{self.name} {state}",
                                  accept=lambda response: _health_field(response, "state") == state,
                                  check_alive=self.check_alive, detail=self.log_text).json()


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
        def ready(response: httpx.Response) -> bool:
            workers = _health_field(response, "workers")
            return not serving or (isinstance(workers, dict) and set(workers.values()) == {"IDLE"})

        return wait_until_answers(f"{self.url}/health", timeout_s, "the gateway ready", accept=ready,
                                  check_alive=self.check_alive, detail=self.log_text).json()

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, f"{self.url}/api/admin{path}", headers=ADMIN, timeout=30, **kwargs)

    def worker_states(self) -> dict[str, str]:
        return {w["address"]: w["state"] for w in self.admin("GET", "/workers").json()}


def _health_field(response: httpx.Response, name: str) -> Any:
    """A field of a /health answer, or None when the answer is not a JSON object."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get(name) if isinstance(body, dict) else None


@contextlib.contextmanager
def running(*processes: CliProcess) -> Iterator[None]:
    try:
        yield
    finally:
        for process in processes:
            process.stop()
