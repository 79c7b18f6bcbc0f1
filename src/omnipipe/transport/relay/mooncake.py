"""Mooncake relay: a sender's slot pool that the receiver reads over Mooncake's transfer engine (tcp or rdma).

For edges between stages on different hosts. The model is the shm relay's: each sender registers one pool of
``num_slots`` fixed slots (the credits) with its transfer engine, plus a header of two uint64 words per slot,
``(generation, acked generation)``. ``put`` takes a free slot, copies the payload in, bumps the slot's
generation and sends the metadata (the sender's session ``host:rpc_port``, the slot's address, the address of its
header record, the generation) over the control plane. The receiver reads the bytes with
``transfer_sync_read`` straight into a registered receive buffer of its own, reads the slot's generation word back
to check the slot was not released while it read, and acknowledges by writing that generation into the slot's
acked word with ``transfer_sync_write``: the acknowledgement travels over Mooncake too, and a late one for an
older generation never frees a slot that has been reused. The sender takes back acknowledged slots on its next
put (or in ``slots_in_use``/``cleanup``/``close``). A payload larger than a slot gets a one-off registered buffer
with the same one-record header, dropped once acknowledged. Credits, generations and back-pressure are the shared
slot pool's (``slot_pool.py``); this module owns the registered buffers and their header words.

The receiver's bytes land in memory that is the caller's own until dropped (a pooled receive buffer, registered
once and reused only when nothing made from it is alive: ``recv_buffers.py``), so every read is already a
private copy and the slot is acknowledged at once; ``zero_copy`` changes nothing here.

Both ends create their engine lazily (the receiver on its first get: every process builds a receiver of every
backend) with the ``P2PHANDSHAKE`` metadata mode, so no metadata server is needed; the ``mooncake`` package is
imported only then (``pip install omnipipe[mooncake]``; it needs libibverbs1 even for tcp).

Network exposure: an engine opens two listening TCP ports, its handshake port (``get_rpc_port()``) and, for the
tcp protocol, a data port, and binds them on every interface (0.0.0.0 / [::]) even when given 127.0.0.1 as its
host; the ports are picked at random. Anyone who can reach them can read and write the registered memory of the
stage, so run stages using this relay on a trusted network only, and firewall those ports from anything else
(e.g. allow only the other stage hosts' addresses to the stage hosts' ephemeral port range).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from omnipipe.transport.relay.base import Relay, RelayError
from omnipipe.transport.relay.recv_buffers import RecvBufferPool
from omnipipe.transport.relay.slot_pool import SlotLease, SlotPool

logger = logging.getLogger(__name__)

PROTOCOLS = ("tcp", "rdma")
DEFAULT_SLOT_BYTES = 4 << 20
DEFAULT_NUM_SLOTS = 8
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PROTOCOL = "tcp"
METADATA_SERVER = "P2PHANDSHAKE"
_PAGE_BYTES = 4096
_RECORD_WORDS = 2  # per slot: generation (the sender's), acked generation (written by the receiver)
_RECV_MIN_POOLED_BYTES = 64 << 10  # smaller receives get a fresh array registered for that one read


def new_engine(host: str, protocol: str, device_name: str = "") -> tuple[Any, str]:
    """An initialised Mooncake transfer engine and its session name ``host:rpc_port``."""
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:
        raise RelayError("the mooncake relay needs the Mooncake transfer engine: pip install 'omnipipe[mooncake]' "
                         f"(and the libibverbs1 system library) ({exc})") from exc
    if protocol not in PROTOCOLS:
        raise RelayError(f"mooncake protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    engine = TransferEngine()
    rc = engine.initialize(host, METADATA_SERVER, protocol, device_name)
    if rc != 0:
        raise RelayError(f"mooncake transfer engine failed to start on {host} ({protocol}): code {rc}")
    return engine, f"{host}:{engine.get_rpc_port()}"


class _Buffer:
    """Registered memory: a header page of slot records, then the slots."""

    def __init__(self, engine: Any, num_slots: int, slot_bytes: int, prefault: bool) -> None:
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.data_offset = _PAGE_BYTES * ((num_slots * _RECORD_WORDS * 8 + _PAGE_BYTES - 1) // _PAGE_BYTES)
        self.array = np.zeros(self.data_offset + num_slots * slot_bytes, dtype=np.uint8)
        if prefault:  # a reused pool: fault every page in now, not during a put (a one-off buffer is written once)
            self.array.fill(0)
        self.header = self.array[: num_slots * _RECORD_WORDS * 8].view(np.uint64).reshape(num_slots, _RECORD_WORDS)
        self.addr = self.array.ctypes.data
        self.engine = engine
        rc = engine.register_memory(self.addr, self.array.nbytes)
        if rc != 0:
            raise RelayError(f"mooncake could not register a {self.array.nbytes}-byte buffer: code {rc}")

    def slot_addr(self, slot: int) -> int:
        return self.addr + self.data_offset + slot * self.slot_bytes

    def record_addr(self, slot: int) -> int:
        return self.addr + slot * _RECORD_WORDS * 8

    def slot_view(self, slot: int, nbytes: int) -> memoryview:
        start = self.data_offset + slot * self.slot_bytes
        return self.array.data[start : start + nbytes]

    def release(self) -> None:
        if self.engine is not None:
            self.engine.unregister_memory(self.addr)
            self.engine = None


class _BufferSlots(SlotPool[_Buffer]):
    """A sender's slots in memory registered with its transfer engine. A receiver acknowledges a slot by writing its
    generation into the slot's acked word over Mooncake, so a late ack for an older generation frees nothing."""

    def __init__(self, relay: MooncakeRelay) -> None:
        super().__init__(relay._lock, relay.num_slots, relay.slot_bytes, relay.acquire_timeout_s, "mooncake")
        self.relay = relay

    def new_block(self, num_slots: int, slot_bytes: int, one_off: bool) -> _Buffer:
        return _Buffer(self.relay._ensure_engine(), num_slots, slot_bytes, prefault=not one_off)

    def acknowledged(self, lease: SlotLease[_Buffer]) -> bool:
        return bool(lease.block.header[lease.slot, 1] == lease.generation)

    def clear_slot(self, block: _Buffer, slot: int) -> None:
        block.header[slot, 0] = 0  # a reader still at it sees the generation gone

    def drop_block(self, block: _Buffer) -> None:
        block.release()

    def exhausted_message(self) -> str:
        return (f"mooncake relay pool {self.relay.session} ({self.relay.label}) exhausted: all {self.num_slots} "
                f"slots held for {self.acquire_timeout_s:g} s without a receiver acknowledging one")


class MooncakeRelay(Relay):
    name = "mooncake"

    def __init__(
        self,
        run_id: str,
        owner: str,
        *,
        host: str = DEFAULT_HOST,
        protocol: str = DEFAULT_PROTOCOL,
        device_name: str = "",
        slot_bytes: int = DEFAULT_SLOT_BYTES,
        num_slots: int = DEFAULT_NUM_SLOTS,
        acquire_timeout_s: float = 30.0,
        zero_copy: bool = False,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise RelayError(f"mooncake protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        self.label = f"{run_id}/{owner}"
        self.host = host
        self.protocol = protocol
        self.device_name = device_name
        self.slot_bytes = slot_bytes
        self.num_slots = num_slots
        self.acquire_timeout_s = acquire_timeout_s
        self.zero_copy = zero_copy  # no effect: every read lands in memory the caller owns (module docstring)
        self._engine: Any = None
        self.session = ""
        # receiver side: pooled receive buffers, each registered once (start address -> length)
        self._recv_buffers = RecvBufferPool(min_bytes=_RECV_MIN_POOLED_BYTES, on_new=self._register_recv)
        self._registered: dict[int, int] = {}
        self._scratch: np.ndarray | None = None  # registered words for header reads and acks
        self._lock = threading.Lock()
        self._slots = _BufferSlots(self)  # sender side
        self._closed = False

    # ---------------------------------------------------------------- engine
    def _ensure_engine(self) -> Any:
        if self._engine is None:
            started = time.perf_counter()
            self._engine, self.session = new_engine(self.host, self.protocol, self.device_name)
            scratch = np.zeros(_RECORD_WORDS, dtype=np.uint64)
            rc = self._engine.register_memory(scratch.ctypes.data, scratch.nbytes)
            if rc != 0:
                raise RelayError(f"mooncake could not register its scratch words: code {rc}")
            self._scratch = scratch
            logger.debug("mooncake engine %s up in %.1f ms", self.session, (time.perf_counter() - started) * 1e3)
        return self._engine

    def _register_recv(self, buffer: np.ndarray) -> None:
        engine = self._ensure_engine()
        rc = engine.register_memory(buffer.ctypes.data, buffer.nbytes)
        if rc != 0:
            raise RelayError(f"mooncake could not register a {buffer.nbytes}-byte receive buffer: code {rc}")
        self._registered[buffer.ctypes.data] = buffer.nbytes

    # ---------------------------------------------------------------- sender
    def put(self, pieces: list[tuple[int, memoryview]], nbytes: int, request_id: str) -> dict[str, Any]:
        with self._lock:
            if self._closed:
                raise RelayError("mooncake relay is closed")
            self._ensure_engine()
            lease = self._slots.take(nbytes, request_id)
            lease.write(pieces, nbytes)
            buffer, slot = lease.block, lease.slot
            buffer.header[slot, 0] = lease.generation
            return {"session": self.session, "addr": buffer.slot_addr(slot), "state_addr": buffer.record_addr(slot),
                    "generation": lease.generation, "capacity": buffer.slot_bytes, "one_off": lease.one_off}

    def cleanup(self, request_id: str) -> None:
        self._slots.release_request(request_id)

    def slots_in_use(self) -> int:
        return self._slots.in_use()

    # -------------------------------------------------------------- receiver
    def get(self, metadata: dict[str, Any], nbytes: int, request_id: str) -> np.ndarray:
        """Read the slot's bytes into a receive buffer of this end's, check the slot was not released meanwhile,
        and acknowledge it; the buffer is the caller's until dropped."""
        try:
            session = metadata["session"]
            addr = int(metadata["addr"])
            state_addr = int(metadata["state_addr"])
            generation = int(metadata["generation"])
            capacity = int(metadata["capacity"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RelayError(f"malformed mooncake relay metadata: {exc!r}") from exc
        if (not isinstance(session, str) or session.count(":") < 1 or addr <= 0 or state_addr <= 0
                or generation <= 0 or not 0 <= nbytes <= capacity):
            raise RelayError(f"mooncake relay metadata out of range: {metadata!r}")
        with self._lock:
            if self._closed:
                raise RelayError("mooncake relay is closed")
            engine = self._ensure_engine()
            out = self._recv_buffers.take(nbytes)
            ptr = out.ctypes.data
            temporary = nbytes > 0 and ptr not in self._registered
            if temporary:
                rc = engine.register_memory(ptr, nbytes)
                if rc != 0:
                    raise RelayError(f"mooncake could not register a {nbytes}-byte receive buffer: code {rc}")
            try:
                if nbytes > 0:
                    rc = engine.transfer_sync_read(session, ptr, addr, nbytes)
                    if rc < 0:
                        raise RelayError(f"mooncake read of {nbytes} bytes from {session} failed (code {rc}): the "
                                         "sender is gone, unreachable, or released the buffer")
            finally:
                if temporary:
                    engine.unregister_memory(ptr)
            scratch = self._scratch
            assert scratch is not None
            rc = engine.transfer_sync_read(session, scratch.ctypes.data, state_addr, 8)
            if rc < 0:
                raise RelayError(f"mooncake read of a slot header from {session} failed (code {rc})")
            if int(scratch[0]) != generation:
                raise RelayError(f"mooncake slot at {session} was released before it was read (generation "
                                 f"{int(scratch[0])}, expected {generation})")
            scratch[1] = generation
            rc = engine.transfer_sync_write(session, scratch.ctypes.data + 8, state_addr + 8, 8)
            if rc < 0:
                raise RelayError(f"mooncake acknowledgement to {session} failed (code {rc})")
            return out

    # ---------------------------------------------------------------- common
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._slots.close()
            if self._engine is not None:
                for ptr in self._registered:
                    self._engine.unregister_memory(ptr)
                if self._scratch is not None:
                    self._engine.unregister_memory(self._scratch.ctypes.data)
            self._registered.clear()
            self._recv_buffers.clear()
            self._scratch = None
            self._engine = None  # the engine stops (and closes its ports) when it is collected


def make_sender(run_id: str, owner: str, options: dict[str, Any]) -> MooncakeRelay:
    """A sender's pool; ``options``: ``host`` (the address receivers reach this process at), ``protocol``
    (tcp, rdma), ``device_name`` (rdma NICs, e.g. mlx5_0), ``slot_bytes``, ``num_slots``, ``acquire_timeout_s``."""
    return MooncakeRelay(run_id, owner, host=str(options.get("host", DEFAULT_HOST)),
                         protocol=str(options.get("protocol", DEFAULT_PROTOCOL)),
                         device_name=str(options.get("device_name", "")),
                         slot_bytes=int(options.get("slot_bytes", DEFAULT_SLOT_BYTES)),
                         num_slots=int(options.get("num_slots", DEFAULT_NUM_SLOTS)),
                         acquire_timeout_s=float(options.get("acquire_timeout_s", 30.0)))


def make_receiver(run_id: str, owner: str, zero_copy: bool) -> MooncakeRelay:
    """A receiver starts no engine until its first get."""
    return MooncakeRelay(run_id, owner, zero_copy=zero_copy)
