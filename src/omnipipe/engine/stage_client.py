"""The orchestrator's handle on one stage: its process and its two sockets.

The orchestrator binds both sockets once; a restarted process connects to the same addresses, so nothing
upstream changes when a stage is replaced.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from typing import Any

import zmq
import zmq.asyncio

from omnipipe.stage.launch import StageLaunch
from omnipipe.transport import control_plane

logger = logging.getLogger(__name__)


class StageClient:
    def __init__(self, ctx: zmq.asyncio.Context, launch: StageLaunch) -> None:
        self.launch = launch
        self.name = launch.stage
        self.ctrl = control_plane.make_socket(ctx, zmq.PUSH, launch.ctrl_address, bind=True)
        self.out = control_plane.make_socket(ctx, zmq.PULL, launch.out_address, bind=True)
        self.process: subprocess.Popen[bytes] | None = None
        self._pidfd: int | None = None
        self.ready = asyncio.Event()
        self.alive = False
        self.restarts = 0
        self.load_error: str | None = None

    def spawn(self) -> None:
        """Start a fresh interpreter running the stage; the launch spec goes in on stdin as msgpack."""
        self.ready.clear()
        self.load_error = None
        self._close_pidfd()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "omnipipe.stage.stage_core_proc"], stdin=subprocess.PIPE, close_fds=True,
        )
        assert self.process.stdin is not None
        self.process.stdin.write(self.launch.encode())
        self.process.stdin.close()
        self._pidfd = os.pidfd_open(self.process.pid)
        self.alive = True
        logger.info("stage %s started (pid %s)", self.name, self.process.pid)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when the process exits."""
        assert self._pidfd is not None
        return self._pidfd

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return None

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    async def send(self, message: Any) -> None:
        await self.ctrl.send(control_plane.encode(message), copy=False)

    async def recv(self) -> Any | None:
        frame = await self.out.recv()
        return control_plane.decode(control_plane.FROM_STAGE, frame, f"orchestrator (from stage {self.name})")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Wait for the process to exit after a Shutdown message; kill it if it does not."""
        if self.process is not None:
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("stage %s did not exit in %.0f s; killing it", self.name, timeout_s)
                self.process.kill()
                self.process.wait(timeout=5)
        self.alive = False
        self._close_pidfd()

    def close_sockets(self) -> None:
        for sock, address in ((self.ctrl, self.launch.ctrl_address), (self.out, self.launch.out_address)):
            sock.close(0)
            path = control_plane.ipc_path(address)
            if path and os.path.exists(path):
                os.unlink(path)
