"""Settings of one gateway process, validated where they are made."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omnipipe.gateway.presets import Preset, presets_from_data
from omnipipe.gateway.worker import check_address
from omnipipe.protocol.worker import DEFAULT_MAX_BODY_BYTES
from omnipipe.util.field_error import FieldError

REQUEST_TYPES = ("chat", "speech", "transcription", "voice")
"""What the queue, the ETA estimator and the app switches distinguish."""

DEFAULT_BASELINES_S = {"chat": 10.0, "speech": 8.0, "transcription": 5.0, "voice": 120.0}
"""Assumed session durations until the gateway has measured enough real ones."""


@dataclass
class GatewayConfig:
    """``workers`` are "host:port" addresses of ``omnipipe worker`` processes; ``presets`` are ``Preset`` objects
    or their JSON form (``gateway/presets.py``), offered by the pages."""

    workers: list[str]
    host: str = "127.0.0.1"
    port: int = 8006
    max_queue: int = 1000
    admin_token: str | None = None
    data_dir: Path = Path("data")
    record: bool = True
    retention_days: float | None = 30.0
    max_storage_gb: float | None = 10.0
    cleanup_interval_s: float = 3600.0
    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    offline_after_failures: int = 2
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_held_ws_bytes: int = 4 << 20
    chat_session_idle_s: float = 300.0
    eta_baselines_s: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_BASELINES_S))
    presets: list[Preset] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.workers:
            raise FieldError("workers", "give at least one worker address (host:port)")
        for address in self.workers:
            check_address(address, "workers")
        if len(set(self.workers)) != len(self.workers):
            raise FieldError("workers", f"an address is listed twice: {','.join(self.workers)}")
        if not 0 < self.port < 65536:
            raise FieldError("port", f"must be in 1..65535, got {self.port}")
        if self.max_queue < 0:
            raise FieldError("max_queue", f"must be >= 0, got {self.max_queue}")
        if self.admin_token is not None and len(self.admin_token) < 8:
            raise FieldError("admin_token", "use at least 8 characters")
        for name in ("retention_days", "max_storage_gb"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise FieldError(name, f"must be >= 0, got {value}")
        for name in ("cleanup_interval_s", "health_interval_s", "health_timeout_s", "chat_session_idle_s"):
            if getattr(self, name) <= 0:
                raise FieldError(name, f"must be > 0, got {getattr(self, name)}")
        if self.offline_after_failures < 1:
            raise FieldError("offline_after_failures", f"must be >= 1, got {self.offline_after_failures}")
        if self.max_body_bytes < 1:
            raise FieldError("max_body_bytes", f"must be >= 1, got {self.max_body_bytes}")
        self.presets = presets_from_data(self.presets)
        self.data_dir = Path(self.data_dir)
