"""Browser tests of the gateway's web pages: Playwright drives Debian's Chromium (``/usr/bin/chromium``).

Playwright's own browser downloads are never used. Without ``/usr/bin/chromium`` the tests are skipped, except in
CI (``CI`` set), where they fail. Screenshots go to ``test-artifacts/screenshots/`` at the repository root.

Fixtures start real processes: ``bare_gateway`` is a gateway whose only worker address answers nothing (no model
is loaded; enough for pages that need no worker), ``default_stack`` is one ``omnipipe worker --pipeline default
--capacity 2`` behind a gateway, ``drawing_stack`` one ``omnipipe worker --pipeline think-and-draw``,
``omni_stack`` one ``omnipipe worker --pipeline qwen2_5_omni`` on a tiny checkpoint the fixture writes. All are
module-scoped and stopped (then killed if need be) with every process they started.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import wave
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest

try:
    from playwright.sync_api import expect
except ImportError:  # _chromium_present skips every test (or fails them in CI)
    expect = None

from omnipipe.util.net import free_port
from tests.gateway.conftest import ADMIN_TOKEN, CliProcess, GatewayProcess, WorkerProcess
from tests.server.conftest import DEFAULT_DEPLOY

CHROMIUM = Path("/usr/bin/chromium")
REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO_ROOT / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]
VIEWPORT = {"width": 1100, "height": 860}
RATE = 24_000

__all__ = ["ADMIN_TOKEN", "RATE", "Stack", "expect", "launch_chromium", "screenshot", "silence", "small_png", "speech",
           "write_wav"]


# ---------------------------------------------------------------------------------------------- the browser
def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (the browser tests must run in CI; make test installs Chromium)", pytrace=False)
    pytest.skip(f"{reason}; install Debian's chromium package to run the browser tests")


@pytest.fixture(scope="session", autouse=True)
def _chromium_present() -> None:
    """Skip (or, in CI, fail) every browser test before any process starts when Chromium is missing."""
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        _missing(f"{CHROMIUM} is not installed")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _missing("the playwright Python package is not installed")


def launch_chromium(playwright: Any, *extra_args: str) -> Any:
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=[*CHROMIUM_ARGS, *extra_args])


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    # module scope: Playwright's event loop does not outlive the browser tests
    from playwright.sync_api import sync_playwright

    with sync_playwright() as instance:
        yield instance


@pytest.fixture(scope="module")
def browser(playwright: Any) -> Iterator[Any]:
    browser = launch_chromium(playwright)
    yield browser
    browser.close()


@pytest.fixture
def new_page(browser: Any) -> Iterator[Callable[..., Any]]:
    """``new_page(browser=None)``: a page in a fresh context; uncaught JavaScript errors fail the test."""
    contexts: list[Any] = []
    errors: list[str] = []

    def make(in_browser: Any = None) -> Any:
        context = (in_browser or browser).new_context(viewport=VIEWPORT)
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(f"{page.url}: {error}"))
        return page

    yield make
    for context in contexts:
        context.close()
    assert not errors, f"uncaught JavaScript errors: {errors}"


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot as ``test-artifacts/screenshots/{name}.png``."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=True)
    return path


# ---------------------------------------------------------------------------------------------- the servers
def _stop_all(processes: list[CliProcess]) -> None:
    """Stop each process (SIGINT, then kill), then kill any of its descendants that outlived it."""
    descendants: list[psutil.Process] = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            descendants += psutil.Process(process.process.pid).children(recursive=True)
    for process in processes:
        process.stop()
    _, alive = psutil.wait_procs(descendants, timeout=15)
    for leftover in alive:
        leftover.kill()
    psutil.wait_procs(alive, timeout=10)
    assert not alive, f"processes outlived their parent and were killed: {[p.pid for p in alive]}"


@dataclass
class Stack:
    """A gateway (``url``, ``data_dir``) and the workers behind it."""

    gateway: GatewayProcess
    workers: list[WorkerProcess] = field(default_factory=list)
    workdir: Path | None = None

    @property
    def url(self) -> str:
        return self.gateway.url

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.gateway.admin(method, path, **kwargs)


@pytest.fixture(scope="module")
def bare_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A gateway whose one worker address has nothing listening: pages, admin and sessions without a model."""
    workdir = tmp_path_factory.mktemp("bare-gateway")
    gateway = GatewayProcess([f"127.0.0.1:{free_port()}"], workdir)
    try:
        gateway.wait_ready(timeout_s=60, serving=False)
        yield Stack(gateway, [], workdir)
    finally:
        _stop_all([gateway])


def _worker_behind_gateway(workdir: Path, pipeline: str, **worker_options: Any) -> Iterator[Stack]:
    """``omnipipe worker --pipeline PIPELINE`` behind ``omnipipe gateway``, both stopped afterwards."""
    worker = WorkerProcess(pipeline, workdir, **worker_options)
    processes: list[CliProcess] = [worker]
    try:
        worker.wait_state("IDLE", timeout_s=600)
        gateway = GatewayProcess([worker.address], workdir)
        processes.insert(0, gateway)
        gateway.wait_ready(timeout_s=60)
        yield Stack(gateway, [worker], workdir)
    finally:
        _stop_all(processes)


@pytest.fixture(scope="module")
def default_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """``omnipipe worker --pipeline default --capacity 2`` (deterministic speech) behind ``omnipipe gateway``."""
    yield from _worker_behind_gateway(tmp_path_factory.mktemp("default-stack"), "default", capacity=2,
                                      deploy=DEFAULT_DEPLOY)


@pytest.fixture(scope="module")
def drawing_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """``omnipipe worker --pipeline think-and-draw`` (text, then an 8x8 drawing) behind ``omnipipe gateway``."""
    yield from _worker_behind_gateway(tmp_path_factory.mktemp("think-and-draw-stack"), "think-and-draw")


@pytest.fixture(scope="module")
def omni_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """``omnipipe worker --pipeline qwen2_5_omni`` on a tiny random checkpoint written here (text, image, audio and
    video in; answers of 8 tokens) behind ``omnipipe gateway``."""
    from omnipipe.models.qwen2_5_omni.weights.tiny import write_tiny_checkpoint

    workdir = tmp_path_factory.mktemp("omni-stack")
    checkpoint = write_tiny_checkpoint(workdir / "checkpoint", seed=0)
    stages = {name: {"threads": 1, "options": {"model": str(checkpoint)}}
              for name in ("thinker", "talker", "token2wav")}
    stages["thinker"]["options"]["max_new_tokens"] = 8
    stages["talker"]["options"]["max_new_tokens"] = 40
    yield from _worker_behind_gateway(workdir, "qwen2_5_omni", deploy={"stages": stages})


def speech(worker: WorkerProcess, text: str) -> np.ndarray:
    """``text`` read by the worker's tts pipeline: 24 kHz mono int16 samples."""
    response = httpx.post(f"http://{worker.address}/v1/audio/speech", timeout=300,
                          json={"model": "tts", "input": text, "voice": "default", "response_format": "pcm"})
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content, dtype="<i2")


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), dtype="<i2")


def write_wav(path: Path, *pieces: np.ndarray) -> Path:
    """The pieces, one after the other, as a 24 kHz mono 16-bit WAV (what Chromium's fake microphone plays)."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(np.concatenate(pieces).astype("<i2").tobytes())
    path.write_bytes(buffer.getvalue())
    return path


@pytest.fixture(scope="module")
def mic_browser(playwright: Any) -> Iterator[Callable[[Path], Any]]:
    """``mic_browser(wav)``: a Chromium whose fake microphone plays ``wav`` once (``%noloop``), then silence."""
    launched: list[Any] = []

    def launch(wav: Path) -> Any:
        browser = launch_chromium(playwright, f"--use-file-for-fake-audio-capture={wav}%noloop")
        launched.append(browser)
        return browser

    yield launch
    for browser in launched:
        browser.close()


def small_png(size: int = 64) -> bytes:
    """A valid ``size`` x ``size`` PNG, a blue square (for the image-upload error path)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + b"\x3b\x5b\xdb" * size for _ in range(size))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
