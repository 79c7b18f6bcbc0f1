"""A SIGKILLed engine leaves its run directory and shared-memory segments; the next engine sweeps them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

from omnipipe.engine.run_dir import OWNER_FILE, create_run_dir, sweep_stale_run_dirs
from omnipipe.transport.relay.shm import SHM_DIR, segment_prefix
from tests.conftest import EngineHarness

ENGINE_SCRIPT = """
import asyncio, sys
from omnipipe import AsyncOmni

async def main():
    engine = await AsyncOmni("toy", {"relay": {"inline_threshold_bytes": 0}}).start()  # every payload via shm
    async for out in engine.generate("hello there", output_modalities=["text", "audio"]):
        pass
    print(engine.engine.run_id, engine.engine.orchestrator.run_dir, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def segments_of(run_id: str) -> list[str]:
    return [name for name in os.listdir(SHM_DIR) if name.startswith(segment_prefix(run_id))]


def test_a_killed_engines_leftovers_are_swept_by_the_next_engine() -> None:
    process = subprocess.Popen([sys.executable, "-c", ENGINE_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline() if process.stdout else ""
        run_id, run_dir = line.split()
        assert Path(run_dir, OWNER_FILE).is_file()
        stages = psutil.Process(process.pid).children(recursive=True)
        assert segments_of(run_id), "the toy engine holds shared-memory pools while it runs"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    psutil.wait_procs(stages, timeout=30)  # stage processes follow their engine (die-with-parent)
    assert Path(run_dir).is_dir()  # nothing cleaned up after a SIGKILL ...

    harness = EngineHarness("toy")  # ... until the next engine starts
    try:
        assert not Path(run_dir).exists()
        assert segments_of(run_id) == []
        assert Path(harness.engine.engine.orchestrator.run_dir).is_dir()  # its own run is untouched
    finally:
        harness.close()


def test_a_live_owners_run_dir_is_kept(tmp_path: Path) -> None:
    mine = create_run_dir("live-run")
    try:
        assert "live-run" not in sweep_stale_run_dirs()
        assert Path(mine).is_dir()
    finally:
        Path(mine, OWNER_FILE).unlink()
        os.rmdir(mine)


def test_a_reused_pid_does_not_keep_a_dead_run(tmp_path: Path) -> None:
    """The owner record holds the process start time: the same pid with another start time is another process."""
    run = Path(tempfile.mkdtemp(prefix="omnipipe-reused-", dir=tmp_path))
    run.joinpath(OWNER_FILE).write_text(json.dumps({"run_id": "reused", "pid": os.getpid(), "start_time": "1"}))
    foreign = Path(tempfile.mkdtemp(prefix="omnipipe-foreign-", dir=tmp_path))  # no record: not ours to judge
    assert sweep_stale_run_dirs(str(tmp_path)) == ["reused"]
    assert not run.exists() and foreign.is_dir()
