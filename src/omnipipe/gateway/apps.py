"""Which of the gateway's apps (request types) the administrator has enabled."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omnipipe.gateway.config import REQUEST_TYPES
from omnipipe.protocol.errors import APIError


class AppSwitches:
    def __init__(self) -> None:
        self._enabled = {name: True for name in REQUEST_TYPES}

    def snapshot(self) -> dict[str, bool]:
        return dict(self._enabled)

    def update(self, changes: Mapping[str, Any]) -> dict[str, bool]:
        """Apply ``{app: bool}``; validates everything before changing anything."""
        for name, value in changes.items():
            if name not in self._enabled:
                raise APIError(400, f"{name}: unknown app (apps: {', '.join(REQUEST_TYPES)})", param=name,
                               code="unknown_app")
            if not isinstance(value, bool):
                raise APIError(400, f"{name}: expected true or false, got {type(value).__name__}", param=name)
        self._enabled.update(changes)
        return self.snapshot()

    def check(self, name: str) -> None:
        """403 ``app_disabled`` when ``name`` is switched off."""
        if not self._enabled.get(name, False):
            raise APIError(403, f"the {name} app is disabled by the administrator", code="app_disabled")
