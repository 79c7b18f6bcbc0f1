"""Where converted model weights live: ``$OMNIPIPE_CACHE`` or the user's cache directory."""

from __future__ import annotations

import os
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
