"""The interface a model family implements for one stage."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnipipe.stage.request import StageRequest


@dataclass
class RunnerOutput:
    """One step's result for one request."""

    request_id: str
    text_delta: str = ""
    audio: np.ndarray | None = None  # float32 mono, final audio for the user
    data: dict[str, Any] | None = None  # step data for the next stage (chunk processor or forwarding)
    num_units: int = 0  # tokens or frames this step produced
    finished: bool = False
    finish_reason: str | None = None
    needs_input: bool = False  # AR stage: wait (WAITING_FOR_CHUNK) until the next input chunk arrives
    error: str | None = None  # this request failed (e.g. its input is too long); the rest of the batch goes on


@dataclass
class RunnerContext:
    stage: str
    device: str
    threads: int
    max_num_seqs: int
    options: dict[str, Any]
    rank: int = 0
    world_size: int = 1
    dist_init_address: str | None = None


class StageRunner(ABC):
    """Loads a model and runs one step over a batch of requests.

    AR stages: ``execute(batch, is_prefill)`` is called with newly admitted requests (``is_prefill=True``: read
    ``request.take_all_inputs()``, build the per-request cache) or with the running batch (one decode step each).
    Generation stages: ``execute(batch, False)``; each request has at least one input chunk, take one with
    ``request.take_input()`` and return its result; the scheduler finishes a request once its input is exhausted.
    """

    def __init__(self, context: RunnerContext) -> None:
        self.context = context

    @abstractmethod
    def load(self) -> None:
        """Load weights. Called once in the stage process before it reports ready."""

    @abstractmethod
    def execute(self, batch: list[StageRequest], is_prefill: bool) -> list[RunnerOutput]:
        """Run one step for every request of ``batch``; return one output per request, in order."""

    def warmup(self) -> None:
        """Run the model once on a dummy input so the first real request does not pay one-time costs."""

    def free(self, request: StageRequest) -> None:
        """Drop whatever per-request state (KV cache, buffers) the runner holds for ``request``."""
        request.runner_state = None
