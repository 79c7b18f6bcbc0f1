"""An engine run's directory in the temp dir (ipc sockets), with an owner record, and the sweep of runs whose
owner died without cleaning up (SIGKILL, power loss): their directory and their shared-memory segments.

The record (``owner.json``: run id, pid, the process's start time) lets a later engine tell a dead owner from a
live one, also when the pid has been reused by another process.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from omnipipe.transport.relay.shm import segment_prefix, sweep_segments

logger = logging.getLogger(__name__)

RUN_DIR_PREFIX = "omnipipe-"
OWNER_FILE = "owner.json"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name (field 2) may hold spaces and parentheses: count fields after its closing parenthesis
    return stat.rpartition(")")[2].split()[19]


def _alive(pid: int, start_time: str | None) -> bool:
    if Path("/proc").is_dir():
        current = _start_time(pid)
        return current is not None and (start_time is None or current == start_time)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def create_run_dir(run_id: str) -> str:
    """Make this run's directory and record its owner (this process)."""
    path = tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{run_id}-")
    record = {"run_id": run_id, "pid": os.getpid(), "start_time": _start_time(os.getpid())}
    Path(path, OWNER_FILE).write_text(json.dumps(record))
    return path


def sweep_stale_run_dirs(temp_dir: str | None = None) -> list[str]:
    """Remove the run directories (and shared-memory segments) of engines whose owner process is gone.

    Directories without a readable owner record are left alone (not ours to judge). Returns the run ids swept.
    """
    root = Path(temp_dir or tempfile.gettempdir())
    swept: list[str] = []
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(RUN_DIR_PREFIX) and p.is_dir()]
    except OSError:
        return swept
    for path in candidates:
        try:
            record = json.loads((path / OWNER_FILE).read_text())
            run_id, pid, start_time = str(record["run_id"]), int(record["pid"]), record.get("start_time")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(pid, start_time):
            continue
        shutil.rmtree(path, ignore_errors=True)
        segments = sweep_segments(segment_prefix(run_id))
        logger.warning("swept the leftovers of engine run %s (owner pid %d is gone): its directory and %d "
                       "shared-memory segment(s)", run_id, pid, len(segments))
        swept.append(run_id)
    return swept
