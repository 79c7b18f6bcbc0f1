"""Where converted model weights live: ``$OMNIPIPE_CACHE`` or the user's cache directory."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def cache_root() -> Path:
    """Return the omnipipe cache directory, creating it if needed."""
    configured = os.environ.get("OMNIPIPE_CACHE")
    if configured:
        root = Path(configured).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = Path(base) / "omnipipe"
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing): one process prepares a cached model at a time."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
