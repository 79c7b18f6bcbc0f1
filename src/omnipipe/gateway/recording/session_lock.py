"""``SessionLock``: which recorded sessions a recorder is still writing.

A recorder holds an exclusive ``flock`` on its session directory from its creation until its last write. The kernel
drops the lock with the process, so a session whose ``meta.json`` still says ``recording`` while nobody holds its
lock was cut by a crash; the cleanup finishes such sessions (``cut_sessions``), whichever process runs it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


class SessionLock:
    """An exclusive lock on a session directory; ``BlockingIOError`` if another holder has it."""

    def __init__(self, directory: Path) -> None:
        self._fd: int | None = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(self._fd)
            raise

    def release(self) -> None:
        """Let go of the lock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def unless_recording(directory: Path) -> Iterator[bool]:
    """Hold ``directory``'s lock for the block and yield ``True``; yield ``False`` (holding nothing) while a
    recorder has it."""
    try:
        lock = SessionLock(directory)
    except BlockingIOError:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()
