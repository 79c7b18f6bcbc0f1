"""``omnipipe worker``: the worker protocol of docs/gateway.md on real toy-pipeline subprocesses.

/health states and fields, session counting (streaming HTTP requests until their stream ends, realtime WebSockets
until they close), capacity (429 ``worker_at_capacity`` / error event and close 1013), ``session.pause`` /
``session.resume`` and the pause timeout, a worker whose engine fails to start, and the CLI's argument errors.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from omnipipe.engine.run_dir import OWNER_FILE
from omnipipe.protocol.worker import WorkerState
from omnipipe.server.capacity import SessionTracker
from tests.conftest import shm_segments
from tests.server.conftest import DEFAULT_DEPLOY, ServerProcess, engines_idle, running_server, spoken
from tests.server.test_realtime import LONG_TEXT, SENTENCE, Conn, vad_on, ws_url
from tests.server.test_realtime import session as open_session
from tests.waiting import wait_for, wait_until_answers

pytestmark = pytest.mark.slow  # worker processes started, signalled and left idle past their timeouts

# a slow thinker: a 400-character answer streams for about 4 s
SLOW_DEPLOY = {"stages": {"thinker": {"options": {"step_delay_ms": 10}}}}
# passes deploy validation (runner options are the runner's business) but the toy thinker cannot load with it
BROKEN_DEPLOY = {"stages": {"thinker": {"options": {"step_delay_ms": "not-a-number"}}}}
HEALTH_FIELDS = {"status", "state", "pipeline", "models", "active_sessions", "capacity", "sessions", "companions"}
READY_FIELDS = HEALTH_FIELDS | {"stages", "problems"}  # a running engine also reports each stage's liveness
LONG_CHAT = {"model": "toy", "messages": [{"role": "user", "content": "x " * 200}], "stream": True}
SHORT_CHAT = {"model": "toy", "messages": [{"role": "user", "content": "hi"}]}


def health(server: ServerProcess) -> dict[str, Any]:
    return httpx.get(f"{server.url}/health", timeout=10).json()


def wait_health(server: ServerProcess, check: Callable[[dict[str, Any]], bool],
                timeout_s: float = 20.0) -> dict[str, Any]:
    """Poll /health until ``check`` holds (bounded); return that reply."""
    last: list[dict[str, Any]] = [{}]

    def matched() -> dict[str, Any] | None:
        last[0] = health(server)
        return last[0] if check(last[0]) else None

    return wait_for(matched, timeout_s, "/health matched the check", detail=lambda: f"last: {last[0]}")


def is_idle(body: dict[str, Any]) -> bool:
    return body["state"] == "IDLE"


def start_recording_health(server: ServerProcess, timeout_s: float) -> list[tuple[int, dict[str, Any]]]:
    """Poll /health from the first answer until a 200 or an ERROR; return every (status code, body) seen."""
    seen: list[tuple[int, dict[str, Any]]] = []

    def settled(response: httpx.Response) -> bool:
        seen.append((response.status_code, response.json()))
        return response.status_code == 200 or response.json().get("state") == "ERROR"

    wait_until_answers(f"{server.url}/health", timeout_s, "the worker ready or failed", accept=settled,
                       check_alive=server.check_alive, detail=server.log_text)
    return seen


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A capacity-1 toy worker; ``worker.history`` is every /health reply seen while it started."""
    server = ServerProcess("toy", SLOW_DEPLOY, Path(tmp_path_factory.mktemp("worker")), api_key=None,
                           command_name="worker", extra_args=["--capacity", "1"])
    try:
        server.history = start_recording_health(server, 120)  # type: ignore[attr-defined]
        yield server
    finally:
        server.stop()
    assert server.process.returncode == 0, server.log_text()


@pytest.fixture(scope="module")
def quick_pause_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A capacity-2 toy worker that closes a realtime session paused for more than 1 s."""
    with running_server("toy", SLOW_DEPLOY, Path(tmp_path_factory.mktemp("quick-pause-worker")), 120,
                        api_key=None, command_name="worker",
                        extra_args=["--capacity", "2", "--pause-timeout-s", "1"]) as server:
        yield server
    assert server.process.returncode == 0, server.log_text()


@pytest.fixture(scope="module")
def quick_idle_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A capacity-1 toy worker that closes a realtime session idle for 3 s (warned at once: 3 s < 15 s)."""
    with running_server("toy", SLOW_DEPLOY, Path(tmp_path_factory.mktemp("quick-idle-worker")), 120,
                        api_key=None, command_name="worker",
                        extra_args=["--capacity", "1", "--idle-timeout-s", "3"]) as server:
        yield server
    assert server.process.returncode == 0, server.log_text()


# ---------------------------------------------------------------------------------------------- the tracker alone
def test_session_tracker_counts_and_states() -> None:
    tracker = SessionTracker(capacity=2)
    assert tracker.state("loading") is WorkerState.LOADING and tracker.state("idle") is WorkerState.LOADING
    assert tracker.state("failed") is WorkerState.ERROR
    assert tracker.state("ready") is WorkerState.IDLE
    http = tracker.open("http")
    assert http is not None and tracker.state() is WorkerState.BUSY
    voice = tracker.open("realtime")
    assert voice is not None and tracker.state() is WorkerState.DUPLEX_ACTIVE
    assert tracker.open("http") is None and tracker.open("realtime") is None  # at capacity
    voice.pause()
    voice.pause()  # idempotent
    assert tracker.counts() == {"http": 1, "realtime": 1, "paused": 1} and tracker.active == 2
    assert tracker.state() is WorkerState.DUPLEX_PAUSED  # every realtime session is paused
    http.close()
    http.close()  # idempotent
    other = tracker.open("realtime")
    assert other is not None and tracker.state() is WorkerState.DUPLEX_ACTIVE  # one of two is paused
    other.close()
    voice.close()  # closing a paused session un-counts the pause too
    assert tracker.counts() == {"http": 0, "realtime": 0, "paused": 0} and tracker.state() is WorkerState.IDLE
    assert tracker.state("failed") is WorkerState.ERROR
    unlimited = SessionTracker()
    assert all(unlimited.open("http") is not None for _ in range(100)) and unlimited.capacity is None
    with pytest.raises(ValueError, match="capacity"):
        SessionTracker(0)
    with pytest.raises(ValueError, match="paused"):
        unlimited.open("http").pause()  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------- /health
def test_health_goes_from_loading_to_idle_with_the_protocol_fields(worker: ServerProcess) -> None:
    history = worker.history  # type: ignore[attr-defined]
    first_code, first = history[0]
    assert first_code == 503 and first["state"] == "LOADING" and first["status"] == "loading", history
    assert set(first) == HEALTH_FIELDS, first
    assert all(code == 503 and body["state"] == "LOADING" for code, body in history[:-1]), history
    last_code, last = history[-1]
    assert last_code == 200, history
    stages = last.pop("stages")
    companions = last.pop("companions")
    assert all(c["status"] in ("idle", "ready") for c in companions.values()), companions
    assert last == {"status": "ready", "state": "IDLE", "pipeline": "toy", "models": ["toy", "toy_tts"],
                    "active_sessions": 0, "capacity": 1, "sessions": {"http": 0, "realtime": 0, "paused": 0},
                    "problems": []}
    assert list(stages) == ["thinker", "talker", "code2wav"], stages
    assert all(stage["state"] == "ok" and stage["restarts"] == 0 and stage["pid"] > 0 for stage in stages.values())


def test_serve_reports_the_same_fields_with_unlimited_capacity(toy_server: ServerProcess) -> None:
    body = wait_health(toy_server, is_idle)
    assert set(body) == READY_FIELDS and body["status"] == "ready" and body["problems"] == []
    assert body["capacity"] is None and body["active_sessions"] == 0
    assert body["sessions"] == {"http": 0, "realtime": 0, "paused": 0}


# ---------------------------------------------------------------------------------------------- HTTP sessions
def test_a_streaming_request_is_busy_until_its_stream_ends_and_capacity_refuses_more(worker: ServerProcess) -> None:
    wait_health(worker, is_idle)
    with httpx.Client(base_url=worker.url, timeout=60) as http:
        with http.stream("POST", "/v1/chat/completions", json=LONG_CHAT) as first:
            assert first.status_code == 200
            lines = first.iter_lines()  # kept referenced: dropping it would close the connection (an abort)
            next(lines)
            busy = http.get("/health")
            assert busy.status_code == 200
            assert busy.json()["state"] == "BUSY" and busy.json()["active_sessions"] == 1, busy.json()
            assert busy.json()["sessions"] == {"http": 1, "realtime": 0, "paused": 0}
            for path, kwargs in (("/v1/chat/completions", {"json": SHORT_CHAT}),
                                 ("/v1/audio/speech", {"json": {"model": "toy_tts", "input": "hi"}})):
                refused = http.post(path, **kwargs)
                assert refused.status_code == 429, refused.text
                assert refused.headers["retry-after"] == "1"
                error = refused.json()["error"]
                assert error["code"] == "worker_at_capacity" and error["type"] == "rate_limit_error", error
            assert http.get("/v1/models").status_code == 200  # not a session
            time.sleep(0.5)  # stays: a stretch of time during which the open stream must keep the slot
            assert health(worker)["state"] == "BUSY"  # still streaming
            assert sum(1 for _ in lines) > 0
        # the whole answer was read: the slot is free at once
        after = health(worker)
        assert after["state"] == "IDLE" and after["active_sessions"] == 0, after
        again = http.post("/v1/chat/completions", json=SHORT_CHAT)
        assert again.status_code == 200 and again.json()["choices"][0]["message"]["content"] == "HI"
    assert health(worker)["state"] == "IDLE"
    assert engines_idle(worker.wait_idle())


def test_a_client_that_disconnects_mid_stream_gives_its_slot_back(worker: ServerProcess) -> None:
    wait_health(worker, is_idle)
    with httpx.Client(base_url=worker.url, timeout=60) as http, \
            http.stream("POST", "/v1/chat/completions", json=LONG_CHAT) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        next(lines)
        assert health(worker)["state"] == "BUSY"
        del lines  # closing the stream: the client goes away mid-answer
    wait_health(worker, is_idle, timeout_s=10)
    assert engines_idle(worker.wait_idle())
    assert httpx.post(f"{worker.url}/v1/chat/completions", json=SHORT_CHAT, timeout=60).status_code == 200


# ---------------------------------------------------------------------------------------------- realtime sessions
def test_realtime_session_states_pause_and_resume(worker: ServerProcess) -> None:
    wait_health(worker, is_idle)
    speech = spoken(SENTENCE)
    with open_session(worker) as conn:
        active = health(worker)
        assert active["state"] == "DUPLEX_ACTIVE" and active["active_sessions"] == 1, active
        assert active["sessions"] == {"http": 0, "realtime": 1, "paused": 0}
        vad_on(conn, silence_duration_ms=200)
        # pausing cancels the running response
        conn.user_text(LONG_TEXT)
        conn.send("response.create")
        conn.until("response.output_audio_transcript.delta", "response.output_audio.delta")
        conn.send("session.pause")
        events, paused = conn.until("session.paused")
        done = [e for e in events if e["type"] == "response.done"]
        assert len(done) == 1 and done[0]["response"]["status"] == "cancelled", events
        assert paused["pause_timeout_s"] == 300.0
        body = health(worker)
        assert body["state"] == "DUPLEX_PAUSED" and body["sessions"] == {"http": 0, "realtime": 1, "paused": 1}
        conn.send("session.pause")  # idempotent
        assert conn.recv()["type"] == "session.paused"
        # while paused, speech is dropped (the VAD hears nothing) and no response starts
        conn.append(np.concatenate([speech, np.zeros(12_000, np.float32)]))
        conn.send("conversation.item.create",
                  item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]})
        skipped, created = conn.until("conversation.item.added", "error")
        assert created["type"] == "conversation.item.added" and skipped == [], (skipped, created)
        conn.until("conversation.item.done")
        conn.send("response.create", event_id="client-create")
        error = conn.recv()
        assert error["type"] == "error" and error["error"]["code"] == "session_paused", error
        assert error["error"]["event_id"] == "client-create"
        conn.send("session.resume")
        assert conn.recv()["type"] == "session.resumed"
        assert health(worker)["state"] == "DUPLEX_ACTIVE"
        # after resuming the VAD hears again, and the text item from the pause is answered
        conn.append(speech)
        _, started = conn.until("input_audio_buffer.speech_started")
        assert started["type"] == "input_audio_buffer.speech_started"
        conn.no_vad()
        conn.send("response.create")
        events, done_event = conn.until("response.done")
        assert done_event["response"]["status"] == "completed", (done_event, events)
        assert "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta") == "HELLO"
    wait_health(worker, is_idle, timeout_s=10)
    assert engines_idle(worker.wait_idle())


def test_a_websocket_beyond_capacity_gets_an_error_and_1013(worker: ServerProcess) -> None:
    wait_health(worker, is_idle)
    with open_session(worker) as conn:
        with connect(ws_url(worker), open_timeout=60) as second:
            error = Conn(second, beta=False).recv()
            assert error["type"] == "error" and error["error"]["code"] == "worker_at_capacity", error
            with pytest.raises(ConnectionClosed) as closed:
                second.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        # an HTTP request shares the same capacity
        refused = httpx.post(f"{worker.url}/v1/chat/completions", json=SHORT_CHAT, timeout=60)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "worker_at_capacity"
        body = health(worker)
        assert body["sessions"] == {"http": 0, "realtime": 1, "paused": 0}, body  # refused ones were not kept
        conn.no_vad()  # the first session still works
    wait_health(worker, is_idle, timeout_s=10)


def test_a_session_paused_too_long_is_closed(quick_pause_worker: ServerProcess) -> None:
    server = quick_pause_worker
    wait_health(server, is_idle)
    with open_session(server) as conn:
        # a pause shorter than the timeout changes nothing
        conn.send("session.pause")
        assert conn.recv()["pause_timeout_s"] == 1.0
        conn.send("session.resume")
        assert conn.recv()["type"] == "session.resumed"
        time.sleep(1.5)  # stays: past the 1 s pause timeout, which the resume must have cancelled
        conn.no_vad()
        # a longer one ends the session
        conn.send("session.pause")
        assert conn.recv()["type"] == "session.paused"
        assert health(server)["state"] == "DUPLEX_PAUSED"
        error = conn.recv()
        assert error["type"] == "error" and error["error"]["code"] == "pause_timeout", error
        with pytest.raises(ConnectionClosed) as closed:
            conn.ws.recv(timeout=30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
    wait_health(server, is_idle, timeout_s=10)


def test_an_idle_session_is_warned_then_closed_and_gives_its_slot_back(quick_idle_worker: ServerProcess) -> None:
    server = quick_idle_worker
    wait_health(server, is_idle)
    with open_session(server) as conn:
        warning = conn.recv()
        assert warning["type"] == "session.idle_warning" and 0 < warning["closes_in_s"] <= 3, warning
        assert health(server)["state"] == "DUPLEX_ACTIVE"
        time.sleep(1.5)  # stays: idle time that the typed item below must start counting again
        conn.no_vad(output_modalities=["text"])  # a settings change is not activity
        conn.user_text("still here")  # typing is: the count starts again
        typed = time.monotonic()
        _, error = conn.until("error")
        assert error["type"] == "error" and error["error"]["code"] == "idle_timeout", error
        assert time.monotonic() - typed > 2.5  # counted from the typed item, not from the start
        with pytest.raises(ConnectionClosed) as closed:
            conn.ws.recv(timeout=30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
        assert closed.value.rcvd.reason == "idle_timeout"
    wait_health(server, is_idle, timeout_s=10)  # the slot is free again


# ---------------------------------------------------------------------------------------------- engine failure
def test_a_worker_whose_engine_fails_stays_up_and_reports_error(tmp_path: Path) -> None:
    server = ServerProcess("toy", BROKEN_DEPLOY, tmp_path, api_key=None, command_name="worker")
    try:
        history = start_recording_health(server, 120)
        code, body = history[-1]
        assert code == 503 and body["state"] == "ERROR" and body["status"] == "failed", history
        assert "thinker" in body["error"] and "not-a-number" in body["error"], body
        assert set(body) == HEALTH_FIELDS | {"error"} and body["capacity"] == 2
        time.sleep(1.0)  # stays: a stretch of time during which the worker must not exit
        assert server.process.poll() is None, server.log_text()  # still running
        assert psutil.Process(server.process.pid).children(recursive=True) == []  # no stage left behind
        assert health(server) == body
        chat = httpx.post(f"{server.url}/v1/chat/completions", json=SHORT_CHAT, timeout=30)
        assert chat.status_code == 503 and chat.json()["error"]["code"] == "engine_failed", chat.text
        with connect(ws_url(server), open_timeout=30) as ws:
            error = Conn(ws, beta=False).recv()
            assert error["error"]["code"] == "engine_failed", error
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        assert health(server)["active_sessions"] == 0
    finally:
        server.stop()
    assert server.process.returncode == 0, server.log_text()


def test_serve_still_exits_when_its_engine_fails(tmp_path: Path) -> None:
    server = ServerProcess("toy", BROKEN_DEPLOY, tmp_path, api_key=None)
    try:
        assert server.process.wait(timeout=120) == 2
    finally:
        server.stop()
    assert "omnipipe: error: the engine failed to start: " in server.log_path.read_text()


# ---------------------------------------------------------------------------------------------- a signal while loading
# the toy thinker takes 10 minutes to load: a stop that waits for the load runs far past the bound
SLOW_LOAD_DEPLOY = {"stages": {"thinker": {"options": {"load_delay_ms": 600_000}}}}
STOP_BOUND_S = 30.0  # a hang detector, not a speed claim (a stop during loading takes about a second)


@pytest.fixture
def own_temp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temp dir for the processes this test starts (their run directories land there), removed afterwards;
    short, as the ipc socket paths in it must fit in 107 bytes."""
    temp = Path(tempfile.mkdtemp(prefix="op-stop-test-"))
    monkeypatch.setenv("TMPDIR", str(temp))
    yield temp
    shutil.rmtree(temp, ignore_errors=True)


def _loading_worker(pipeline: str, deploy: dict[str, Any], tmp_path: Path, temp: Path, stages: int,
                    extra_args: Sequence[str] = ()) -> tuple[ServerProcess, list[psutil.Process], list[str]]:
    """A worker, once /health says it is loading and ``stages`` stage processes run; with its stage processes
    and the run ids of its engines (read from their run directories in ``temp``, the worker's temp dir)."""
    server = ServerProcess(pipeline, deploy, tmp_path, api_key=None, command_name="worker", extra_args=extra_args)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.process.poll() is None, server.log_text()
            children = psutil.Process(server.process.pid).children(recursive=True)
            try:
                state = health(server).get("state")
            except httpx.TransportError:
                state = None
            if state == "LOADING" and len(children) >= stages:
                break
            assert state in (None, "LOADING") and time.monotonic() < deadline, (state, server.log_text())
            time.sleep(0.1)
        run_ids = [json.loads((run / OWNER_FILE).read_text())["run_id"] for run in temp.glob("omnipipe-*")]
        assert run_ids, list(temp.iterdir())  # the engines' files exist while they load: their removal is checked
    except BaseException:
        for process in [*children, psutil.Process(server.process.pid)]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        server.stop()
        raise
    return server, children, run_ids


def _assert_all_gone(server: ServerProcess, stages: list[psutil.Process], temp: Path, run_ids: list[str]) -> str:
    try:
        server.process.wait(timeout=STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        server.process.kill()
        raise AssertionError(
            f"the worker still ran {STOP_BOUND_S:.0f} s after the signal: {server.log_text()}") from None
    finally:
        _, alive = psutil.wait_procs(stages, timeout=STOP_BOUND_S)
        for process in alive:
            process.kill()
    assert not alive, alive  # every stage process is gone too
    assert not list(temp.glob("omnipipe-*")), list(temp.iterdir())  # no run directory left
    assert not [name for run_id in run_ids for name in shm_segments(run_id)]  # no shared-memory segment left
    log = server.log_text()
    server.stop()
    assert "Traceback" not in log, log
    return log


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize(("pipeline", "deploy", "stages"), [
    ("toy", SLOW_LOAD_DEPLOY, 3),
    pytest.param("default", DEFAULT_DEPLOY, 4, marks=pytest.mark.models),  # loads for many seconds
])
def test_a_signal_while_the_models_load_stops_the_worker_and_every_stage(
        tmp_path: Path, own_temp: Path, pipeline: str, deploy: dict[str, Any], stages: int, signum: int) -> None:
    """SIGTERM or Ctrl-C while /health says LOADING stops the stages still loading rather than waiting for them:
    the worker, every stage process, its run directories and shm segments are gone well within the bound."""
    server, children, run_ids = _loading_worker(pipeline, deploy, tmp_path, own_temp, stages)
    server.process.send_signal(signum)
    log = _assert_all_gone(server, children, own_temp, run_ids)
    assert "omnipipe: stopping stages..." in log, log


def test_a_second_ctrl_c_while_stopping_kills_every_stage_at_once(tmp_path: Path, own_temp: Path) -> None:
    """The first Ctrl-C stops gracefully: a loaded stage gets a Shutdown and up to 10 s to take it. Here the loaded
    stages are SIGSTOPped, so that stop takes those 10 s; a second Ctrl-C kills every stage and exits at once."""
    server, children, run_ids = _loading_worker("toy", SLOW_LOAD_DEPLOY, tmp_path, own_temp, 3,
                                                extra_args=["--verbose"])
    wait_for(lambda: all(f"stage {name} ready" in server.log_text() for name in ("talker", "code2wav")), 60,
             "the talker and code2wav stages loaded", detail=server.log_text)
    for child in children:
        child.suspend()  # the loading thinker is killed by the first stop; the loaded ones hold it up
    server.process.send_signal(signal.SIGINT)
    # the first one was handled: the next is a second
    wait_for(lambda: "stopping stages..." in server.log_text(), 60, "the worker began stopping",
             detail=server.log_text)
    server.process.send_signal(signal.SIGINT)
    log = _assert_all_gone(server, children, own_temp, run_ids)
    assert "omnipipe: killing stages" in log and server.process.returncode == 128 + signal.SIGINT, log


# ---------------------------------------------------------------------------------------------- CLI
@pytest.mark.parametrize(("args", "message"), [
    (["--capacity", "0"], "omnipipe: error: --capacity: must be >= 1, got 0"),
    (["--capacity", "-3"], "omnipipe: error: --capacity: must be >= 1, got -3"),
    (["--port", "0"], "omnipipe: error: --port: must be in 1..65535, got 0"),
    (["--port", "65536"], "omnipipe: error: --port: must be in 1..65535, got 65536"),
    (["--pause-timeout-s", "0"], "omnipipe: error: --pause-timeout-s: must be a number > 0, got 0"),
    (["--pause-timeout-s", "-1.5"], "omnipipe: error: --pause-timeout-s: must be a number > 0, got -1.5"),
    (["--pause-timeout-s", "inf"], "omnipipe: error: --pause-timeout-s: must be a number > 0, got inf"),
])
def test_worker_argument_errors_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "worker", "--pipeline", "toy", *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert done.stderr.strip().splitlines() == [message], done.stderr
    assert done.stdout == ""


def test_worker_help_lists_its_options() -> None:
    done = subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "worker", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    for option in ("--capacity", "--pause-timeout-s", "--pipeline", "--deploy", "--api-key", "--host", "--port"):
        assert option in done.stdout


def test_worker_health_json_is_valid_for_the_gateway(worker: ServerProcess) -> None:
    """The reply parses as the gateway's health parser expects: a known state name and an integer capacity."""
    body = json.loads(httpx.get(f"{worker.url}/health", timeout=10).text)
    assert WorkerState[body["state"]] in set(WorkerState) - {WorkerState.OFFLINE}
    assert isinstance(body["capacity"], int) and body["capacity"] == 1
