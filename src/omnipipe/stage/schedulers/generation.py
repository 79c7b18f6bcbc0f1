"""Batching for non-autoregressive stages (talker frames, vocoder chunks, encoders).

Every request with an input chunk ready is runnable; one step takes up to ``max_num_seqs`` of them, oldest
first or by playback deadline (the ``schedule`` option, ``service_order.py``), and runs them in one call.
Requests whose next chunk has not arrived sit in WAITING_FOR_CHUNK and cost nothing. A request finishes when its
input is marked finished and fully consumed.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.schedulers.base import Scheduler
from omnipipe.stage.schedulers.service_order import Clock, ServiceOrder


class GenerationScheduler(Scheduler):
    def __init__(self, max_num_seqs: int, options: dict[str, Any] | None = None,
                 clock: Clock = time.perf_counter) -> None:
        super().__init__(max_num_seqs, options)
        self.requests: OrderedDict[str, StageRequest] = OrderedDict()  # in arrival order
        self.service = ServiceOrder(options, clock)

    def add(self, request: StageRequest) -> None:
        self.requests[request.request_id] = request
        self._refresh(request)

    def on_input(self, request: StageRequest) -> None:
        self._refresh(request)

    def _refresh(self, request: StageRequest) -> None:
        if request.status is RequestStatus.FINISHED:
            return
        request.status = RequestStatus.WAITING if request.inputs else RequestStatus.WAITING_FOR_CHUNK

    def has_work(self) -> bool:
        return any(r.inputs or r.input_exhausted for r in self.requests.values())

    def exhausted(self) -> list[StageRequest]:
        """Requests whose input ended with nothing left to run (e.g. an empty last chunk)."""
        return [r for r in self.requests.values() if r.input_exhausted]

    def finish_exhausted(self) -> list[StageRequest]:
        done = self.exhausted()
        for request in done:
            self.finish(request)
        return done

    def schedule(self) -> tuple[list[StageRequest], bool]:
        batch = self.service.pick([r for r in self.requests.values() if r.inputs], self.max_num_seqs)
        now = time.perf_counter()
        for request in batch:
            request.status = RequestStatus.RUNNING
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now
        return batch, False

    def postprocess(self, request: StageRequest, output: RunnerOutput) -> bool:
        """A request finishes once its input is finished and consumed (or the runner says so); until then it
        waits for its next chunk after every step."""
        self.service.record(request, output)
        if output.status is RequestStatus.FINISHED or request.input_exhausted:
            self.finish(request)
            return True
        self.park(request)
        return False

    def park(self, request: StageRequest) -> None:
        self._refresh(request)

    def remove(self, request_id: str) -> StageRequest | None:
        self.service.forget(request_id)
        return self.requests.pop(request_id, None)

    def counts(self) -> tuple[int, int, int]:
        running = sum(1 for r in self.requests.values() if r.status is RequestStatus.RUNNING)
        waiting = sum(1 for r in self.requests.values() if r.status is RequestStatus.WAITING)
        return running, waiting, sum(1 for r in self.requests.values() if r.status is RequestStatus.WAITING_FOR_CHUNK)
