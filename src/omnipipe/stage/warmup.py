"""``warm_up``: dummy requests run through a runner's own steps before the stage reports ready.

What the first steps of a stage pay once (``torch.compile`` tracing and compiling its forward for a prefill, for a
decode of one and of several rows; CUDA kernels loaded, the allocator grown) is paid here, in ``StageRunner.warmup``,
instead of inside the first real requests, where a compile can take longer than the stall watchdog allows
(``stall_restart_s``) and gets the stage killed. The requests run under the stage's own scheduler and
``StageStep``, as real ones would (a prefill each, chunked where the runner chunks, then batched steps), and are
freed after; a runner error fails the stage's start with it.
"""

from __future__ import annotations

import copy
from typing import Any

from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.stage.schedulers import scheduler_for
from omnipipe.stage.step import StageStep

MAX_WARMUP_STEPS = 256  # a warm-up that has not finished by then is cut short (its requests freed)


def warm_up(runner: StageRunner, inputs: list[dict[str, Any]], params: dict[str, Any] | None = None, *,
            copies: int = 2, kind: str = "ar", max_steps: int = MAX_WARMUP_STEPS) -> int:
    """Run ``copies`` requests with these ``inputs`` (each its own copy) and ``params`` through ``runner`` until all
    finished (or ``max_steps``); two or more, so a batched step runs too. Returns the steps run; raises
    RuntimeError with the runner's message if a request failed."""
    scheduler = scheduler_for(kind)(max(copies, 1), dict(runner.context.options))
    live: dict[str, StageRequest] = {}
    errors: list[str] = []

    def deliver(request: StageRequest, output: RunnerOutput, finished: bool) -> None:
        if finished:
            release(request.request_id)

    def fail(request_id: str, message: str, field: str | None) -> None:
        errors.append(f"{field}: {message}" if field else message)
        release(request_id)

    def release(request_id: str) -> None:
        request = live.pop(request_id, None)
        scheduler.remove(request_id)
        if request is not None:
            runner.free(request)

    step = StageStep(scheduler, runner, deliver, fail, live.__contains__)
    for index in range(copies):
        request = StageRequest(f"warmup-{index}", dict(params or {}), emit_final=False, emit_data=False,
                               chunk_targets=[])
        request.inputs.extend(copy.deepcopy(inputs))
        request.input_finished = True
        live[request.request_id] = request
        scheduler.add(request)
        runner.admit(request)
    steps = 0
    while live and steps < max_steps:
        for request in scheduler.finish_exhausted():
            release(request.request_id)
        if scheduler.has_work():
            step.run()
        steps += 1
    for request_id in list(live):
        release(request_id)
    if errors:
        raise RuntimeError(f"warm-up failed: {errors[0]}")
    return steps
