"""One step of a stage: the scheduler picks a batch, the runner runs it, the scheduler applies each output.

A runner error fails only the request that caused it: a batch whose ``execute`` raises is retried request by request
from snapshots taken before the step (``StageStep._execute_isolated``). What an applied output carries is the stage
loop's to deliver; a failure is the stage loop's to report. A sticky CUDA error is no request's fault and breaks
every later step: the process exits instead (``exit_if_cuda_broke``), and the engine restarts the stage.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omnipipe.stage.device import is_sticky_cuda_error
from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import NOT_RESTORABLE, RunnerOutput, StageRunner
from omnipipe.stage.schedulers import Scheduler

logger = logging.getLogger(__name__)

SLOW_STEP_S = 5.0  # a runner step longer than this is logged with its batch
# the exit code of a stage whose CUDA context broke (a device-side assert): the engine restarts it
CUDA_ERROR_EXIT = 71

Deliver = Callable[[StageRequest, RunnerOutput, bool], None]  # (request, output, finished)
Fail = Callable[[str, str, str | None], None]  # (request id, message, field)


@dataclass
class _Snapshot:
    """What a runner step may consume of a request, taken before a batched step (see ``_execute_isolated``)."""

    inputs: list[dict[str, Any]]  # the items themselves are shared: runners read them, never mutate them
    consumed_inputs: int
    prefilled: bool
    runner: Any  # the runner's own snapshot, or NOT_RESTORABLE


class StageStep:
    """Runs a stage's steps on ``runner`` with ``scheduler``; ``deliver`` sends an applied output on, ``fail``
    fails one request, ``is_live`` says whether a request is still the stage's."""

    def __init__(self, scheduler: Scheduler, runner: StageRunner, deliver: Deliver, fail: Fail,
                 is_live: Callable[[str], bool], per_request: bool = False) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.per_request = per_request  # the stage option step_per_request: one runner call per request
        self._deliver = deliver
        self._fail = fail
        self._is_live = is_live

    def run(self) -> None:
        """One step: the scheduler picks a batch, the runner runs it, the scheduler applies each output, and the
        stage delivers what the output carries. A runner error fails only the request that caused it."""
        batch, is_prefill = self.scheduler.schedule()
        if not batch:
            return
        snapshots = [self._snapshot(request) for request in batch] if len(batch) > 1 else None
        start = time.perf_counter()
        try:
            outputs = self._execute(batch)
        except Exception as exc:  # a model error fails its request; the stage lives on
            exit_if_cuda_broke(exc)
            if snapshots is None:
                logger.exception("runner failed on %s", batch[0].request_id)
                self._fail(batch[0].request_id, f"{type(exc).__name__}: {exc}", None)
            else:
                logger.exception("runner failed on a batch of %d; retrying its requests one by one", len(batch))
                self._execute_isolated(batch, snapshots)
            return
        elapsed = time.perf_counter() - start
        if elapsed > SLOW_STEP_S:  # what a stall report points at: which batch, which phase
            logger.warning("a %s step of %d request(s) took %.1f s (%s)", "prefill" if is_prefill else "decode",
                           len(batch), elapsed, ", ".join(r.request_id for r in batch[:8]))
        self._apply(batch, outputs, elapsed)

    def _execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        if self.per_request and len(batch) > 1:
            outputs = [output for request in batch for output in self._execute([request])]
        else:
            outputs = self.runner.execute(batch)
        if len(outputs) != len(batch):
            raise RuntimeError(f"runner returned {len(outputs)} outputs for a batch of {len(batch)}")
        return outputs

    def _apply(self, batch: list[StageRequest], outputs: list[RunnerOutput], elapsed: float) -> None:
        for request, output in zip(batch, outputs, strict=True):
            if output.status is RequestStatus.FAILED:
                self.scheduler.fail(request)
                self._fail(request.request_id, output.error or "", output.error_field)
                continue
            if output.status not in self.scheduler.RUNNER_STATUSES:  # a runner written for another stage kind
                self.scheduler.fail(request)
                self._fail(request.request_id, f"the runner left the request {output.status.name}, which a "
                                               f"{type(self.scheduler).__name__} cannot schedule", None)
                continue
            request.compute_s += elapsed
            request.max_batch_size = max(request.max_batch_size, len(batch))
            request.num_units += output.num_units
            finished = self.scheduler.postprocess(request, output)
            self._deliver(request, output, finished)

    def _snapshot(self, request: StageRequest) -> _Snapshot:
        try:
            runner_snapshot = self.runner.snapshot(request)
        except Exception:
            logger.exception("runner could not snapshot %s", request.request_id)
            runner_snapshot = NOT_RESTORABLE
        return _Snapshot(list(request.inputs), request.consumed_inputs, request.prefilled, runner_snapshot)

    def _execute_isolated(self, batch: list[StageRequest], snapshots: list[_Snapshot]) -> None:
        """After ``execute`` raised on ``batch``, run each of its requests alone, so that only the one(s) that
        make the runner raise fail (each with its own error) and the others get the outputs they would have got
        alone.

        The failed call may have consumed inputs and advanced some members' runner state before it raised, so
        each request is first put back as it was before the step: the stage restores what the step may consume
        of the request itself (its pending ``inputs``, ``consumed_inputs``, ``prefilled``) and the runner its own
        state through ``restore(request, snapshot)`` (``StageRunner.snapshot`` documents the contract; e.g. the
        toy thinker keeps a shallow copy of its per-request dict, the default thinker rewinds its KV cache).
        Nothing else is touched by a step: ``chunk_state``, metrics and the scheduler's bookkeeping change only
        after the outputs are applied, which a failed step never reaches.

        What cannot be restored is not retried: a request whose runner reported ``NOT_RESTORABLE`` (state that a
        failed step may have half-advanced, e.g. a KV cache with no way back) fails, with a message that says so
        and does not carry the other request's error. Retrying it would risk silently wrong output, which is
        worse than an error. A request that raises again alone fails with its own error."""
        for request, snapshot in zip(batch, snapshots, strict=True):
            request_id = request.request_id
            if not self._is_live(request_id):  # defensive: nothing above removes a batch-mate
                continue
            if snapshot.runner is NOT_RESTORABLE:
                self._fail(request_id, "the runner failed on a batch this request was part of, and its state "
                                       "cannot be restored to retry it alone", None)
                continue
            request.inputs.clear()
            request.inputs.extend(snapshot.inputs)
            request.consumed_inputs, request.prefilled = snapshot.consumed_inputs, snapshot.prefilled
            start = time.perf_counter()
            try:
                self.runner.restore(request, snapshot.runner)
                outputs = self._execute([request])
            except Exception as exc:
                exit_if_cuda_broke(exc)
                logger.exception("runner failed on %s alone", request_id)
                self._fail(request_id, f"{type(exc).__name__}: {exc}", None)
                continue
            self._apply([request], outputs, time.perf_counter() - start)


def exit_if_cuda_broke(exc: BaseException) -> None:
    """A sticky CUDA error (a device-side assert, an illegal address) leaves this process's CUDA context unusable:
    failing the request alone would fail every later one too, and the stage would never be restarted. End the
    process instead; the engine fails its requests and restarts the stage."""
    if is_sticky_cuda_error(exc):
        logger.critical("CUDA error, this process's CUDA context is lost; exiting so the stage restarts: %s", exc,
                        exc_info=exc)
        logging.shutdown()
        os._exit(CUDA_ERROR_EXIT)
