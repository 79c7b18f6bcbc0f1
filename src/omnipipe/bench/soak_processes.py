"""What the soak sees of a server's processes in /proc: the process tree and its engines' runs, ``up``'s workers,
resources (RSS, fds, threads, shm segments), the process listening on a port, and what a stop left behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omnipipe.transport.relay.shm import SEGMENT_PREFIX

PID_POLL_S = 0.1  # how often pids are looked at (up's workers here, stages in /debug/state)
TREE_POLL_S = 1.0
RUN_DIR_GLOB = "omnipipe-*/owner.json"


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): tells a process from a later one with its pid."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rpartition(")")[2].split()[19] if stat else None


def cmdline(pid: int) -> str:
    raw = _read(f"/proc/{pid}/cmdline")
    return raw.replace("\0", " ").strip() if raw else ""


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (``/proc/PID/task/*/children``, else a scan of every process's parent)."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        found: list[int] = []
        for task in tasks.iterdir():
            found += [int(p) for p in (task / "children").read_text().split()]
        return found
    except FileNotFoundError:
        if not tasks.exists():
            return []
    except OSError:
        pass
    out = []
    for entry in Path("/proc").iterdir():
        stat = _read(f"/proc/{entry.name}/stat") if entry.name.isdigit() else None
        if stat and int(stat.rpartition(")")[2].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def descendants(root: int) -> list[int]:
    out: list[int] = []
    todo = children(root)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children(pid)
    return out


def engine_runs(pids: set[int]) -> set[str]:
    """Run ids of the engines owned by any of ``pids`` (their run directories' owner records)."""
    runs = set()
    for record in Path(tempfile.gettempdir()).glob(RUN_DIR_GLOB):
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            owner = json.loads(record.read_text())
            if int(owner.get("pid")) in pids:
                runs.add(str(owner["run_id"]))
    return runs


def run_segments(runs: set[str]) -> list[str]:
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return []
    return sorted(n for n in names if any(n.startswith(f"{SEGMENT_PREFIX}{run}-") for run in runs))


def run_dirs(runs: set[str]) -> list[str]:
    out = []
    for record in Path(tempfile.gettempdir()).glob(RUN_DIR_GLOB):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if str(json.loads(record.read_text()).get("run_id")) in runs:
                out.append(str(record.parent))
    return sorted(out)


def resources(root: int, runs: set[str]) -> tuple[dict[str, float], dict[tuple[int, str | None], int]]:
    """RSS (MiB), open fds and threads summed over ``root`` and its descendants; their count; run segments. And
    each process's RSS in KiB by (pid, start time), to compare the processes that lived through a run."""
    pids = [root, *descendants(root)]
    fds = threads = 0
    rss: dict[tuple[int, str | None], int] = {}
    for pid in pids:
        status = _read(f"/proc/{pid}/status") or ""
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss[(pid, start_time(pid))] = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads += int(line.split()[1])
        with contextlib.suppress(OSError):
            fds += len(os.listdir(f"/proc/{pid}/fd"))
    return {"rss_mib": sum(rss.values()) / 1024, "open_fds": fds, "threads": threads,
            "child_processes": len(pids) - 1, "shm_segments": len(run_segments(runs))}, rss


def survivors_rss(before: dict[tuple[int, str | None], int], after: dict[tuple[int, str | None], int],
                  ) -> tuple[float, float, int]:
    """RSS (MiB) before and after of the processes present both times (the same ones: pid and start time), and how
    many they are: a restarted stage or an engine started on first use does not count as growth."""
    both = [key for key in before if key in after]
    return sum(before[k] for k in both) / 1024, sum(after[k] for k in both) / 1024, len(both)


def listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this machine, if it can be seen in /proc."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (_read(table) or "").splitlines()[1:]:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rpartition(":")[2], 16) == port:
                inodes.add(f"socket:[{parts[9]}]")
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(entry.name)
    return None


class ProcessWatch:
    """Everything under ``root`` that ever ran (pid, start time, command) and its engines' run ids, seen every
    second, so that the stop can be checked for leftovers; and, every 0.1 s, the pids of ``root``'s direct children
    whose command line names a port (``up``'s workers)."""

    def __init__(self, root: int, worker_ports: Sequence[int] = ()) -> None:
        self.root = root
        self.worker_ports = list(worker_ports)
        self.seen: dict[int, tuple[str | None, str]] = {}
        self.runs: set[str] = set()
        self.worker_pids: list[tuple[float, dict[str, int | None]]] = []

    def sample_tree(self) -> None:
        pids = [self.root, *descendants(self.root)]
        for pid in pids:
            if pid not in self.seen:
                self.seen[pid] = (start_time(pid), cmdline(pid)[:200])
        self.runs |= engine_runs(set(pids))

    def workers_now(self) -> dict[str, int | None]:
        found: dict[str, int | None] = {worker_name(p): None for p in self.worker_ports}
        for pid in children(self.root):
            words = cmdline(pid).split()
            if "worker" in words and "--port" in words:
                with contextlib.suppress(ValueError, IndexError):
                    port = int(words[words.index("--port") + 1])
                    if port in self.worker_ports:
                        found[worker_name(port)] = pid
        return found

    async def run(self) -> None:
        last_tree = 0.0
        while True:
            now = time.perf_counter()
            if self.worker_ports:
                self.worker_pids.append((now, self.workers_now()))
            if now - last_tree >= TREE_POLL_S:
                self.sample_tree()
                last_tree = now
            await asyncio.sleep(PID_POLL_S if self.worker_ports else TREE_POLL_S)

    def alive(self) -> list[str]:
        """What of everything seen still runs (the same process: the same start time)."""
        return [f"{pid} ({command})" for pid, (started, command) in sorted(self.seen.items())
                if started is not None and start_time(pid) == started]


def worker_name(port: int) -> str:
    return f"worker 127.0.0.1:{port}"



def after_stop(processes: Any, settle_s: float = 15.0) -> list[str]:
    """What a stopped server left: processes, /dev/shm segments and run directories of its engines."""
    if processes is None:
        return []
    deadline = time.monotonic() + settle_s
    while True:
        alive, segments, dirs = processes.alive(), run_segments(processes.runs), run_dirs(processes.runs)
        if not (alive or segments or dirs) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return ([f"process still running after the stop: {p}" for p in alive]
            + [f"/dev/shm segment after the stop: {s}" for s in segments]
            + [f"run directory after the stop: {d}" for d in dirs])
