"""Stages as local subprocesses: one fresh interpreter per rank, the launch spec on stdin as msgpack.

Each rank's exit is watched through a pidfd; the handle's sentinel is an epoll descriptor over all of them, so
the orchestrator's event loop hears about any rank's death at once without polling.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
import time

import msgspec

from omnipipe.placement.launcher import Launcher, StageHandle
from omnipipe.stage.launch import StageLaunch

logger = logging.getLogger(__name__)

STAGE_COMMAND = (sys.executable, "-m", "omnipipe.stage.stage_core_proc")


class LocalStageHandle(StageHandle):
    def __init__(self, processes: list[subprocess.Popen[bytes]]) -> None:
        self._processes = processes
        self._first: tuple[int, int] | None = None
        self._pidfds = [os.pidfd_open(p.pid) for p in processes]
        self._epoll = select.epoll()
        for fd in self._pidfds:
            self._epoll.register(fd, select.EPOLLIN)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    @property
    def sentinel(self) -> int:
        return self._epoll.fileno()

    def alive(self) -> bool:
        return all(p.poll() is None for p in self._processes)

    def _first_ended(self) -> tuple[int, int] | None:
        """(rank, exit code) of the first rank seen ended; kept, so later exits of the others (who cannot go on
        without it) do not hide which one went first."""
        if self._first is None:
            for rank, process in enumerate(self._processes):
                code = process.poll()
                if code is not None:
                    self._first = (rank, code)
                    break
        return self._first

    def exit_code(self) -> int | None:
        first = self._first_ended()
        return None if first is None else first[1]

    def ended_rank(self) -> int | None:
        first = self._first_ended()
        return None if first is None else first[0]

    def kill(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                process.kill()

    def wait(self, timeout_s: float | None) -> int | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for process in self._processes:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                return None
        return self.exit_code()

    def close(self) -> None:
        if not self._epoll.closed:
            self._epoll.close()
        for fd in self._pidfds:
            os.close(fd)
        self._pidfds = []


class LocalLauncher(Launcher):
    name = "local"

    def __init__(self, command: tuple[str, ...] = STAGE_COMMAND) -> None:
        self.command = command

    def launch(self, launch: StageLaunch) -> StageHandle:
        processes: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(launch.world_size):
                process = subprocess.Popen(list(self.command), stdin=subprocess.PIPE, close_fds=True)
                processes.append(process)
                assert process.stdin is not None
                process.stdin.write(msgspec.structs.replace(launch, rank=rank).encode())
                process.stdin.close()
            handle = LocalStageHandle(processes)
        except BaseException:
            for process in processes:
                process.kill()
                process.wait()
            raise
        logger.info("stage %s started (pids %s)", launch.stage, handle.pids)
        return handle
