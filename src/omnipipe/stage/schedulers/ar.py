"""Continuous batching for autoregressive stages.

Requests join the running batch between steps (a prefill step for the newcomers) and leave it as soon as they
finish; at most ``max_num_seqs`` run at once. A request that has used all its input and expects more waits in
WAITING_FOR_CHUNK outside the batch.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.schedulers.base import Scheduler


class ARScheduler(Scheduler):
    def __init__(self, max_num_seqs: int, options: dict[str, Any] | None = None) -> None:
        super().__init__(max_num_seqs, options)
        self.waiting: deque[StageRequest] = deque()
        self.running: list[StageRequest] = []
        self.waiting_for_chunk: dict[str, StageRequest] = {}

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

    def has_work(self) -> bool:
        return bool(self.running) or (bool(self.waiting) and len(self.running) < self.max_num_seqs)

    def schedule(self) -> tuple[list[StageRequest], bool]:
        """Return (batch, is_prefill). New requests are prefilled first, then the running batch decodes."""
        admitted: list[StageRequest] = []
        while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
            admitted.append(self.waiting.popleft())
        now = time.perf_counter()
        if admitted:
            for request in admitted:
                request.status = RequestStatus.RUNNING
                if request.first_scheduled_s is None:
                    request.first_scheduled_s = now
            self.running.extend(admitted)
            return admitted, True
        return list(self.running), False

    def postprocess(self, request: StageRequest, output: RunnerOutput) -> bool:
        """An AR request finishes when the runner says so; it leaves the batch only when it needs more input."""
        if output.finished:
            self.finish(request)
            return True
        if output.needs_input:
            self.park(request)
        return False

    def park(self, request: StageRequest) -> None:
        """The runner consumed all input and needs more."""
        if request in self.running:
            self.running.remove(request)
        if request.inputs:
            self.running.append(request)
            return
        request.status = RequestStatus.WAITING_FOR_CHUNK
        self.waiting_for_chunk[request.request_id] = request

    def finish(self, request: StageRequest) -> None:
        request.status = RequestStatus.FINISHED
        self.remove(request.request_id)

    def remove(self, request_id: str) -> StageRequest | None:
        found = self.waiting_for_chunk.pop(request_id, None)
        for request in list(self.running):
            if request.request_id == request_id:
                self.running.remove(request)
                found = request
        for request in list(self.waiting):
            if request.request_id == request_id:
                self.waiting.remove(request)
                found = request
        return found

    def counts(self) -> tuple[int, int, int]:
        return len(self.running), len(self.waiting), len(self.waiting_for_chunk)
