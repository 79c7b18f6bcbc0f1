"""A request as one stage sees it."""

from __future__ import annotations

import enum
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any


class RequestStatus(enum.Enum):
    """Where a request stands in its stage: one status, which only the stage's scheduler sets
    (``StageRequest.status``). A runner step says where it left each request with ``RunnerOutput.status`` (any but
    WAITING); the scheduler moves the request there, or fails it for a status its stage kind has no use for
    (``Scheduler.RUNNER_STATUSES``)."""

    WAITING = "waiting"  # admitted with input, not yet scheduled
    PREFILLING = "prefilling"  # AR: in the batch, its prompt not all in the cache yet (another prefill step)
    RUNNING = "running"  # in the batch: decoding (AR), or a step on its input (generation, diffusion)
    WAITING_FOR_CHUNK = "waiting_for_chunk"  # needs the next input chunk; never blocks the batch
    WAITING_FOR_MEMORY = "waiting_for_memory"  # AR: its KV cache does not fit what is free; first in the queue
    FINISHED = "finished"  # done (``RunnerOutput.finish_reason`` says why); out of the scheduler
    FAILED = "failed"  # failed alone (``RunnerOutput.error``); out of the scheduler


@dataclass
class StageRequest:
    request_id: str
    params: dict[str, Any]
    emit_final: bool
    emit_data: bool
    chunk_targets: list[str]
    session_id: str | None = None  # the conversation it belongs to (``generate(session_id=...)``), if any
    status: RequestStatus = RequestStatus.WAITING
    inputs: deque[dict[str, Any]] = field(default_factory=deque)  # input chunks not consumed yet
    input_finished: bool = False
    consumed_inputs: int = 0
    prefilled: bool = False
    runner_state: Any = None  # owned by the runner
    chunk_state: dict[str, dict[str, Any]] = field(default_factory=dict)  # per target, owned by chunk processors
    num_units: int = 0  # tokens or frames produced
    num_prompt_tokens: int = 0  # set by a runner that tokenises a prompt (an LLM thinker)
    num_cached_tokens: int = 0  # of those, the ones a prefix cache spared its prefill (their KV was kept)
    arrival_s: float = field(default_factory=time.perf_counter)
    first_input_s: float | None = None  # its first input arrived (later than arrival for a stage fed by chunks)
    first_scheduled_s: float | None = None
    compute_s: float = 0.0
    max_batch_size: int = 0
    # figures a runner measured for this request (e.g. how long its inputs took to decode and reach every rank);
    # they join the stage's metrics in ``RequestMetrics.stages``
    runner_metrics: dict[str, float] = field(default_factory=dict)

    def take_input(self) -> dict[str, Any] | None:
        if not self.inputs:
            return None
        self.consumed_inputs += 1
        return self.inputs.popleft()

    def take_all_inputs(self) -> list[dict[str, Any]]:
        items = list(self.inputs)
        self.inputs.clear()
        self.consumed_inputs += len(items)
        return items

    @property
    def input_exhausted(self) -> bool:
        return self.input_finished and not self.inputs
