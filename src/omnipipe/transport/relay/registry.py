"""Choose a relay backend by name."""

from __future__ import annotations

from typing import Any

from omnipipe.transport.relay.base import Relay
from omnipipe.transport.relay.inline import InlineRelay
from omnipipe.transport.relay.shm import ShmRelay

RELAY_BACKENDS = ("inline", "shm")  # byte relays; "local" object handoff lives in relay/local.py


def create_relay(backend: str, *, run_id: str, owner: str, options: dict[str, Any] | None = None) -> Relay:
    options = options or {}
    if backend == "shm":
        return ShmRelay(
            run_id,
            owner,
            slot_bytes=int(options.get("shm_slot_bytes", 4 << 20)),
            num_slots=int(options.get("shm_num_slots", 8)),
        )
    if backend == "inline":
        return InlineRelay()
    raise ValueError(f"unknown relay backend {backend!r}; expected one of {', '.join(RELAY_BACKENDS)}")
