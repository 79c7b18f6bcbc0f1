"""Placement: where a stage's processes run. Launchers registered by name; a new placement is one module."""

from __future__ import annotations

from typing import Callable

from omnipipe.placement.launcher import Launcher, StageHandle
from omnipipe.placement.local import LocalLauncher

LAUNCHERS: dict[str, Callable[[], Launcher]] = {"local": LocalLauncher}
DEFAULT_LAUNCHER = "local"


def launcher_for(name: str) -> Launcher:
    try:
        return LAUNCHERS[name]()
    except KeyError:
        raise ValueError(f"unknown placement {name!r}; expected one of {', '.join(LAUNCHERS)}") from None


__all__ = ["DEFAULT_LAUNCHER", "LAUNCHERS", "Launcher", "StageHandle", "launcher_for"]
