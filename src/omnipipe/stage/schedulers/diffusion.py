"""Batching for diffusion stages: a request is a denoising loop of N steps, one runner call a step.

Three policies, the stage option ``batching`` (``stages.<name>.options.batching``):

- ``step`` (default): step-level continuous batching. Every running request takes its next step in one call,
  whatever step each is at; new requests join between steps (up to ``max_num_seqs`` running) and finished ones
  leave at once, so a request never waits for a batch it did not start with.
- ``request``: request-level batching. A batch forms from the requests waiting when the previous batch has
  wholly finished, and runs to its end (all its members at the same step); newcomers wait for it.
- ``none``: one request at a time, start to finish, oldest first.

A request is admitted once its conditioning has arrived whole (``input_finished``); until then it waits for its
chunk outside the batch. An abort drops it at the next step boundary (the stage loop handles aborts between
steps); the runner frees its latents then.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.schedulers.base import Scheduler

BATCHING = ("step", "request", "none")


class DiffusionScheduler(Scheduler):
    def __init__(self, max_num_seqs: int, options: dict[str, Any] | None = None) -> None:
        super().__init__(max_num_seqs, options)
        batching = (options or {}).get("batching", "step")
        if batching not in BATCHING:
            raise ValueError(f"options.batching: must be one of {', '.join(BATCHING)}, got {batching!r}")
        self.batching: str = batching
        self.waiting: deque[StageRequest] = deque()
        self.running: list[StageRequest] = []
        self.waiting_for_chunk: dict[str, StageRequest] = {}

    def add(self, request: StageRequest) -> None:
        if request.input_finished:
            request.status = RequestStatus.WAITING
            self.waiting.append(request)
        else:
            request.status = RequestStatus.WAITING_FOR_CHUNK
            self.waiting_for_chunk[request.request_id] = request

    def on_input(self, request: StageRequest) -> None:
        if request.input_finished and self.waiting_for_chunk.pop(request.request_id, None) is not None:
            request.status = RequestStatus.WAITING
            self.waiting.append(request)

    def _room(self) -> int:
        """How many waiting requests may join the running batch now."""
        if self.batching == "step":
            return self.max_num_seqs - len(self.running)
        if self.running:  # request-level and none: the batch runs to its end before anyone joins
            return 0
        return self.max_num_seqs if self.batching == "request" else 1

    def has_work(self) -> bool:
        return bool(self.running) or (bool(self.waiting) and self._room() > 0)

    def schedule(self) -> tuple[list[StageRequest], bool]:
        """Return (every running request, after admitting newcomers, False): one denoising step each."""
        room = self._room()
        now = time.perf_counter()
        while self.waiting and room > 0:
            request = self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now
            self.running.append(request)
            room -= 1
        return list(self.running), False

    def postprocess(self, request: StageRequest, output: RunnerOutput) -> bool:
        if output.status is RequestStatus.FINISHED:
            self.finish(request)
            return True
        return False

    def remove(self, request_id: str) -> StageRequest | None:
        found = self.waiting_for_chunk.pop(request_id, None)
        for queue in (self.running, self.waiting):
            for request in list(queue):
                if request.request_id == request_id:
                    queue.remove(request)
                    found = request
        return found

    def counts(self) -> tuple[int, int, int]:
        return len(self.running), len(self.waiting), len(self.waiting_for_chunk)
