"""``warm_up``: dummy requests run through a runner's own steps before the stage reports ready.

What the first steps of a stage pay once (``torch.compile`` tracing and compiling its forward for a prefill, for a
decode of one and of several rows; CUDA kernels loaded, the allocator grown) is paid here, in ``StageRunner.warmup``,
instead of inside the first real requests, where a compile can take longer than the stall watchdog allows
(``stall_restart_s``) and gets the stage killed. The requests run under the stage's own scheduler and
``StageStep``, as real ones would (a prefill each, chunked where the runner chunks, then batched steps), and are
freed after; a runner error fails the stage's start with it.

``warm_up`` runs copies of one request; ``warm_up_requests`` runs ``WarmupRequest``s that join at chosen steps and
whose inputs may come in over later steps (a talker's text streaming in from its thinker), so that a warm-up meets
the batches and call paths serving will. A runner with a prefix-cached KV cache (``kv.prefix_caching``) runs its
warm-up with that cache's prefix index off: every block the warm-up took is free again after it. ``answers_run_on``
lets a batched decoder's warm-up answers run to their ``max_tokens`` (its end tokens never sampled) and feed its
prompts in smaller pieces; ``tiny_image`` and ``short_audio`` are media for a multimodal warm-up prompt.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner
from omnipipe.stage.schedulers import scheduler_for
from omnipipe.stage.step import StageStep

MAX_WARMUP_STEPS = 256  # a warm-up that has not finished by then is cut short (its requests freed)


@dataclass(frozen=True)
class WarmupRequest:
    """One dummy request of a warm-up: its first ``inputs`` and ``params``, the ``step`` it joins at, and the
    inputs that come later (``more``: (step, chunk) pairs; the last one ends its input, else its first inputs do)."""

    inputs: list[dict[str, Any]]
    params: dict[str, Any]
    step: int = 0
    more: tuple[tuple[int, dict[str, Any]], ...] = ()


def warm_up(runner: StageRunner, inputs: list[dict[str, Any]], params: dict[str, Any] | None = None, *,
            copies: int = 2, kind: str = "ar", max_steps: int = MAX_WARMUP_STEPS) -> int:
    """Run ``copies`` requests with these ``inputs`` (each its own copy) and ``params`` through ``runner`` until all
    finished (or ``max_steps``); two or more, so a batched step runs too. Returns the steps run; raises
    RuntimeError with the runner's message if a request failed."""
    requests = [WarmupRequest(inputs, dict(params or {})) for _ in range(copies)]
    return warm_up_requests(runner, requests, kind=kind, max_num_seqs=max(copies, 1), max_steps=max_steps)


def warm_up_requests(runner: StageRunner, requests: Sequence[WarmupRequest], *, kind: str = "ar",
                     max_num_seqs: int | None = None, max_steps: int = MAX_WARMUP_STEPS) -> int:
    """Run ``requests`` through ``runner`` (each joining at its step, its later inputs arriving at theirs; at most
    ``max_num_seqs`` at once, by default the stage's) until all finished (or ``max_steps``). Returns the steps run;
    raises RuntimeError with the runner's message if a request failed."""
    most = max_num_seqs or max(runner.context.max_num_seqs, 1)
    scheduler = scheduler_for(kind)(most, dict(runner.context.options))
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
    timetable = _Timetable(requests)
    steps = 0
    with _prefix_index_off(runner):
        try:
            while (live or timetable.pending) and steps < max_steps:
                for request_id, spec in timetable.joining(steps):
                    request = StageRequest(request_id, dict(spec.params), emit_final=False, emit_data=False,
                                           chunk_targets=[])
                    request.inputs.extend(copy.deepcopy(spec.inputs))
                    request.input_finished = not spec.more
                    live[request_id] = request
                    scheduler.add(request)
                    runner.admit(request)
                for request_id, chunk, last in timetable.arriving(steps):
                    if request_id in live:
                        live[request_id].inputs.append(copy.deepcopy(chunk))
                        live[request_id].input_finished = last
                        scheduler.on_input(live[request_id])
                for request in scheduler.finish_exhausted():
                    release(request.request_id)
                if scheduler.has_work():
                    step.run()
                steps += 1
        finally:
            for request_id in list(live):
                release(request_id)
    if errors:
        raise RuntimeError(f"warm-up failed: {errors[0]}")
    return steps


@contextlib.contextmanager
def _prefix_index_off(runner: StageRunner) -> Iterator[None]:
    """While inside: ``runner``'s KV cache (if it has one with a prefix index) indexes nothing, so every block a
    request held goes back free when it is released."""
    kv = getattr(runner, "kv", None)
    if kv is None or not getattr(kv, "prefix_caching", False):
        yield
        return
    kv.prefix_caching = False
    try:
        yield
    finally:
        kv.prefix_caching = True


class _Timetable:
    """A warm-up's requests that have not joined yet and the inputs that have not arrived yet, by step."""

    def __init__(self, requests: Sequence[WarmupRequest]) -> None:
        self.pending = sorted(enumerate(requests), key=lambda numbered: numbered[1].step)
        self.later: list[tuple[int, str, dict[str, Any], bool]] = []  # (step, request id, chunk, whether the last)

    def joining(self, step: int) -> list[tuple[str, WarmupRequest]]:
        """The requests joining by ``step``, each with its id."""
        joined = []
        while self.pending and self.pending[0][1].step <= step:
            index, spec = self.pending.pop(0)
            request_id = f"warmup-{index}"
            self.later += [(at, request_id, chunk, number == len(spec.more) - 1)
                           for number, (at, chunk) in enumerate(spec.more)]
            joined.append((request_id, spec))
        return joined

    def arriving(self, step: int) -> list[tuple[str, dict[str, Any], bool]]:
        """The inputs arriving by ``step``: (request id, chunk, whether it is the request's last)."""
        due = [item for item in self.later if item[0] <= step]
        self.later = [item for item in self.later if item[0] > step]
        return [(request_id, chunk, last) for _, request_id, chunk, last in due]


@contextlib.contextmanager
def answers_run_on(runner: Any, end_tokens: Iterable[int], prefill_chunk_tokens: int | None = None) -> Iterator[None]:
    """While inside: the batched decoder ``runner`` (``stage/batched_decoder.py``) never samples ``end_tokens``, so
    every answer runs to its ``max_tokens`` and crosses the KV blocks a warm-up asks of it, and (if given) feeds at
    most ``prefill_chunk_tokens`` prompt tokens a step."""
    suppress, options = runner.suppress, runner.options
    runner.suppress = sorted({*(int(token) for token in suppress), *(int(token) for token in end_tokens)})
    if prefill_chunk_tokens is not None:
        runner.options = dataclasses.replace(options, prefill_chunk_tokens=max(1, prefill_chunk_tokens))
    try:
        yield
    finally:
        runner.suppress, runner.options = suppress, options


def warm_up_talker(runner: Any, handoffs: Callable[..., tuple[dict[str, Any], list[dict[str, Any]]]],
                   end_codes: Iterable[int]) -> None:
    """A talker's warm-up: three requests whose thinker hand-offs ``handoffs(prompt_tokens, reply_tokens,
    whole=False)`` makes (the first chunk, and the reply's chunks to stream after it): one whose reply streams in a
    chunk a step, decoded alone and across three KV blocks; one with a prompt two blocks longer and its whole reply
    at once joining at step 3; one streaming joining at step 5; so prefills and decodes of one and of several rows
    run at more than one KV width. No end code is sampled (``answers_run_on``): each runs to its ``max_tokens``."""
    block = runner.kv.block_tokens
    first, streamed = handoffs(6, block)
    whole, _ = handoffs(6 + 2 * block, block, whole=True)  # a prompt two KV blocks longer
    greedy = {"temperature": 0.0}
    requests = [
        WarmupRequest([first], {**greedy, "max_tokens": 3 * block},
                      more=tuple((1 + index, chunk) for index, chunk in enumerate(streamed))),
        WarmupRequest([whole], {**greedy, "max_tokens": 4}, step=3),
        WarmupRequest([first], {**greedy, "max_tokens": block + 2}, step=5,
                      more=tuple((6 + index, chunk) for index, chunk in enumerate(streamed)))]
    with answers_run_on(runner, end_codes):
        warm_up_requests(runner, requests)


def tiny_image(side: int = 32) -> np.ndarray:
    """A ``side`` x ``side`` RGB image (uint8, a gradient): a multimodal warm-up prompt's picture."""
    ramp = np.linspace(0, 255, side).astype(np.uint8)
    image = np.full((side, side, 3), 128, dtype=np.uint8)
    image[..., 0], image[..., 1] = ramp[:, None], ramp[None, :]
    return image


def short_audio(seconds: float = 0.5, sample_rate: int = 16000) -> np.ndarray:
    """A quiet tone of ``seconds`` (float32 mono at ``sample_rate``): a multimodal warm-up prompt's clip."""
    return (0.1 * np.sin(np.arange(int(seconds * sample_rate)) / 20)).astype(np.float32)
