"""Relay backends by name: one registry builds both ends. A new backend is one module and one line here.

A backend module offers ``make_sender(run_id, owner, options) -> Relay`` (``options``: that backend's own dict
from the deploy config) and ``make_receiver(run_id, owner, zero_copy) -> Relay``; a module serving several backends
(``torch_dist``: gloo and nccl) offers one pair per backend. Every process builds a receiver of every backend, so
a receiver costs nothing until its first get.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from omnipipe.transport.relay import inline, local, mooncake, shm, torch_dist
from omnipipe.transport.relay.base import Relay


@dataclass(frozen=True)
class RelayBackend:
    name: str
    make_sender: Callable[[str, str, dict[str, Any]], Relay]
    make_receiver: Callable[[str, str, bool], Relay]
    crosses_processes: bool = True  # may carry data between stage processes (a deploy file may choose it)
    # its sender listens on an address (options["host"]: the sending process's own host, filled by the engine)
    listens: bool = False


def _backend(name: str, module: ModuleType, crosses_processes: bool = True, listens: bool = False) -> RelayBackend:
    return RelayBackend(name, module.make_sender, module.make_receiver, crosses_processes, listens)


BACKENDS: dict[str, RelayBackend] = {
    backend.name: backend
    for backend in (
        _backend("inline", inline),
        _backend("shm", shm),
        _backend("mooncake", mooncake, listens=True),
        _backend("local", local, crosses_processes=False),
        RelayBackend("gloo", torch_dist.make_gloo_sender, torch_dist.make_gloo_receiver, listens=True),
        RelayBackend("nccl", torch_dist.make_nccl_sender, torch_dist.make_nccl_receiver, listens=True),
    )
}
RELAY_BACKENDS = tuple(name for name, backend in BACKENDS.items() if backend.crosses_processes)
LISTENING_BACKENDS = tuple(name for name, backend in BACKENDS.items() if backend.listens)


def _lookup(backend: str) -> RelayBackend:
    try:
        return BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown relay backend {backend!r}; expected one of {', '.join(BACKENDS)}") from None


def create_relay(backend: str, *, run_id: str, owner: str,
                 options: dict[str, dict[str, Any]] | None = None) -> Relay:
    """The sending end of ``backend``. ``options`` maps backend name -> that backend's options."""
    return _lookup(backend).make_sender(run_id, owner, dict((options or {}).get(backend, {})))


def create_receivers(run_id: str, owner: str, *, zero_copy: bool = False) -> dict[str, Relay]:
    """One receiving end per registered backend, keyed by name (what ``read_payload`` looks payloads up in).
    ``zero_copy``: backends that can return views over their buffers do (the buffer frees when the view goes)."""
    return {name: backend.make_receiver(run_id, owner, zero_copy) for name, backend in BACKENDS.items()}
