"""Continuous batching for autoregressive stages.

Requests join the running batch between steps (a prefill step for the newcomers) and leave it as soon as they
finish; at most ``max_num_seqs`` run at once. A request that has used all its input and expects more waits in
WAITING_FOR_CHUNK outside the batch.

A request's status after each step is the one its output names (``RunnerOutput.status``):

- an admitted request is PREFILLING until a step leaves it RUNNING (decoding). A runner may prefill a long prompt
  in pieces (PREFILLING again): prefill steps then alternate with decode steps of the running requests, so an
  arrival never freezes their streams for longer than one piece;
- WAITING_FOR_CHUNK: out of the batch until its next input arrives (then RUNNING, or WAITING to be admitted again
  if it was never prefilled);
- WAITING_FOR_MEMORY: its KV cache does not fit what is free; it goes back to the head of the queue, and nothing
  more is admitted until a request leaves the stage and frees its cache;
- FINISHED: out of the stage.

Which waiting request is admitted next, and which running requests a decode step takes in what order, follow the
``schedule`` option (``service_order.py``): oldest first, or by playback deadline.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.schedulers.base import Scheduler
from omnipipe.stage.schedulers.service_order import Clock, ServiceOrder


class ARScheduler(Scheduler):
    RUNNER_STATUSES = frozenset({RequestStatus.PREFILLING, RequestStatus.RUNNING, RequestStatus.WAITING_FOR_CHUNK,
                                 RequestStatus.WAITING_FOR_MEMORY, RequestStatus.FINISHED})

    def __init__(self, max_num_seqs: int, options: dict[str, Any] | None = None,
                 clock: Clock = time.perf_counter) -> None:
        super().__init__(max_num_seqs, options)
        self.service = ServiceOrder(options, clock)
        self.waiting: deque[StageRequest] = deque()
        self.running: list[StageRequest] = []  # admitted: being prefilled or decoding
        self.prefilling: list[StageRequest] = []  # of ``running``: a prefill in pieces not finished yet
        self.waiting_for_chunk: dict[str, StageRequest] = {}
        self.memory_blocked = False  # a request waits for KV memory: admit none until one leaves
        self._last_was_prefill = False

    def add(self, request: StageRequest) -> None:
        if request.inputs or request.input_finished:
            request.status = RequestStatus.WAITING
            self.waiting.append(request)
        else:
            request.status = RequestStatus.WAITING_FOR_CHUNK
            self.waiting_for_chunk[request.request_id] = request

    def on_input(self, request: StageRequest) -> None:
        """New input arrived for ``request``: wake it if it was waiting for a chunk."""
        if self.waiting_for_chunk.pop(request.request_id, None) is None:
            return
        if request.prefilled:
            request.status = RequestStatus.RUNNING
            self.running.append(request)
        else:
            request.status = RequestStatus.WAITING
            self.waiting.append(request)

    def _can_admit(self) -> bool:
        return bool(self.waiting) and len(self.running) < self.max_num_seqs and not self.memory_blocked

    def has_work(self) -> bool:
        return bool(self.running) or self._can_admit()

    def schedule(self) -> tuple[list[StageRequest], bool]:
        """Return (batch, is_prefill): the newcomers and the unfinished prefills, or the decoding requests; when
        both have work the two alternate."""
        now = time.perf_counter()
        while self._can_admit():
            request = self.service.order(self.waiting)[0]
            self.waiting.remove(request)
            request.status = RequestStatus.PREFILLING
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now
            self.running.append(request)
            self.prefilling.append(request)
        decoding = [request for request in self.running if request not in self.prefilling]
        if self.prefilling and (not decoding or not self._last_was_prefill):
            self._last_was_prefill = True
            batch, self.prefilling = self.service.order(self.prefilling), []
            return batch, True
        self._last_was_prefill = False
        return self.service.pick(decoding, len(decoding)), False

    def postprocess(self, request: StageRequest, output: RunnerOutput) -> bool:
        """Move ``request`` to the status its output names: an AR request finishes when the runner says so; it
        leaves the batch only when it needs more input or memory, and stays among the prefills while its prefill
        is not done."""
        self.service.record(request, output)
        status = output.status
        if status is RequestStatus.FINISHED:
            self.finish(request)
            return True
        if status is RequestStatus.WAITING_FOR_MEMORY:
            self._requeue(request)
        elif status is RequestStatus.PREFILLING:
            request.status = RequestStatus.PREFILLING
            if request not in self.prefilling:
                self.prefilling.append(request)
        elif status is RequestStatus.WAITING_FOR_CHUNK:
            self.park(request)
        elif status is RequestStatus.RUNNING:
            request.status = RequestStatus.RUNNING
        else:
            raise ValueError(f"{request.request_id}: an AR stage has no use for a runner's {status.name}")
        return False

    def _requeue(self, request: StageRequest) -> None:
        self._drop_from_batch(request)
        request.status = RequestStatus.WAITING_FOR_MEMORY
        self.waiting.appendleft(request)
        self.memory_blocked = True

    def _drop_from_batch(self, request: StageRequest) -> None:
        if request in self.running:
            self.running.remove(request)
        if request in self.prefilling:
            self.prefilling.remove(request)

    def park(self, request: StageRequest) -> None:
        """The runner consumed all input and needs more."""
        self._drop_from_batch(request)
        if request.inputs:
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            return
        request.status = RequestStatus.WAITING_FOR_CHUNK
        self.waiting_for_chunk[request.request_id] = request

    def remove(self, request_id: str) -> StageRequest | None:
        self.service.forget(request_id)
        found = self.waiting_for_chunk.pop(request_id, None)
        for queue in (self.running, self.prefilling, self.waiting):
            for request in list(queue):
                if request.request_id == request_id:
                    queue.remove(request)
                    found = request
        if found is not None:
            self.memory_blocked = False  # what it held is free now
        return found

    def counts(self) -> tuple[int, int, int]:
        return len(self.running), len(self.waiting), len(self.waiting_for_chunk)
