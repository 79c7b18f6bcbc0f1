"""A request's multimodal inputs reaching every rank of a tensor-parallel stage before its prefill.

Rank 0 runs the scheduler and drives the other ranks (the followers). A request's raw inputs (msgpack-encodable
values: an encoded JPEG's bytes, strings, numbers, lists) must be *materialised* (decoded to tensors by the
stage's ``materialize`` function, deterministic) and be present on every rank before rank 0 schedules the
request. Three modes, chosen by one string:

- ``blocking``: on the caller's thread, rank 0 materialises and broadcasts the result as a pickled object.
- ``async``: the same work on one background worker thread, in FIFO order; the caller gets a Future.
- ``async_raw``: the worker broadcasts the raw dict itself, msgpack-encoded in a uint8 tensor (no pickle, and a
  JPEG is far smaller than its decoded pixels), and every rank, rank 0 included, materialises it in a small thread
  pool so the wire keeps moving. Raw inputs whose encoding is under ``raw_threshold_bytes`` take the ``async``
  path (materialise once on rank 0, broadcast the object): for those, decoding on every rank buys nothing.

The wire. The broadcaster owns its process group, and exactly one thread per process touches it (two gloo
collectives in flight on one group abort the process): rank 0's worker (the caller, under a lock, in ``blocking``
mode) and each follower's receiver thread. Every message is a header, an int64 tensor ``[kind, length]``, then:

- ``OBJECT``: ``broadcast_object_list([{"request_id": ..., "inputs": ...}])`` — the one pickle on the group,
  carrying only what rank 0's own ``materialize`` produced (in ``blocking`` and ``async`` modes, and for small
  inputs in ``async_raw``);
- ``RAW``: a uint8 tensor of ``length`` bytes, msgpack ``[request_id, raw]``;
- ``DROP``: a uint8 tensor of ``length`` bytes, the UTF-8 request id: followers discard that request;
- ``STOP``: nothing more; the followers' receivers exit.

Cancelling. A request still queued on rank 0 never reaches the wire: it is removed and its Future cancelled, and
the followers never hear of it. One already sent (or being sent) is followed by a ``DROP`` in the same FIFO (ahead
of requests still queued). In ``async_raw`` a materialise that fails on rank 0 sends the same ``DROP`` by itself:
rank 0 will never schedule that request, so the followers (whose materialise fails alike) must not keep it. In the
object modes a failed materialise puts nothing on the wire. Rank 0 never issues a prefill command for a request
before its own ``take`` returned it, which is what lets a follower's ``take`` wait for its data.

Timings. ``stats(request_id)`` gives ``{"materialize_s", "broadcast_s"}`` on every rank (the last
``TIMINGS_KEPT`` requests): the seconds this rank spent materialising (0.0 on a follower that received the object)
and on the wire (header and payload, pickling or msgpack encoding included; a follower counts from its header's
arrival, not its wait for one).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec
import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

MODES = ("blocking", "async", "async_raw")
TIMINGS_KEPT = 4096
STOP_TIMEOUT_S = 30.0

Materialize = Callable[[dict[str, Any]], dict[str, Any]]
Trace = list[tuple[str, str | None]]


class Kind(enum.IntEnum):
    OBJECT = 1
    RAW = 2
    DROP = 3
    STOP = 4


class _State(enum.Enum):
    QUEUED = "queued"  # in the worker's queue: cancelling removes it and nothing reaches the wire
    WORKING = "working"  # taken by the worker, nothing on the wire yet (being materialised or encoded)
    SENT = "sent"  # on the wire or about to be: cancelling sends DROP
    LOCAL = "local"  # never goes on the wire (world size 1, or its materialise failed first)


@dataclass(eq=False)
class _SubmittedInputs:
    """A request's raw inputs and the future of their materialised form, held on rank 0 from ``submit`` until
    ``take`` or ``cancel``."""

    request_id: str
    raw: dict[str, Any] | None
    future: Future = field(default_factory=Future)
    state: _State = _State.QUEUED
    cancelled: bool = False
    dropped: bool = False  # a DROP for it is queued or sent


def _settle(future: Future, result: Any = None, error: BaseException | None = None) -> None:
    """Resolve ``future`` unless it was cancelled meanwhile (its result is then nobody's)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


class Broadcaster:
    def __init__(self, mode: str, rank: int, world_size: int, group: Any, materialize: Materialize,
                 raw_threshold_bytes: int = 256 * 1024, workers: int = 1, trace: Trace | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"broadcast mode {mode!r}: choose one of {', '.join(MODES)}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"broadcaster rank {rank} of world size {world_size}: need 0 <= rank < world_size")
        if world_size > 1 and group is None:
            raise ValueError("a broadcaster over several ranks needs its own process group")
        if workers < 1:
            raise ValueError(f"broadcaster workers {workers}: need at least 1")
        self.mode = mode
        self.rank = rank
        self.world_size = world_size
        self._group = group
        self._materialize = materialize
        self._raw_threshold_bytes = raw_threshold_bytes
        self._trace = trace
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._wire_lock = threading.Lock()  # blocking mode: callers' threads take turns on the group
        self._timings: OrderedDict[str, dict[str, float]] = OrderedDict()
        self._closed = False
        self._broken: BaseException | None = None  # the group failed: nothing more can be sent or received
        self._submitted: dict[str, _SubmittedInputs] = {}  # rank 0
        self._arrived: dict[str, Future] = {}  # followers
        # rank 0's worker: (OBJECT or RAW, _SubmittedInputs) | (DROP, id) | STOP
        self._queue: deque[tuple[Kind, Any]] = deque()
        uses_pool = mode == "async_raw" and world_size > 1
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=f"mm-materialize-{rank}") if uses_pool else None
        self._thread: threading.Thread | None = None
        if rank > 0:
            self._thread = threading.Thread(target=self._receive_loop, name=f"mm-receive-{rank}", daemon=True)
        elif mode != "blocking":
            self._thread = threading.Thread(target=self._work_loop, name="mm-broadcast", daemon=True)
        if self._thread is not None:
            self._thread.start()

    # ----- rank 0 ---------------------------------------------------------------------------------------------

    def submit(self, request_id: str, raw: dict[str, Any]) -> Future:
        """Start bringing ``raw``'s materialised form to every rank; the Future resolves to it on rank 0."""
        self._require_rank0("submit")
        held = _SubmittedInputs(request_id, raw)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"request {request_id}: the broadcaster is closed")
            if self._broken is not None:
                raise RuntimeError(f"request {request_id}: the broadcast group failed") from self._broken
            if request_id in self._submitted:
                raise ValueError(f"request {request_id} is already submitted")
            self._submitted[request_id] = held
            if self.mode != "blocking":
                self._queue.append((Kind.RAW if self.mode == "async_raw" else Kind.OBJECT, held))
                self._wakeup.notify()
                return held.future
        held.state = _State.WORKING
        with self._wire_lock:
            try:
                self._send_object(held)
            except Exception as exc:  # the wire failed: this rank cannot go on broadcasting
                self._broken = exc
                _settle(held.future, error=exc)
                raise
        return held.future

    def cancel(self, request_id: str) -> bool:
        """Abort a request rank 0 holds: False when it holds none (never submitted, taken, or cancelled)."""
        self._require_rank0("cancel")
        with self._lock:
            held = self._submitted.pop(request_id, None)
            if held is None:
                return False
            held.cancelled = True
            held.raw = None
            held.future.cancel()  # a Future already resolved stays so; nobody holds it any more
            if held.state is not _State.SENT or held.dropped:
                return True  # queued or being worked on: the worker skips it, nothing reaches the wire
            held.dropped = True
            if self.mode != "blocking":
                self._queue.appendleft((Kind.DROP, request_id))
                self._wakeup.notify()
                return True
        with self._wire_lock:
            self._send_drop(request_id)
        return True

    # ----- both -----------------------------------------------------------------------------------------------

    def take(self, request_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for a request's materialised inputs and release them. Rank 0: the request must be held (KeyError
        otherwise). A follower waits for data that may not have arrived yet. Raises the materialise's error, or
        ``CancelledError`` if the request was cancelled; ``TimeoutError`` leaves the request held."""
        future: Future | None
        with self._lock:
            if self.rank == 0:
                held = self._submitted.get(request_id)
                if held is None:
                    raise KeyError(f"request {request_id} is not held (never submitted, taken, or cancelled)")
                future = held.future
            else:
                future = self._arrived.get(request_id)
                if future is None:
                    if self._closed:
                        raise RuntimeError(f"request {request_id}: the broadcaster is closed")
                    if self._broken is not None:
                        raise RuntimeError(f"request {request_id}: the broadcast group failed") from self._broken
                    future = self._arrived[request_id] = Future()
        try:
            return future.result(timeout_s)
        finally:
            if future.done():  # a timeout leaves it held
                self._release(request_id, future)

    def pending(self) -> list[str]:
        """The request ids this rank still holds (a leak check: empty once every request was taken or dropped)."""
        with self._lock:
            return list(self._submitted if self.rank == 0 else self._arrived)

    def stats(self, request_id: str) -> dict[str, float] | None:
        """``{"materialize_s", "broadcast_s"}`` this rank spent on the request (see the module docstring)."""
        with self._lock:
            timing = self._timings.get(request_id)
            return dict(timing) if timing is not None else None

    def close(self, timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
        """Stop: rank 0 sends STOP after whatever is on the wire (requests still queued are cancelled, never sent)
        and joins its worker; a follower waits for that STOP. Returns the request ids still held here, whose
        Futures are cancelled — a leak unless the stage is aborting. Idempotent (later calls return [])."""
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            if self.rank == 0 and self.mode != "blocking":
                for held in self._submitted.values():
                    if held.state is _State.QUEUED:
                        held.cancelled = True  # never sent: the worker skips it
                self._queue.append((Kind.STOP, None))
                self._wakeup.notify()
        if self.rank == 0 and self.mode == "blocking":
            with self._wire_lock:
                self._send_stop()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning("broadcaster rank %d: its %s thread did not stop in %.0f s", self.rank,
                               self._thread.name, timeout_s)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            futures = [h.future for h in self._submitted.values()] if self.rank == 0 else list(self._arrived.values())
            leftover = list(self._submitted if self.rank == 0 else self._arrived)
            self._submitted.clear()
            self._arrived.clear()
        for future in futures:
            future.cancel()
        if leftover:
            logger.warning("broadcaster rank %d closed holding requests %s", self.rank, leftover)
        return leftover

    # ----- rank 0's worker ------------------------------------------------------------------------------------

    def _work_loop(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    self._wakeup.wait()
                kind, item = self._queue.popleft()
                if kind in (Kind.OBJECT, Kind.RAW):
                    if item.cancelled:
                        continue
                    item.state = _State.WORKING
            try:
                if kind is Kind.STOP:
                    self._send_stop()
                    return
                if self._broken is not None:
                    continue  # the group failed: requests were failed with it; only STOP ends the loop
                if kind is Kind.DROP:
                    self._send_drop(item)
                elif kind is Kind.RAW:
                    self._send_raw(item)
                else:
                    self._send_object(item)
            except Exception as exc:  # the group is unusable: fail everything held rather than hang the callers
                logger.exception("broadcaster rank 0: the wire failed; failing every request held")
                with self._lock:
                    self._broken = exc
                    futures = [h.future for h in self._submitted.values()]
                for future in futures:
                    _settle(future, error=RuntimeError(f"the broadcast group failed: {exc!r}"))

    def _send_stop(self) -> None:
        """The last message: after every materialise on rank 0's pool has ended (one that fails queues a DROP)
        and after every DROP queued."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        with self._lock:
            drops = [item for kind, item in self._queue if kind is Kind.DROP]
            self._queue.clear()
        if self.world_size == 1 or self._broken is not None:
            return
        for request_id in drops:
            self._send_drop(request_id)
        self._send_header(Kind.STOP, 0)
        self._record(Kind.STOP, None)

    def _send_object(self, held: _SubmittedInputs) -> None:
        """Materialise on this thread, then (unless cancelled meanwhile) broadcast the result as an object."""
        started = time.perf_counter()
        raw = held.raw
        if raw is None:  # cancelled meanwhile (``cancel`` drops the inputs): nobody waits for them
            return
        try:
            inputs = self._materialize(raw)
        except Exception as exc:
            held.state = _State.LOCAL
            logger.warning("request %s: materialising its inputs failed: %r", held.request_id, exc)
            _settle(held.future, error=exc)
            return
        materialize_s = time.perf_counter() - started
        self._note(held.request_id, materialize_s=materialize_s)
        with self._lock:
            if held.cancelled:
                return
            held.state = _State.SENT if self.world_size > 1 else _State.LOCAL
            held.raw = None
        if self.world_size > 1:
            started = time.perf_counter()
            self._send_header(Kind.OBJECT, 0)
            dist.broadcast_object_list([{"request_id": held.request_id, "inputs": inputs}], group=self._group,
                                       group_src=0)
            self._note(held.request_id, broadcast_s=time.perf_counter() - started)
            self._record(Kind.OBJECT, held.request_id)
        _settle(held.future, inputs)

    def _send_raw(self, held: _SubmittedInputs) -> None:
        started = time.perf_counter()
        payload = msgspec.msgpack.encode([held.request_id, held.raw]) if self.world_size > 1 else b""
        if self.world_size == 1 or len(payload) < self._raw_threshold_bytes:  # materialise here
            self._send_object(held)
            return
        with self._lock:
            if held.cancelled:
                return
            held.state = _State.SENT
            raw, held.raw = held.raw, None
        assert raw is not None  # only ``cancel`` drops them before this, and it marks the request cancelled
        assert self._pool is not None
        self._pool.submit(self._materialize_on_rank0, held, raw)
        self._send_header(Kind.RAW, len(payload))
        dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), group=self._group, group_src=0)
        self._note(held.request_id, broadcast_s=time.perf_counter() - started)
        self._record(Kind.RAW, held.request_id)

    def _materialize_on_rank0(self, held: _SubmittedInputs, raw: dict[str, Any]) -> None:
        try:
            inputs = self._timed_materialize(held.request_id, raw)
        except Exception as exc:
            logger.warning("request %s: materialising its inputs failed: %r", held.request_id, exc)
            with self._lock:  # the followers fail alike; rank 0 will never schedule it: they drop it
                if not held.cancelled and not held.dropped:
                    held.dropped = True
                    self._queue.appendleft((Kind.DROP, held.request_id))
                    self._wakeup.notify()
            _settle(held.future, error=exc)
            return
        _settle(held.future, inputs)

    def _send_drop(self, request_id: str) -> None:
        payload = request_id.encode()
        self._send_header(Kind.DROP, len(payload))
        dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), group=self._group, group_src=0)
        self._record(Kind.DROP, request_id)

    def _send_header(self, kind: Kind, length: int) -> None:
        dist.broadcast(torch.tensor([int(kind), length], dtype=torch.int64), group=self._group, group_src=0)

    # ----- a follower's receiver ------------------------------------------------------------------------------

    def _receive_loop(self) -> None:
        try:
            while True:
                header = torch.empty(2, dtype=torch.int64)
                dist.broadcast(header, group=self._group, group_src=0)
                kind, length = Kind(int(header[0])), int(header[1])
                started = time.perf_counter()
                if kind is Kind.STOP:
                    self._record(kind, None)
                    return
                if kind is Kind.OBJECT:
                    box: list[Any] = [None]
                    dist.broadcast_object_list(box, group=self._group, group_src=0)
                    request_id, inputs = box[0]["request_id"], box[0]["inputs"]
                    self._note(request_id, materialize_s=0.0, broadcast_s=time.perf_counter() - started)
                    self._record(kind, request_id)
                    _settle(self._arrival(request_id), inputs)
                elif kind is Kind.RAW:
                    request_id, raw = msgspec.msgpack.decode(self._receive_bytes(length))
                    self._note(request_id, broadcast_s=time.perf_counter() - started)
                    self._record(kind, request_id)
                    assert self._pool is not None
                    self._pool.submit(self._materialize_on_follower, request_id, raw, self._arrival(request_id))
                else:
                    request_id = bytes(self._receive_bytes(length)).decode()
                    self._record(kind, request_id)
                    with self._lock:
                        future = self._arrived.pop(request_id, None)
                    if future is not None:
                        future.cancel()
        except Exception as exc:  # rank 0 is gone or the group failed: fail the waiters rather than hang them
            logger.exception("broadcaster rank %d: the wire failed; failing every request held", self.rank)
            with self._lock:
                self._broken = exc
                futures = list(self._arrived.values())
            for future in futures:
                _settle(future, error=RuntimeError(f"the broadcast group failed: {exc!r}"))

    def _receive_bytes(self, length: int) -> memoryview:
        buffer = torch.empty(length, dtype=torch.uint8)
        dist.broadcast(buffer, group=self._group, group_src=0)
        return buffer.numpy().data

    def _arrival(self, request_id: str) -> Future:
        with self._lock:
            future = self._arrived.get(request_id)
            if future is None:
                future = self._arrived[request_id] = Future()
            return future

    def _materialize_on_follower(self, request_id: str, raw: dict[str, Any], future: Future) -> None:
        if future.cancelled():
            return  # dropped before its turn in the pool
        try:
            inputs = self._timed_materialize(request_id, raw)
        except Exception as exc:  # rank 0 fails alike and sends DROP
            _settle(future, error=exc)
            return
        _settle(future, inputs)

    # ----- shared ---------------------------------------------------------------------------------------------

    def _timed_materialize(self, request_id: str, raw: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        inputs = self._materialize(raw)
        self._note(request_id, materialize_s=time.perf_counter() - started)
        return inputs

    def _release(self, request_id: str, future: Future) -> None:
        with self._lock:
            if self.rank == 0:
                held = self._submitted.get(request_id)
                if held is not None and held.future is future:
                    del self._submitted[request_id]
            elif self._arrived.get(request_id) is future:
                del self._arrived[request_id]

    def _note(self, request_id: str, **seconds: float) -> None:
        with self._lock:
            timing = self._timings.setdefault(request_id, {"materialize_s": 0.0, "broadcast_s": 0.0})
            timing.update(seconds)
            self._timings.move_to_end(request_id)
            while len(self._timings) > TIMINGS_KEPT:
                self._timings.popitem(last=False)

    def _record(self, kind: Kind, request_id: str | None) -> None:
        if self._trace is not None:
            self._trace.append((kind.name.lower(), request_id))

    def _require_rank0(self, what: str) -> None:
        if self.rank != 0:
            raise RuntimeError(f"{what} is rank 0's: this broadcaster is rank {self.rank}'s")


__all__ = ["MODES", "Broadcaster", "Kind"]
