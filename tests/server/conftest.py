"""A real ``omnipipe serve`` subprocess on a free loopback port, and helpers to talk to it."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from omnipipe.util.net import free_port
from tests.conftest import state_is_idle
from tests.waiting import wait_for, wait_until_answers

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_BODY_BYTES = 2_000_000
# the toy thinker sleeps a little per token, so streams last long enough to be cut at random points
TOY_DEPLOY = {"stages": {"thinker": {"options": {"step_delay_ms": 2}}}}
# deterministic speech; greedy text
DEFAULT_DEPLOY = {"stages": {"talker": {"options": {"noise_scale": 0.0, "noise_w": 0.0}}}}


def decode_audio(data: bytes) -> tuple[np.ndarray, int]:
    """Mono float samples and rate of an encoded audio file or stream (mp3, ogg/opus, aac, flac, wav), via PyAV;
    a stream cut short decodes up to where it stops."""
    import av

    parts: list[np.ndarray] = []
    rate = 0
    to_float = av.AudioResampler(format="flt", layout="mono")
    try:
        with av.open(io.BytesIO(data)) as container:
            for frame in container.decode(audio=0):
                rate = frame.sample_rate
                parts.extend(f.to_ndarray().reshape(-1) for f in to_float.resample(frame))
    except (av.error.InvalidDataError, av.error.EOFError):
        pass  # cut short: what decoded so far
    return (np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)), rate


@functools.lru_cache(maxsize=32)
def _spoken(text: str, rate: int, steady: bool) -> np.ndarray:
    from piper import PiperVoice, SynthesisConfig

    from omnipipe.models.default.weights.voice import PACKAGED_VOICES
    from omnipipe.util.audio import resample

    packaged = PACKAGED_VOICES["joe"]
    voice = PiperVoice.load(packaged.model_path(), packaged.config_path())
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0) if steady else None
    chunks = list(voice.synthesize(text, syn_config=config))
    audio = np.concatenate([chunk.audio_float_array for chunk in chunks]).astype(np.float32)
    return resample(audio, chunks[0].sample_rate, rate)


def spoken(text: str, rate: int = 24_000, steady: bool = False) -> np.ndarray:
    """``text`` read aloud by the packaged Piper voice, float32 mono at ``rate`` (real speech for a VAD or an
    ASR, without a server). The voice varies its delivery a little each process; ``steady``: no variation, the
    same samples every run."""
    return _spoken(text, rate, steady).copy()


class ServerProcess:
    def __init__(self, pipeline: str, deploy: dict[str, Any] | None, tmp: Path, api_key: str | None = API_KEY,
                 max_body_bytes: int = MAX_BODY_BYTES, command_name: str = "serve",
                 extra_args: Sequence[str] = ()) -> None:
        """``command_name`` is the CLI subcommand (``serve`` or ``worker``); ``extra_args`` go after the others."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log_path = tmp / f"server-{pipeline}-{self.port}.log"
        command = [sys.executable, "-m", "omnipipe.cli.main", command_name, "--pipeline", pipeline,
                   "--host", "127.0.0.1", "--port", str(self.port), "--max-body-bytes", str(max_body_bytes)]
        if deploy is not None:
            deploy_path = tmp / f"deploy-{pipeline}.yaml"
            deploy_path.write_text(yaml.safe_dump(deploy))
            command += ["--deploy", str(deploy_path)]
        if api_key is not None:
            command += ["--api-key", api_key]
        command += list(extra_args)
        self.log = self.log_path.open("wb")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until /health says 200 (a 503 "loading" meanwhile is fine; any other answer fails)."""
        def ready(response: httpx.Response) -> bool:
            if response.status_code == 200:
                return True
            assert response.status_code == 503 and response.json()["status"] == "loading", response.text
            return False

        wait_until_answers(f"{self.url}/health", timeout_s, "the server got ready", accept=ready,
                           check_alive=self.check_alive, detail=self.log_text)

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"server exited with {self.process.returncode}: {self.log_text()}")

    def client(self, timeout_s: float = 120) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout_s)

    def debug_state(self) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/debug/state", headers=self.headers, timeout=30)
        response.raise_for_status()
        return response.json()

    def wait_idle(self, timeout_s: float = 20.0) -> dict[str, Any]:
        """Poll /debug/state until every started engine holds nothing (bounded); return the last state."""
        last: list[dict[str, Any]] = []

        def idle() -> bool:
            last[:] = [self.debug_state()]
            return engines_idle(last[0])

        with contextlib.suppress(AssertionError):  # the caller judges the state it gets back
            wait_for(idle, timeout_s, "every engine idle")
        return last[0]

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self.log.close()


def engines_idle(state: dict[str, Any]) -> bool:
    return all(info["state"] is None or state_is_idle(info["state"]) for info in state["engines"].values())


@contextlib.contextmanager
def running_server(pipeline: str, deploy: Any, workdir: Path, ready_timeout_s: float,
                   **kwargs: Any) -> Iterator[ServerProcess]:
    """A server process that is ready inside the block and stopped after it."""
    server = ServerProcess(pipeline, deploy, workdir, **kwargs)
    try:
        server.wait_ready(ready_timeout_s)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def toy_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_server("toy", TOY_DEPLOY, tmp_path_factory.mktemp("toy-server"), 120) as server:
        yield server
    assert server.process.returncode == 0, server.log_text()


@pytest.fixture(scope="session")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_server("default", DEFAULT_DEPLOY, tmp_path_factory.mktemp("default-server"), 600) as server:
        yield server
