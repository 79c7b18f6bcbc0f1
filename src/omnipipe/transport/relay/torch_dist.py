"""torch.distributed relays, "gloo" and "nccl": tensors go point to point from a sender's process to a reader's.

Both are ``keeps_device`` relays: the payload codec hands tensors over as objects. On ``nccl`` a CUDA tensor goes
GPU to GPU and lands on the reader's device: the one ``set_process_device`` named for this process (a stage names
its own), else ``cuda:<current device>`` of the reading thread (per thread in CUDA: a chunk thread's current device
is 0 unless set, which is why a stage names its device here). CPU tensors and numpy arrays in the same payload are
staged through the sender's GPU (its first CUDA tensor's, else this process's device) and land on the CPU again.
``gloo`` is the CPU equivalent: everything travels over TCP and lands on the CPU (a CUDA tensor put into a gloo
relay is copied to host memory first). NCCL needs one GPU per end: two processes on the same GPU cannot form an
NCCL group. The engine process reads stage outputs and makes edge handoffs through
the same backends, so with ``nccl`` there it needs a GPU other than its stages' too; ``gloo`` has no such limit.

Groups. Every (sender, reader process) pair gets a 2-rank process group of its own, built directly over the
sender's ``TCPStore`` (``ProcessGroupGloo`` / ``ProcessGroupNCCL`` objects, never the process's default group, so
a stage's tensor-parallel group is untouched). The sender hosts the store on ``options["host"]`` (default
127.0.0.1, a port the kernel picks) on its first put; the address rides in the metadata. A reader joins on its
first get from that sender (``peers`` counter in the store, then a ``PrefixStore("p<k>/")`` for the group) and
keeps the group for later gets; readers that never read from a torch relay never import torch or open a socket.
The pairing itself (store, group building, joining) is ``torch_dist_groups.py``.

Transfers are pulled, not pushed. ``put_objects`` packs the tensors into one byte buffer (no copy when the payload
is one contiguous tensor already on the wire device), keeps it under a per-sender sequence number (the tag) and
returns metadata with the store address, the tag and each tensor's kind / dtype / shape / offset (ints and strs
only). A reader's get writes ``p<k>/want/<n> = tag`` into the store; the sender's thread for that reader answers
over the group with ``(tag, nbytes)`` and the buffer (tagged), or ``(tag, -1)`` when it no longer holds that tag.
Gets may come in any order, from any number of readers. The sender runs one thread per reader (plus one waiting
for the next reader); the caller of ``put_objects`` never blocks on the network. A get costs a
few store round trips before the data moves (well under a millisecond on an idle machine), which is why small
payloads are cheaper over ``shm``/``inline``: a keeps_device relay takes every payload whatever its size.
Contract, as for ``local``: a payload that is one contiguous tensor (or array) on the wire device is held by
reference, so the sender must not modify it until it is read; otherwise the tensors are packed into a new buffer
at put time. A reader gets tensors that are views into one received buffer (``put``/``get`` of plain bytes give a
uint8 buffer).

Aborts and unread transfers (the rule):

* A transfer is held by its sender until a reader takes it or ``cleanup(request_id)`` on the sender drops it,
  exactly like a held shm slot. Nothing is sent until a reader asks, so an unread transfer never blocks a send or
  the group: it only holds memory. The engine already cleans a request's sender relays on abort and failure.
* At most ``max_pending`` transfers are held per sender; a put beyond that waits up to ``timeout_s`` for readers
  (back-pressure) and then raises ``RelayError``.
* A get for a transfer its sender dropped (the request was aborted first) raises ``RelayError`` at once.
* A reader holds nothing between gets, so ``cleanup`` on a reader has nothing to release.
* Every wait is bounded by ``timeout_s`` (sent to readers in the metadata): joining a group, the sender's answer,
  the data itself. A reader that times out, or whose sender died, raises ``RelayError`` and forgets that group (the
  next get from that sender joins afresh); a sender thread whose send fails or times out drops its group and ends.

``close()`` wakes and joins the sender's threads, shuts the groups down and drops the store (its server stops);
held transfers are released. Readers shut down their groups and store connections.

Deploy options (``relay:`` in a deploy file): ``torch_dist_host``, ``torch_dist_timeout_s``,
``torch_dist_max_pending``; they apply to both backends.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import threading
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnipipe.transport.relay.base import Relay, RelayError
from omnipipe.transport.relay.torch_dist_groups import (
    Peer,
    host_store,
    join_sender,
    seconds,
    sender_group,
    shutdown_group,
    store_client,
    torch_module,
)

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_PENDING = 256
_ALIGN_BYTES = 64
_IDLE_WAIT = datetime.timedelta(days=365)  # a sender thread waits this long for a reader; close() wakes it
_STOP = b"stop"
_HEADER_TAG = 0  # a sender's answer to a get; transfers are tagged 1, 2, ...
_instances = itertools.count()
# this process's GPU for nccl transfers (set_process_device): where reads land and where a put without a CUDA tensor
# stages its bytes; None: the calling thread's current device
_process_device: str | None = None


def set_process_device(device: str | None) -> None:
    """Name this process's CUDA device for nccl transfers (``"cuda:1"``): reads land there and a put with no CUDA
    tensor stages through it; None: the calling thread's current device. A plain string, so a process that never
    uses nccl never imports torch for it."""
    global _process_device
    if device is not None and not device.startswith("cuda"):
        raise ValueError(f"an nccl process device must be cuda[:N], got {device!r}")
    _process_device = device


def _aligned(nbytes: int) -> int:
    return (nbytes + _ALIGN_BYTES - 1) // _ALIGN_BYTES * _ALIGN_BYTES


def _from_numpy(torch: Any, array: np.ndarray) -> Any:
    """A tensor over ``array``'s memory; a read-only array (a zero-copy read) is only ever read here, so torch's
    warning about non-writable arrays does not apply."""
    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


@dataclass
class _UnreadTransfer:
    """A transfer its sender holds until a reader takes it (or ``cleanup`` drops it)."""

    request_id: str
    wire: Any  # a 1-D uint8 tensor on the wire device
    event: Any = None  # CUDA event recorded after the wire buffer was filled (nccl)


class TorchDistRelay(Relay):
    keeps_device = True

    def __init__(self, backend: str, host: str = DEFAULT_HOST, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.name = backend
        self.host = host
        self.timeout_s = float(timeout_s)
        self.max_pending = int(max_pending)
        self._sender_id = f"{uuid.uuid4().hex}.{next(_instances)}"
        # sender side
        self._store: Any = None  # the TCPStore server, made on the first put
        self._port = 0
        self._held: dict[int, _UnreadTransfer] = {}
        self._header_device: Any = "cpu"  # nccl: the GPU of the first transfer (answers go where the data goes)
        self._tags = itertools.count(1)
        self._threads: list[threading.Thread] = []
        self._groups: list[Any] = []
        self._waiting_for: list[str] = []  # store keys sender threads block on (set by close to wake them)
        self._cond = threading.Condition()
        self._closed = False
        # reader side
        self._peers: dict[tuple[str, int, str], Peer] = {}
        self._peers_lock = threading.Lock()

    # ================================================================== sender
    def put_objects(self, objects: list[Any], request_id: str) -> dict[str, Any]:
        torch = torch_module()
        device = self._wire_device(objects)
        items: list[list[Any]] = []
        sources: list[tuple[int, Any]] = []
        offset = total = 0
        for obj in objects:
            if isinstance(obj, np.ndarray):
                if obj.dtype.hasobject:
                    raise RelayError(f"relay {self.name!r} cannot send an object array")
                array = np.ascontiguousarray(obj)
                raw = _from_numpy(torch, array.reshape(-1).view(np.uint8)) if array.nbytes else None
                items.append(["numpy", array.dtype.str, list(array.shape), offset, array.nbytes, "cpu"])
                nbytes = array.nbytes
            elif isinstance(obj, torch.Tensor):
                tensor = obj.detach()
                nbytes = tensor.numel() * tensor.element_size()
                raw = tensor.contiguous().reshape(-1).view(torch.uint8) if nbytes else None
                items.append(["torch", str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset, nbytes,
                              tensor.device.type])
            else:
                raise RelayError(f"relay {self.name!r} moves tensors and arrays, got {type(obj).__name__}")
            if raw is not None:
                sources.append((offset, raw))
                total = offset + nbytes
                offset += _aligned(nbytes)
        return self._hold(request_id, sources, total, device, {"items": items})

    def put(self, pieces: list[tuple[int, memoryview]], nbytes: int, request_id: str) -> dict[str, Any]:
        torch = torch_module()
        buffer = np.empty(nbytes, np.uint8)
        for offset, piece in pieces:
            buffer[offset : offset + len(piece)] = np.frombuffer(piece, np.uint8)
        sources = [(0, torch.from_numpy(buffer))] if nbytes else []
        return self._hold(request_id, sources, nbytes, self._wire_device([]), {"bytes": nbytes})

    def _wire_device(self, objects: list[Any]) -> Any:
        torch = torch_module()
        if self.name == "gloo":
            return torch.device("cpu")
        for obj in objects:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cuda":
                return obj.device
        return _nccl_device(torch)

    def _hold(self, request_id: str, sources: list[tuple[int, Any]], nbytes: int, device: Any,
              extra: dict[str, Any]) -> dict[str, Any]:
        torch = torch_module()
        with self._cond:
            if self._closed:
                raise RelayError(f"relay {self.name!r} is closed")
            self._start()
        if len(sources) == 1 and sources[0][1].device == device:
            wire = sources[0][1]  # one contiguous tensor on the wire device already: sent as it is
        else:
            wire = torch.empty(nbytes, dtype=torch.uint8, device=device)
            for offset, raw in sources:
                wire[offset : offset + raw.numel()].copy_(raw)
        event = None
        if self.name == "nccl" and self._header_device == "cpu":
            self._header_device = device
        if device.type == "cuda":
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
        tag = next(self._tags)
        metadata = {"host": self.host, "port": self._port, "sender": self._sender_id, "tag": tag, "nbytes": nbytes,
                    "timeout_ms": max(1, round(self.timeout_s * 1000)), **extra}
        if nbytes == 0:
            return metadata  # nothing travels: the reader builds the empty tensors itself
        with self._cond:
            if not self._cond.wait_for(lambda: self._closed or len(self._held) < self.max_pending, self.timeout_s):
                raise RelayError(f"relay {self.name!r}: {self.max_pending} transfers held unread for "
                                 f"{self.timeout_s:g} s (max_pending); is the reader gone?")
            if self._closed:
                raise RelayError(f"relay {self.name!r} is closed")
            self._held[tag] = _UnreadTransfer(request_id, wire, event)
        return metadata

    def _start(self) -> None:
        """Host the store and start the thread waiting for the first reader (under ``_cond``, first put only)."""
        if self._store is not None:
            return
        self._store, self._port = host_store(self.name, self.host, self.timeout_s, self._sender_id)
        self._spawn(1)

    def _spawn(self, index: int) -> None:
        thread = threading.Thread(target=self._serve, args=(index,), name=f"{self.name}-relay-{index}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _wait(self, store: Any, key: str) -> bytes | None:
        """Block until ``key`` is set (None when close() set it to wake this thread)."""
        with self._cond:
            if self._closed:
                return None
            self._waiting_for.append(key)
        try:
            store.wait([key], _IDLE_WAIT)
        finally:
            with self._cond:
                self._waiting_for.remove(key)
        value = store.get(key)
        return None if value == _STOP else value

    def _serve(self, index: int) -> None:
        """Serve reader ``index``: wait for it to join, start the thread for the next one, then answer its gets."""
        group = None
        try:
            store = store_client(self.host, self._port, self.timeout_s)
            if self._wait(store, f"hello/{index}") is None:
                return
            store.delete_key(f"hello/{index}")
            with self._cond:
                if self._closed:
                    return
                self._spawn(index + 1)
            group = sender_group(self.name, store, index, self.host, self.timeout_s)
            with self._cond:
                self._groups.append(group)
            for request in itertools.count():
                value = self._wait(store, f"p{index}/want/{request}")
                if value is None:
                    return
                tag = int(value)
                with self._cond:
                    held = self._held.pop(tag, None)
                    self._cond.notify_all()
                # the answer goes over the group: (tag, nbytes) then the bytes, or (tag, -1) for a dropped tag
                self._send_header(group, tag, -1 if held is None else held.wire.numel())
                if held is not None:
                    self._send(group, held, tag)
                store.delete_key(f"p{index}/want/{request}")  # off the reader's path: it has its answer
        except Exception:
            if not self._closed:
                logger.exception("relay %s: serving reader %d failed; its group is dropped", self.name, index)
        finally:
            if group is not None:
                with self._cond:
                    if group in self._groups:
                        self._groups.remove(group)
                shutdown_group(group)

    def _send_header(self, group: Any, tag: int, nbytes: int) -> None:
        torch = torch_module()
        header = torch.tensor([tag, nbytes], dtype=torch.int64).to(self._header_device)
        work = group.send([header], 1, _HEADER_TAG)
        if not work.wait(seconds(self.timeout_s)):
            raise RelayError(f"relay {self.name!r}: answering for tag {tag} did not finish in {self.timeout_s:g} s")
        if header.device.type == "cuda":
            torch.cuda.current_stream(header.device).synchronize()

    def _send(self, group: Any, held: _UnreadTransfer, tag: int) -> None:
        torch = torch_module()
        if held.event is not None:
            torch.cuda.current_stream(held.wire.device).wait_event(held.event)
        work = group.send([held.wire], 1, tag)
        if not work.wait(seconds(self.timeout_s)):
            raise RelayError(f"relay {self.name!r}: sending tag {tag} did not finish in {self.timeout_s:g} s")
        if held.wire.device.type == "cuda":
            torch.cuda.current_stream(held.wire.device).synchronize()  # the buffer lives until NCCL is done

    def cleanup(self, request_id: str) -> None:
        """Sender: drop every transfer of ``request_id`` not yet taken. Reader: nothing is held between gets."""
        with self._cond:
            for tag in [tag for tag, held in self._held.items() if held.request_id == request_id]:
                del self._held[tag]
            self._cond.notify_all()

    def slots_in_use(self) -> int:
        with self._cond:
            return len(self._held)

    # ================================================================== reader
    def get_objects(self, metadata: dict[str, Any], request_id: str) -> list[Any]:
        items = metadata.get("items")
        if not isinstance(items, list):
            raise RelayError(f"{self.name} relay metadata has no tensor list: {metadata!r}")
        wire = self._fetch(metadata)
        torch = torch_module()
        out: list[Any] = []
        try:
            for kind, dtype, shape, offset, nbytes, device_type in items:
                raw = wire[offset : offset + nbytes] if nbytes else None
                if kind == "numpy":
                    np_dtype = np.dtype(dtype)
                    if raw is None:
                        out.append(np.empty(shape, np_dtype))
                    else:
                        out.append(raw.cpu().numpy().view(np_dtype).reshape(shape))
                elif kind == "torch":
                    torch_dtype = getattr(torch, dtype)
                    if not isinstance(torch_dtype, torch.dtype):
                        raise RelayError(f"{self.name} relay: unknown torch dtype {dtype!r}")
                    if raw is None:
                        tensor = torch.empty(shape, dtype=torch_dtype, device=wire.device if wire is not None
                                             else "cpu")
                    else:
                        tensor = raw.view(torch_dtype).reshape(shape)
                    if device_type != "cuda" and tensor.device.type != "cpu":
                        tensor = tensor.cpu()  # a CPU tensor staged through the GPU (nccl) lands on the CPU again
                    out.append(tensor)
                else:
                    raise RelayError(f"{self.name} relay: unknown item kind {kind!r}")
        except (TypeError, ValueError, RuntimeError) as exc:
            if isinstance(exc, RelayError):
                raise
            raise RelayError(f"{self.name} relay metadata does not match the data: {exc}") from exc
        return out

    def get(self, metadata: dict[str, Any], nbytes: int, request_id: str) -> Any:
        if metadata.get("bytes") != nbytes:
            raise RelayError(f"{self.name} relay transfer does not hold {nbytes} bytes")
        wire = self._fetch(metadata)
        if wire is None:
            return np.empty(0, np.uint8)
        return wire.cpu().numpy()

    def _fetch(self, metadata: dict[str, Any]) -> Any:
        """The wire buffer of one transfer (None when it is empty): ask its sender for it and receive it."""
        try:
            key = (str(metadata["host"]), int(metadata["port"]), str(metadata["sender"]))
            tag, nbytes = int(metadata["tag"]), int(metadata["nbytes"])
            timeout_s = int(metadata["timeout_ms"]) / 1000
        except (KeyError, TypeError, ValueError) as exc:
            raise RelayError(f"malformed {self.name} relay metadata: {exc!r}") from exc
        if nbytes < 0 or timeout_s <= 0:
            raise RelayError(f"{self.name} relay metadata out of range: {metadata!r}")
        if nbytes == 0:
            return None
        torch = torch_module()
        peer = self._peer(key, timeout_s)
        with peer.lock:
            request = peer.next_request
            peer.next_request += 1
            device = torch.device("cpu") if self.name == "gloo" else _nccl_device(torch)
            header = torch.empty(2, dtype=torch.int64, device=device)
            try:
                peer.store.set(f"p{peer.index}/want/{request}", str(tag))
                work = peer.group.recv([header], 0, _HEADER_TAG)
                if not work.wait(seconds(timeout_s)):
                    raise RelayError("the answer did not arrive")
                answer_tag, answer_bytes = header.tolist()
            except Exception as exc:
                self._forget(peer)
                raise RelayError(f"{self.name} relay: the sender at {key[0]}:{key[1]} did not answer for tag {tag} "
                                 f"within {timeout_s:g} s ({exc})") from exc
            if answer_tag != tag:
                self._forget(peer)
                raise RelayError(f"{self.name} relay: the sender answered for tag {answer_tag}, not {tag}")
            if answer_bytes < 0:
                raise RelayError(f"{self.name} relay: tag {tag} is gone from its sender (released by cleanup, "
                                 "e.g. its request was aborted, or already read)")
            if answer_bytes != nbytes:
                self._forget(peer)
                raise RelayError(f"{self.name} relay: tag {tag} holds {answer_bytes} bytes, its metadata says {nbytes}")
            wire = torch.empty(nbytes, dtype=torch.uint8, device=device)
            try:
                work = peer.group.recv([wire], 0, tag)
                if not work.wait(seconds(timeout_s)):
                    raise RelayError("the receive did not complete")
            except Exception as exc:
                self._forget(peer)
                raise RelayError(f"{self.name} relay: receiving tag {tag} from {key[0]}:{key[1]} failed: "
                                 f"{exc}") from exc
        return wire

    def _peer(self, key: tuple[str, int, str], timeout_s: float) -> Peer:
        with self._peers_lock:
            if self._closed:
                raise RelayError(f"relay {self.name!r} is closed")
            peer = self._peers.get(key)
            if peer is None:
                peer = self._peers[key] = join_sender(self.name, key, timeout_s)
            return peer

    def _forget(self, peer: Peer) -> None:
        with self._peers_lock:
            if self._peers.get(peer.key) is peer:
                del self._peers[peer.key]
        shutdown_group(peer.group)

    # ================================================================== common
    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._held.clear()
            waiting = list(self._waiting_for)
            self._cond.notify_all()
        if self._store is not None:
            for key in waiting:  # wake every sender thread blocked on the store
                try:
                    self._store.set(key, _STOP)
                except Exception:
                    logger.debug("waking a relay thread failed", exc_info=True)
        for thread in list(self._threads):
            thread.join(self.timeout_s + 5)
        with self._cond:
            groups, self._groups = self._groups, []
        for group in groups:
            shutdown_group(group)
        with self._peers_lock:
            peers, self._peers = list(self._peers.values()), {}
        for peer in peers:
            shutdown_group(peer.group)
        self._store = None


def _nccl_device(torch: Any) -> Any:
    """This process's nccl device (``set_process_device``), else the calling thread's current one."""
    if _process_device is None:
        return torch.device("cuda", torch.cuda.current_device())
    device = torch.device(_process_device)
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def _options(backend: str, options: dict[str, Any]) -> TorchDistRelay:
    return TorchDistRelay(backend, host=str(options.get("host", DEFAULT_HOST)),
                          timeout_s=float(options.get("timeout_s", DEFAULT_TIMEOUT_S)),
                          max_pending=int(options.get("max_pending", DEFAULT_MAX_PENDING)))


def make_gloo_sender(run_id: str, owner: str, options: dict[str, Any]) -> TorchDistRelay:
    """A gloo sender; ``options``: ``host``, ``timeout_s``, ``max_pending``."""
    return _options("gloo", options)


def make_gloo_receiver(run_id: str, owner: str, zero_copy: bool) -> TorchDistRelay:
    """A gloo reader: nothing happens (no torch import, no socket) until its first get."""
    return TorchDistRelay("gloo")


def make_nccl_sender(run_id: str, owner: str, options: dict[str, Any]) -> TorchDistRelay:
    """An nccl sender; refused where this process has no CUDA device or torch was built without NCCL."""
    torch = torch_module()
    import torch.distributed as dist

    if not torch.cuda.is_available() or not dist.is_available() or not dist.is_nccl_available():
        raise RelayError("relay backend 'nccl' needs a CUDA device and a torch build with NCCL, which this process "
                         "does not have; use relay backend 'gloo' (the same transfers over TCP, on the CPU)")
    return _options("nccl", options)


def make_nccl_receiver(run_id: str, owner: str, zero_copy: bool) -> TorchDistRelay:
    """An nccl reader: nothing happens until its first get (which lands tensors on this process's CUDA device)."""
    return TorchDistRelay("nccl")
