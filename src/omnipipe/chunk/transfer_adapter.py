"""Owns the chunk lifecycle of one stage: chunk ids, keys, and the background recv and save loops.

- save loop (thread): the stage's main loop hands it ready chunks (``save_async``) and goes back to compute;
  the loop encodes, writes the relay, and notifies the consumer.
- recv loop (thread): blocks on the chunk socket; each arrival is read off the relay at once, filed by key, and
  the main loop is woken through an inproc socket. The main loop then calls ``take_ready()`` to collect, in
  chunk order, every chunk of the requests it has registered.

Keys are ``{request_id}_{from_stage}_{to_stage}_{chunk_id}``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Any

import zmq

from omnipipe.chunk.connector import ChunkConnector, ReceivedChunk

logger = logging.getLogger(__name__)

_ABORTED_MEMORY = 4096  # how many aborted request ids to remember to drop their late chunks


def chunk_key(request_id: str, from_stage: str, to_stage: str, chunk_id: int) -> str:
    return f"{request_id}_{from_stage}_{to_stage}_{chunk_id}"


@dataclass
class _SaveTask:
    request_id: str
    to_stage: str
    chunk_id: int
    is_last: bool
    data: dict[str, Any] | None
    on_sent: Any  # callable(nbytes, seconds) run in the save thread


@dataclass
class _RouteTask:
    to_stage: str
    address: str


class ChunkTransferAdapter:
    def __init__(self, ctx: zmq.Context, connector: ChunkConnector, stage: str, wake_address: str) -> None:
        self.ctx = ctx
        self.connector = connector
        self.stage = stage
        self._wake_address = wake_address
        self._save_queue: queue.Queue[_SaveTask | _RouteTask | None] = queue.Queue()
        self._next_send_id: dict[tuple[str, str], int] = defaultdict(int)
        self._expect: dict[str, dict[str, int]] = {}  # request -> from_stage -> next chunk id
        self._arrived: dict[str, set[str]] = defaultdict(set)  # request -> keys filed, not yet taken
        self._aborted: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._stop_address = f"inproc://chunk-stop-{id(self)}"
        self._stop_push = ctx.socket(zmq.PAIR)
        self._stop_push.bind(self._stop_address)
        self._threads: list[threading.Thread] = []
        self.save_errors: queue.Queue[tuple[str, str]] = queue.Queue()

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._save_loop, name=f"{self.stage}-chunk-save", daemon=True)]
        if self.connector.receive_socket is not None:
            self._threads.append(threading.Thread(target=self._recv_loop, name=f"{self.stage}-chunk-recv", daemon=True))
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------ producer side
    def set_route(self, to_stage: str, address: str) -> None:
        """Chunks for ``to_stage`` saved from now on go to ``address`` (applied in order by the save loop)."""
        self._save_queue.put(_RouteTask(to_stage, address))

    def save_async(self, request_id: str, to_stage: str, data: dict[str, Any] | None, is_last: bool,
                   on_sent: Any = None) -> int:
        key = (request_id, to_stage)
        chunk_id = self._next_send_id[key]
        self._next_send_id[key] = chunk_id + 1
        if is_last:
            del self._next_send_id[key]
        self._save_queue.put(_SaveTask(request_id, to_stage, chunk_id, is_last, data, on_sent))
        return chunk_id

    def _save_loop(self) -> None:
        while True:
            task = self._save_queue.get()
            if task is None:
                return
            if isinstance(task, _RouteTask):
                self.connector.connect(task.to_stage, task.address)
                continue
            with self._lock:
                if task.request_id in self._aborted:
                    continue
            start = time.perf_counter()
            try:
                key = chunk_key(task.request_id, self.stage, task.to_stage, task.chunk_id)
                nbytes = self.connector.put(task.to_stage, key, task.request_id, task.chunk_id, task.is_last,
                                            task.data)
            except Exception as exc:  # the request fails, the stage lives on
                logger.exception("stage %s: sending a chunk of %s failed", self.stage, task.request_id)
                self.save_errors.put((task.request_id,
                                      f"sending chunk {task.chunk_id} to {task.to_stage} failed: {exc}"))
                self._wake()
                continue
            if task.on_sent is not None:
                task.on_sent(nbytes, time.perf_counter() - start)

    # ------------------------------------------------------------------ consumer side
    def register(self, request_id: str, from_stages: list[str]) -> None:
        with self._lock:
            self._expect[request_id] = {stage: 0 for stage in from_stages}

    def _recv_loop(self) -> None:
        sock = self.connector.receive_socket
        assert sock is not None  # the thread runs only for a stage that receives chunks
        stop = self.ctx.socket(zmq.PAIR)
        stop.connect(self._stop_address)
        wake = self.ctx.socket(zmq.PUSH)
        wake.connect(self._wake_address)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(stop, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if stop in events:
                    return
                if sock in events:
                    got = False
                    while sock.poll(0):
                        chunk = self.connector.receive()
                        if chunk is not None and self._file(chunk):
                            got = True
                        del chunk  # a zero-copy chunk holds its relay slot for as long as anything refers to it
                    if got:
                        wake.send(b"", zmq.NOBLOCK)
        finally:
            stop.close(0)
            wake.close(0)

    def _file(self, chunk: ReceivedChunk) -> bool:
        with self._lock:
            if chunk.request_id in self._aborted:
                self.connector.get(chunk.key)
                return False
            self._arrived[chunk.request_id].add(chunk.key)
            return True

    def _wake(self) -> None:
        sock = self.ctx.socket(zmq.PUSH)
        sock.connect(self._wake_address)
        sock.send(b"")
        sock.close(1000)

    def take_ready(self) -> dict[str, list[ReceivedChunk]]:
        """Chunks now in order for registered requests: request -> chunks (main loop only)."""
        ready: dict[str, list[ReceivedChunk]] = {}
        with self._lock:
            for request_id in [r for r in self._arrived if r in self._expect]:
                expected = self._expect[request_id]
                for from_stage in list(expected):
                    while True:
                        key = chunk_key(request_id, from_stage, self.stage, expected[from_stage])
                        chunk = self.connector.get(key)
                        if chunk is None:
                            break
                        self._arrived[request_id].discard(key)
                        ready.setdefault(request_id, []).append(chunk)
                        expected[from_stage] += 1
                if not self._arrived[request_id]:
                    del self._arrived[request_id]
        return ready

    # ---------------------------------------------------------------------- lifecycle
    def cleanup(self, request_id: str, aborted: bool) -> None:
        with self._lock:
            self._expect.pop(request_id, None)
            self._arrived.pop(request_id, None)
            for key in [k for k in self._next_send_id if k[0] == request_id]:
                del self._next_send_id[key]
            if aborted:
                self._aborted[request_id] = None
                while len(self._aborted) > _ABORTED_MEMORY:
                    self._aborted.popitem(last=False)
        self.connector.drop(request_id)

    def pending_chunks(self) -> int:
        return self.connector.pending()

    def close(self) -> None:
        self._save_queue.put(None)
        receiving = any(t.name.endswith("-chunk-recv") and t.is_alive() for t in self._threads)
        try:
            if receiving:
                self._stop_push.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the recv thread then ends with the process (it is a daemon)
            logger.warning("stage %s: could not signal the chunk recv loop to stop: %s", self.stage, exc)
        for thread in self._threads:
            thread.join(timeout=5)
        self._stop_push.close(0)
        self.connector.close()
