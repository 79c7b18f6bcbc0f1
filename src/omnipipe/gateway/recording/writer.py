"""``RecordingWriter``: the background threads every recording write runs on, one ordered lane per session."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

logger = logging.getLogger(__name__)


class RecordingWriter:
    """A small thread pool for recording writes that never raises into the caller.

    ``submit(fn, *args, lane=key)`` runs jobs that share a lane one at a time in submission order (one lane per
    session), while different lanes run in parallel. A job that raises is logged and counted in ``errors``.
    """

    def __init__(self, max_workers: int = 4) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="omnipipe-recording")
        self._lock = threading.Lock()
        self._pending: set[Future[Any]] = set()
        self._lanes: dict[str, deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]]] = {}
        self._closed = False
        self.errors = 0

    def submit(self, fn: Callable[..., Any], *args: Any, lane: str | None = None) -> Future[Any] | None:
        """Run ``fn(*args)`` in the background; ``None`` (and a logged error) once the writer is closed."""
        future: Future[Any] = Future()
        job = (future, fn, args)
        with self._lock:
            if self._closed:
                self.errors += 1
                logger.error("recording writer is closed; dropped %s", getattr(fn, "__qualname__", fn))
                return None
            self._pending.add(future)
            if lane is None:
                self._executor.submit(self._run, *job)
            elif lane in self._lanes:
                self._lanes[lane].append(job)
            else:
                self._lanes[lane] = deque([job])
                self._executor.submit(self._drain, lane)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: Future[Any]) -> None:
        with self._lock:
            self._pending.discard(future)

    def _drain(self, lane: str) -> None:
        while True:
            with self._lock:
                jobs = self._lanes[lane]
                if not jobs:
                    del self._lanes[lane]
                    return
                job = jobs.popleft()
            self._run(*job)

    def _run(self, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # noqa: BLE001 - a failed write is logged and counted, never raised
            with self._lock:
                self.errors += 1
            logger.exception("recording write %s failed", getattr(fn, "__qualname__", fn))
            future.set_exception(exc)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for every job submitted so far, and for the jobs those submit; ``False`` if some were still
        pending after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                return True
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            _, not_done = wait(pending, timeout=remaining)
            if not_done:
                return False

    def close(self, timeout: float | None = None) -> None:
        """Refuse new jobs, finish the submitted ones and stop the threads. Idempotent."""
        with self._lock:
            self._closed = True
        self.flush(timeout)
        self._executor.shutdown(wait=timeout is None)
