"""Drive an AR stage runner in-process with the stage's own scheduler and step (``ARScheduler`` + ``StageStep``), as
the stage process does, without processes or relays: requests join at chosen steps, chunked inputs arrive at
chosen steps, and every output is kept per request. Tests of batched runners compare a batch's outputs with each
request run alone, count model forwards per step, and time steps."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.stage.schedulers.ar import ARScheduler
from omnipipe.stage.step import StageStep


@dataclass
class Arrival:
    """A request joining at ``step`` with ``inputs`` (chunks; ``more`` chunks arriving later, each at its step)."""

    request_id: str
    params: dict[str, Any]
    inputs: list[dict[str, Any]]
    step: int = 0
    more: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (step, chunk); the last ends the input


@dataclass
class DriveResult:
    outputs: dict[str, list[RunnerOutput]]
    errors: dict[str, str]
    steps: list[tuple[bool, list[str], float]]  # (is_prefill, request ids, seconds) per step

    def text(self, request_id: str) -> str:
        return "".join(o.text_delta for o in self.outputs[request_id])

    def finished(self, request_id: str) -> bool:
        return any(o.finished for o in self.outputs[request_id])


def drive(runner: StageRunner, arrivals: list[Arrival], max_num_seqs: int = 8, per_request: bool = False,
          max_steps: int = 10_000, on_step: Callable[[int], None] | None = None) -> DriveResult:
    """Run until every request finished or failed."""
    scheduler = ARScheduler(max_num_seqs)
    outputs: dict[str, list[RunnerOutput]] = defaultdict(list)
    errors: dict[str, str] = {}
    requests: dict[str, StageRequest] = {}
    live: set[str] = set()

    def deliver(request: StageRequest, output: RunnerOutput, finished: bool) -> None:
        outputs[request.request_id].append(output)
        if finished:
            live.discard(request.request_id)
            runner.free(request)

    def fail(request_id: str, message: str, field_name: str | None) -> None:
        errors[request_id] = f"{field_name}: {message}" if field_name else message
        live.discard(request_id)
        request = requests[request_id]
        scheduler.remove(request_id)
        runner.free(request)

    step = StageStep(scheduler, runner, deliver, fail, live.__contains__, per_request=per_request)
    calls: list[tuple[bool, list[str]]] = []
    schedule = scheduler.schedule

    def recorded() -> tuple[list[StageRequest], bool]:  # each step's phase, as the scheduler picked it
        batch, is_prefill = schedule()
        if batch:
            calls.append((is_prefill, [r.request_id for r in batch]))
        return batch, is_prefill

    scheduler.schedule = recorded  # type: ignore[method-assign]
    return _run(runner, scheduler, step, calls, arrivals, requests, outputs, errors, live, max_steps, on_step)


def _run(runner: StageRunner, scheduler: ARScheduler, step: StageStep, calls: list[tuple[bool, list[str]]],
         arrivals: list[Arrival], requests: dict[str, StageRequest], outputs: dict[str, list[RunnerOutput]],
         errors: dict[str, str], live: set[str], max_steps: int,
         on_step: Callable[[int], None] | None) -> DriveResult:
    steps: list[tuple[bool, list[str], float]] = []
    pending = sorted(arrivals, key=lambda a: a.step)
    later: list[tuple[int, str, dict[str, Any], bool]] = []
    for number in range(max_steps):
        while pending and pending[0].step <= number:
            arrival = pending.pop(0)
            request = StageRequest(arrival.request_id, arrival.params, emit_final=True, emit_data=True,
                                   chunk_targets=[])
            request.inputs.extend(arrival.inputs)
            request.input_finished = not arrival.more
            requests[arrival.request_id], outputs[arrival.request_id] = request, []
            live.add(arrival.request_id)
            scheduler.add(request)
            runner.admit(request)
            later += [(at, arrival.request_id, chunk, i == len(arrival.more) - 1)
                      for i, (at, chunk) in enumerate(arrival.more)]
        for item in [item for item in later if item[0] <= number]:
            later.remove(item)
            _, request_id, chunk, last = item
            request = requests[request_id]
            request.inputs.append(chunk)
            request.input_finished = last
            scheduler.on_input(request)
        if not live and not pending:
            break
        if on_step is not None:
            on_step(number)
        for request_id in runner.woken_requests():  # input that came to the runner itself (e.g. appended audio)
            if request_id in requests:
                scheduler.on_input(requests[request_id])
        if not scheduler.has_work():
            continue
        calls.clear()
        start = time.perf_counter()
        with torch.inference_mode():
            step.run()
        if calls:  # the batch the step ran (a per-request step: its calls together)
            steps.append((calls[0][0], [rid for _, ids in calls for rid in ids], time.perf_counter() - start))
    else:
        raise AssertionError(f"not finished after {max_steps} steps: {sorted(live)} still running")
    return DriveResult(dict(outputs), errors, steps)


class ForwardCounter:
    """Counts calls of a module's forward (e.g. a decoder's language model) between ``reset`` calls."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        self._handle = module.register_forward_hook(self._count)  # completed forwards only

    def _count(self, *_: Any) -> None:
        self.calls += 1

    def reset(self) -> int:
        calls, self.calls = self.calls, 0
        return calls

    def close(self) -> None:
        self._handle.remove()
