"""The orchestrator's handle on one stage: its two sockets and the placement handle of its processes.

The orchestrator binds both sockets once; a restarted stage connects to the same addresses, so nothing
upstream changes when a stage is replaced. Where the processes run is the launcher's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any, cast

import msgspec
import zmq
import zmq.asyncio

from omnipipe.engine.liveness import StageLiveness
from omnipipe.placement.launcher import Launcher, StageHandle
from omnipipe.stage.launch import StageLaunch
from omnipipe.stage.tensor_parallel import free_tcp_address
from omnipipe.transport import control_plane
from omnipipe.transport.messages import StageReady

logger = logging.getLogger(__name__)


_POLLIN = int(zmq.POLLIN)


class _Reader:
    """Frames of one socket for this loop: a non-blocking recv, and when there is nothing, a wait on the socket's
    file descriptor. Leaner than a ``zmq.asyncio`` recv, whose futures, timers and flag enums cost about 0.1 ms a
    message on the orchestrator's thread (measured with cProfile), on every hop of every request.

    ZMQ signals its descriptor when the socket's state changes, not while a frame waits, so a waiter asks
    ZMQ_EVENTS (which also re-arms the signal) before it sleeps, and so does the reader's callback before it wakes
    one. (Asking is cheaper than a recv that raises zmq.Again.)
    """

    def __init__(self, sock: zmq.asyncio.Socket) -> None:
        self._sock: zmq.SyncSocket = zmq.Socket.shadow(sock.underlying)  # the same socket, plain calls
        self._fd = self._sock.fileno()  # ZMQ_FD
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None

    async def recv(self) -> bytes:
        while True:
            if self._events() & _POLLIN:
                with contextlib.suppress(zmq.Again):
                    return self._sock.recv(zmq.NOBLOCK)
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
                self._loop.add_reader(self._fd, self._on_readable)
                continue  # ask again: a frame may have come while the reader was being added
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _events(self) -> int:
        return cast(int, self._sock.get(zmq.EVENTS))  # an int option (the stubs type every option int | bytes)

    def _on_readable(self) -> None:
        if self._events() & _POLLIN and self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        """Stop watching the socket (before it is closed)."""
        if self._loop is not None:
            with contextlib.suppress(ValueError, OSError, RuntimeError):
                self._loop.remove_reader(self._fd)
            self._loop = None


class StageClient:
    def __init__(self, ctx: zmq.asyncio.Context, name: str, launcher: Launcher, ctrl_bind: str,
                 out_bind: str, liveness: StageLiveness, dist_host: str = "127.0.0.1") -> None:
        """Bind both sockets (``tcp://host:*`` picks a port at bind); the first ``spawn`` gives the launch."""
        self.name = name
        self.launcher = launcher
        self.dist_host = dist_host  # where a tensor-parallel stage's ranks meet (the deploy file's host)
        self.ctrl = control_plane.make_socket(ctx, zmq.PUSH, ctrl_bind, bind=True)
        self.out = control_plane.make_socket(ctx, zmq.PULL, out_bind, bind=True)
        self.ctrl_address = control_plane.bound_address(self.ctrl)
        self.out_address = control_plane.bound_address(self.out)
        # tcp: connections accepted on ``out`` and dropped (a stage process that ended, on whatever host)
        self.monitor = (self.out.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
                        if self.out_address.startswith("tcp://") else None)
        self.generation = 0  # bumped by each spawn: which start of the stage a connection belongs to
        self.connections: dict[int, int] = {}  # accepted connection (fd) -> generation
        self._reader = _Reader(self.out)
        self._ctrl_now: zmq.SyncSocket = zmq.Socket.shadow(self.ctrl.underlying)  # the same socket, plain calls
        self._sends_waiting = 0  # sends waiting for room on ``ctrl``; later ones queue behind them, in order
        self.launch: StageLaunch | None = None
        self.handle: StageHandle | None = None
        self.ready = asyncio.Event()
        self.alive = False
        self.restarts = 0  # in all
        self.restarts_in_a_row = 0  # since it last served a restart window (what max_restarts limits)
        self.ready_since: float | None = None  # monotonic time it last became ready
        self.load_error: str | None = None
        self.start_error: str | None = None  # a restart that failed (no node fits): the stage is down for good
        self.liveness = liveness  # heartbeats and stall record (engine/liveness.py)
        # the audio streams its runner takes (StageReady): how many open, how many seconds each; 0: none
        self.max_audio_streams = 0
        self.max_audio_stream_s = 0.0

    def spawn(self, launch: StageLaunch | None = None) -> None:
        """Start the stage: with ``launch`` the first time, after a death with the launch it last had."""
        if launch is not None:
            self.launch = launch
        self.ready.clear()
        self.load_error = None
        assert self.launch is not None, "give the client its launch on its first spawn"
        if self.launch.world_size > 1:  # the ranks meet at a fresh port each start
            self.launch = msgspec.structs.replace(self.launch, dist_init_address=free_tcp_address(self.dist_host))
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        self.generation += 1
        self.handle = self.launcher.launch(self.launch)
        self.alive = True

    def mark_ready(self, message: StageReady | None = None) -> None:
        """The stage said it is ready (first start or a restart): it starts with a clean liveness record."""
        if message is not None:
            self.max_audio_streams, self.max_audio_stream_s = message.max_audio_streams, message.max_audio_stream_s
        self.ready.set()
        self.ready_since = time.monotonic()
        self.liveness.reset()

    def mark_dead(self, restart_window_s: float) -> str | None:
        """The stage's processes have ended (one rank is enough: the others are killed, as they would wait in a
        collective). A stage that had served ``restart_window_s`` since it was last ready starts its count of
        restarts in a row over. Returns why the watchdog killed it, if it did."""
        if self.handle is not None and self.launch is not None and self.launch.world_size > 1:
            self.handle.kill()
            self.handle.wait(5.0)
        self.alive = False
        self.ready.clear()
        if self.ready_since is not None and time.monotonic() - self.ready_since >= restart_window_s:
            self.restarts_in_a_row = 0
        self.ready_since = None
        killed_for, self.liveness.killed_for = self.liveness.killed_for, None  # a later death is its own
        return killed_for

    def prepare_restart(self, aborted_request_ids: list[str]) -> None:
        """Count a restart; the next spawn tells the stage which requests ended meanwhile (to drop what comes)."""
        assert self.launch is not None
        self.restarts += 1
        self.restarts_in_a_row += 1
        self.launch = msgspec.structs.replace(self.launch, aborted_request_ids=aborted_request_ids)

    def mark_start_failed(self, message: str) -> None:
        """A restart could not place the stage: it is down for good."""
        self.alive = False
        self.start_error = message

    def note_load_error(self, message: str) -> None:
        """The stage reported an error outside any request (while loading): kept to name it if it ends."""
        self.load_error = message

    def kill_stalled(self, reason: str) -> None:
        """The watchdog's verdict: kill the stage, remembering why (its death is then reported with it)."""
        if self.handle is not None:
            self.liveness.killed_for = reason
            self.handle.kill()  # the sentinel fires: handled as a death (requests failed, stage restarted)

    def connection_accepted(self, fd: int) -> None:
        """A connection to the output socket, tagged with the start it belongs to."""
        self.connections[fd] = self.generation

    def connection_dropped(self, fd: int) -> None:
        """A connection to the output socket dropped: one of this start's, while the stage lives, is handed to the
        placement handle, which checks and may take it as the stage's end at once."""
        start = self.connections.pop(fd, None)
        if start == self.generation and self.alive and self.handle is not None:
            self.handle.connection_lost()

    @property
    def pid(self) -> int | None:
        return self.handle.pids[0] if self.handle is not None and self.handle.pids else None

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when the stage's processes exit."""
        assert self.handle is not None
        return self.handle.sentinel

    def is_running(self) -> bool:
        return self.handle is not None and self.handle.alive()

    def exit_code(self) -> int | None:
        return self.handle.exit_code() if self.handle is not None else None

    def ended_rank(self) -> int | None:
        return self.handle.ended_rank() if self.handle is not None else None

    async def send(self, message: Any) -> None:
        """Send now if the socket has room (the usual case: a plain call, no future), else wait for room
        (back-pressure) behind any earlier send that waits."""
        frame = control_plane.encode(message)
        if not self._sends_waiting:
            try:
                self._ctrl_now.send(frame, zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                pass
        self._sends_waiting += 1
        try:
            await self.ctrl.send(frame, copy=False)
        finally:
            self._sends_waiting -= 1

    async def recv(self) -> Any | None:
        frame = await self._reader.recv()
        return control_plane.decode(control_plane.FROM_STAGE, frame, f"orchestrator (from stage {self.name})")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Wait for the processes to exit after a Shutdown message; kill them if they do not."""
        if self.handle is not None:
            if self.handle.wait(timeout_s) is None:
                logger.warning("stage %s did not exit in %.0f s; killing it", self.name, timeout_s)
                self.handle.kill()
                self.handle.wait(5)
            self.handle.close()
        self.alive = False

    def close_sockets(self) -> None:
        self._reader.close()
        if self.monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.out.disable_monitor()
            self.monitor.close(0)
        for sock, address in ((self.ctrl, self.ctrl_address), (self.out, self.out_address)):
            sock.close(0)
            path = control_plane.ipc_path(address)
            if path and os.path.exists(path):
                os.unlink(path)
