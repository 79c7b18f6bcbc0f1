"""Process-group supervision: children in their own process group that die with their parent, stopped as a group.

A child started by ``start_in_group`` leads a new session (and process group), so a Ctrl-C in the terminal reaches
only the parent, which then stops its children in its own order; and it asks Linux to SIGTERM it if the parent
dies, even by SIGKILL (``die_with_parent``). ``stop_groups`` signals each leader, waits, and kills what is left of
a group with SIGKILL. Linux-only where it matters (``prctl``); elsewhere ``die_with_parent`` does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``signum`` to this process when its parent dies, so no child outlives it.

    Safe to call in a child before exec (``preexec_fn``) and at the start of a spawned process; does nothing where
    ``prctl`` is not available.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signum)


def start_in_group(command: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(command, **popen_kwargs)`` as the leader of its own process group (a new session), set to
    get SIGTERM when this process dies. Start children before starting threads (``preexec_fn``)."""
    return subprocess.Popen(command, start_new_session=True, preexec_fn=die_with_parent,  # noqa: PLW1509
                            **popen_kwargs)


def group_alive(pgid: int) -> bool:
    """Whether any process of the process group ``pgid`` is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int) -> None:
    """SIGKILL every process of the process group ``pgid`` (nothing if it is gone)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@dataclass
class Stopped:
    """How one group ended under ``stop_groups``."""

    process: subprocess.Popen[Any]
    killed: bool = False
    """The leader had not ended ``timeout_s`` after the signal: its group got SIGKILL."""
    killed_leftovers: bool = False
    """Processes of its group were still running ``leftovers_s`` after the leader ended: they got SIGKILL."""


def stop_groups(processes: Sequence[subprocess.Popen[Any]], *, signum: int = signal.SIGTERM,
                timeout_s: float = 15.0, leftovers_s: float | None = None) -> list[Stopped]:
    """Stop group leaders started by ``start_in_group``, together: send each running one ``signum``, wait up to
    ``timeout_s`` (one deadline for all) and SIGKILL the group of any still running. With ``leftovers_s``, the rest of
    each group (what a leader started, e.g. stage processes) then gets that long to end before it is killed too,
    also for a leader that had died earlier. Returns one ``Stopped`` per process, in order."""
    results = [Stopped(process) for process in processes]
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)
    deadline = time.monotonic() + timeout_s
    for result in results:
        try:
            result.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            result.killed = True
            kill_group(result.process.pid)  # the leader's pid is its group's id
            result.process.wait()
    if leftovers_s is not None:
        deadline = time.monotonic() + leftovers_s
        for result in results:
            pgid = result.process.pid
            while group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if group_alive(pgid):
                result.killed_leftovers = True
                kill_group(pgid)
    return results
