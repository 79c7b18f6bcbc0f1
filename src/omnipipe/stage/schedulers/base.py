"""What every stage scheduler offers the stage loop: schedule -> (runner) -> postprocess.

Only the scheduler changes a request's status (``RequestStatus``). The stage loop asks it for a batch, runs the
batch, and hands each output back to ``postprocess``, which moves the request to the status the output names
(``RunnerOutput.status``): FINISHED (out of the scheduler), waiting for more input (WAITING_FOR_CHUNK), still
runnable, or what else its stage kind knows (``RUNNER_STATUSES``). A FAILED output, or one naming a status the
stage kind has no use for, fails the request instead (``StageStep``, through ``fail``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput


class Scheduler(ABC):
    # the statuses a runner of this stage kind may report (``RunnerOutput.status``) besides FAILED
    RUNNER_STATUSES: frozenset[RequestStatus] = frozenset({RequestStatus.RUNNING, RequestStatus.FINISHED})

    def __init__(self, max_num_seqs: int, options: dict[str, Any] | None = None) -> None:
        """``options``: the stage's deploy options (``stages.<name>.options``); a scheduler reads its own knobs
        there and raises ``ValueError`` naming the key for a bad one (the stage then fails to load with it)."""
        self.max_num_seqs = max_num_seqs

    @abstractmethod
    def add(self, request: StageRequest) -> None:
        """A new request (with input, or registered ahead of its first chunk)."""

    @abstractmethod
    def on_input(self, request: StageRequest) -> None:
        """New input arrived for ``request``."""

    @abstractmethod
    def has_work(self) -> bool:
        """Whether ``schedule`` would return a non-empty batch."""

    @abstractmethod
    def schedule(self) -> tuple[list[StageRequest], bool]:
        """Return (batch, is_prefill)."""

    @abstractmethod
    def postprocess(self, request: StageRequest, output: RunnerOutput) -> bool:
        """Apply one step's output to ``request``'s status; return True when the step finished it."""

    def finish_exhausted(self) -> list[StageRequest]:
        """Finish and return the requests that have nothing left to run (their input ended with nothing more)."""
        return []

    def finish(self, request: StageRequest) -> None:
        """Mark ``request`` FINISHED and drop it."""
        request.status = RequestStatus.FINISHED
        self.remove(request.request_id)

    def fail(self, request: StageRequest) -> None:
        """Mark ``request`` FAILED and drop it (the stage loop reports the failure)."""
        request.status = RequestStatus.FAILED
        self.remove(request.request_id)

    @abstractmethod
    def remove(self, request_id: str) -> StageRequest | None:
        """Drop a request (abort); return it if it was here."""

    @abstractmethod
    def counts(self) -> tuple[int, int, int]:
        """(running, waiting, waiting for a chunk)."""
