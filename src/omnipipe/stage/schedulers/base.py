"""What every stage scheduler offers the stage loop: schedule -> (runner) -> postprocess.

Only the scheduler changes a request's status. The stage loop asks it for a batch, runs the batch, and hands
each output back to ``postprocess``, which decides whether the request finished (FINISHED, out of the scheduler),
waits for more input (WAITING_FOR_CHUNK) or stays runnable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput


class Scheduler(ABC):
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

    @abstractmethod
    def finish(self, request: StageRequest) -> None:
        """Mark ``request`` FINISHED and drop it."""

    @abstractmethod
    def remove(self, request_id: str) -> StageRequest | None:
        """Drop a request (abort); return it if it was here."""

    @abstractmethod
    def counts(self) -> tuple[int, int, int]:
        """(running, waiting, waiting for a chunk)."""
