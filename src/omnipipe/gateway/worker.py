"""One inference worker as the gateway sees it: capacity, sessions held by the gateway, and health."""

from __future__ import annotations

import time
from dataclasses import dataclass

from omnipipe.protocol.worker import BLOCKED_STATES, BUSY_STATES, WorkerState
from omnipipe.util.field_error import FieldError


def check_address(address: str, field: str = "address") -> None:
    """``address`` must be "host:port" with a port in 1..65535; the error names ``field``."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise FieldError(field, f"a worker address must look like 'host:port', got {address!r}")


@dataclass(eq=False)
class Worker:
    """A worker at ``address`` ("host:port") that can hold up to ``capacity`` sessions at once.

    ``active_sessions`` counts the sessions the gateway has assigned and not yet released; it is the
    authority on occupancy and is never changed by health replies.  ``health_state`` is the last state
    the worker reported (``LOADING`` until the first reply), ``online`` whether it is answering.
    """

    address: str
    capacity: int = 1
    active_sessions: int = 0
    online: bool = False
    health_state: WorkerState = WorkerState.LOADING
    health_reason: str | None = None
    consecutive_failures: int = 0
    last_ok_at: float | None = None
    last_assigned_at: float | None = None
    last_released_at: float | None = None

    def __post_init__(self) -> None:
        check_address(self.address)
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")
        if not 0 <= self.active_sessions <= self.capacity:
            raise ValueError(f"active_sessions must be within 0..{self.capacity}, got {self.active_sessions}")

    @property
    def state(self) -> WorkerState:
        """``OFFLINE`` when not answering, else the last reported state."""
        return self.health_state if self.online else WorkerState.OFFLINE

    @property
    def accepts_work(self) -> bool:
        """Whether health allows new sessions.

        A busy report while the gateway holds sessions on the worker is attributed to those sessions;
        a busy report while the gateway holds none means something else occupies the worker.
        """
        if not self.online or self.health_state in BLOCKED_STATES:
            return False
        return self.health_state is WorkerState.IDLE or self.active_sessions > 0

    @property
    def has_room(self) -> bool:
        """Whether one more session may be assigned now."""
        return self.accepts_work and self.active_sessions < self.capacity

    def mark_busy(self, now: float | None = None) -> None:
        """Count one more session; refuses to go beyond capacity or onto an unavailable worker."""
        if not self.has_room:
            raise RuntimeError(
                f"worker {self.address} has no room (state={self.state.value}, "
                f"active={self.active_sessions}/{self.capacity})"
            )
        self.active_sessions += 1
        self.last_assigned_at = time.monotonic() if now is None else now

    def release(self, now: float | None = None) -> None:
        """Count one session fewer; once the gateway holds none, the worker is presumed idle."""
        if self.active_sessions <= 0:
            raise RuntimeError(f"worker {self.address} has no active session to release")
        self.active_sessions -= 1
        self.last_released_at = time.monotonic() if now is None else now
        if self.active_sessions == 0 and self.health_state in BUSY_STATES:
            self.health_state = WorkerState.IDLE
