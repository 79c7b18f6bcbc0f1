"""A stage's heartbeat: a thread of its own that tells the orchestrator, at a fixed interval, that the process
lives and how long its current step has run.

The stage loop marks a step's start and end (``step_started``); the thread reads that mark, so a step that runs
long is visible while it runs, and a process that is stopped (SIGSTOP) or wedged sends nothing at all. The
orchestrator turns both into a liveness verdict (``engine/liveness.py``). The thread has its own PUSH socket
(zmq sockets are not shared between threads) connected to the stage's output address.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import zmq

from omnipipe.transport import control_plane
from omnipipe.transport.messages import StageHeartbeat

logger = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, ctx: zmq.Context, address: str, stage: str, interval_s: float) -> None:
        self.step_started: float | None = None  # monotonic start of the step running now; set by the stage loop
        self._ctx = ctx
        self._address = address
        self._stage = stage
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{stage}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        sock = control_plane.make_socket(self._ctx, zmq.PUSH, self._address, bind=False)
        pid = os.getpid()
        try:
            while True:
                started = self.step_started
                step_s = time.monotonic() - started if started is not None else 0.0
                try:
                    sock.send(control_plane.encode(StageHeartbeat(self._stage, pid, step_s)), zmq.NOBLOCK)
                except zmq.Again:  # the orchestrator is not reading: the next beat will tell it
                    pass
                except zmq.ZMQError as exc:  # the context is going away with the process
                    logger.debug("heartbeat stopped: %r", exc)
                    return
                if self._stop.wait(self._interval_s):
                    return
        finally:
            sock.close(0)
