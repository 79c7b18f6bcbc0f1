"""How a ``gloo``/``nccl`` relay's two ends pair up: a sender's ``TCPStore`` and a 2-rank process group per reader.

The sender hosts the store (``host_store``); a reader connects, checks the store is still that sender's, takes the
next index from the ``peers`` counter, says ``hello/<k>`` and builds its end of the group over
``PrefixStore("p<k>/")`` (``join_sender``), while the sender's thread for reader ``k`` builds the other end
(``sender_group``). The groups are ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` objects of their own, never the
process's default group. torch is imported on first use only.
"""

from __future__ import annotations

import datetime
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from omnipipe.transport.relay.base import RelayError

logger = logging.getLogger(__name__)

_CONNECT_TIMEOUT_S = 2.0  # a reader gives up connecting to a sender's store this soon (no listener: it exited)


def torch_module() -> Any:
    import torch  # imported on first use only: a process that never touches a torch relay never loads it

    return torch


def c10d_module() -> Any:
    from torch._C import _distributed_c10d

    return _distributed_c10d


def seconds(value: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=float(value))


def new_group(backend: str, store: Any, rank: int, host: str, timeout_s: float) -> Any:
    """Rank ``rank`` of a 2-rank ``backend`` group over ``store``."""
    c10d = c10d_module()
    if backend == "gloo":
        options = c10d.ProcessGroupGloo._Options()
        options._devices = [c10d.ProcessGroupGloo.create_device(hostname=host)]
        options._timeout = seconds(timeout_s)
        return c10d.ProcessGroupGloo(store, rank, 2, options)
    options = c10d.ProcessGroupNCCL.Options()
    options._timeout = seconds(timeout_s)
    return c10d.ProcessGroupNCCL(store, rank, 2, options)


def shutdown_group(group: Any) -> None:
    try:
        group.shutdown()
    except Exception:  # already broken (a peer died): nothing more to release
        logger.debug("shutting a relay process group down failed", exc_info=True)


# ---------------------------------------------------------------------- sender
def host_store(backend: str, host: str, timeout_s: float, sender_id: str) -> tuple[Any, int]:
    """The sender's store (a server on a port the kernel picks) and that port; it names the sender it belongs to."""
    try:
        store = c10d_module().TCPStore(host, 0, None, True, timeout=seconds(timeout_s), wait_for_workers=False)
    except Exception as exc:
        raise RelayError(f"relay {backend!r} cannot host its store on {host}: {exc}") from exc
    store.set("sender", sender_id)
    return store, int(store.port)


def store_client(host: str, port: int, timeout_s: float) -> Any:
    """A connection of the sender's own to its store (each serving thread has one)."""
    return c10d_module().TCPStore(host, port, None, False, timeout=seconds(timeout_s))


def sender_group(backend: str, store: Any, index: int, host: str, timeout_s: float) -> Any:
    """The sender's end (rank 0) of reader ``index``'s group."""
    return new_group(backend, c10d_module().PrefixStore(f"p{index}/", store), 0, host, timeout_s)


# ---------------------------------------------------------------------- reader
@dataclass
class Peer:
    """A reader's end of one sender: its store connection, its group and its request counter."""

    key: tuple[str, int, str]  # the sender's store host, port and sender id
    store: Any
    index: int
    group: Any = None
    next_request: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def join_sender(backend: str, key: tuple[str, int, str], timeout_s: float) -> Peer:
    """Join the sender ``key`` as a new reader: take an index, say hello, build the reader's end (rank 1)."""
    host, port, sender = key
    c10d = c10d_module()
    try:
        store = c10d.TCPStore(host, port, None, False, timeout=seconds(min(timeout_s, _CONNECT_TIMEOUT_S)))
        store.set_timeout(seconds(timeout_s))
        if store.get("sender").decode() != sender:
            raise RelayError("another sender now listens on that port")
        index = store.add("peers", 1)
        store.set(f"hello/{index}", b"1")
        group = new_group(backend, c10d.PrefixStore(f"p{index}/", store), 1, host, timeout_s)
    except Exception as exc:
        raise RelayError(f"{backend} relay: cannot join the sender at {host}:{port} within "
                         f"{timeout_s:g} s (did its process exit?): {exc}") from exc
    return Peer(key, store, index, group)
