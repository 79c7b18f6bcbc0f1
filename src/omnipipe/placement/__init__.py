"""Placement: where a stage's processes run. Launchers registered by name; a new placement is one module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omnipipe.placement.launcher import Launcher, StageHandle
from omnipipe.placement.local import LocalLauncher
from omnipipe.placement.ray_actors import RayLauncher

# name -> factory taking the run's DeployConfig (``placement.backend`` names one; config/deploy_config.PLACEMENTS)
LAUNCHERS: dict[str, Callable[[Any], Launcher]] = {
    "local": lambda deploy: LocalLauncher(),
    "ray": RayLauncher.from_deploy,
}
DEFAULT_LAUNCHER = "local"


def launcher_for(name: str, deploy: Any = None) -> Launcher:
    try:
        factory = LAUNCHERS[name]
    except KeyError:
        raise ValueError(f"unknown placement {name!r}; expected one of {', '.join(LAUNCHERS)}") from None
    return factory(deploy)


__all__ = ["DEFAULT_LAUNCHER", "LAUNCHERS", "Launcher", "StageHandle", "launcher_for"]
