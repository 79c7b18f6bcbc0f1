"""A thinker's prompt processing off the stage loop: the chat template, the tokenizer, feature extraction and video
decoding of a request run on one background thread from the moment the stage admits it, so the running requests'
decode steps go on meanwhile; the prefill takes the result when it is ready (or waits for it when nothing else
would run)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.util.field_error import FieldError

Processed = TypeVar("Processed")


class BackgroundPrompts(Generic[Processed]):
    """``process(request)`` (which reads the request's inputs without consuming them) run for each request on one
    thread; its result, or the exception it raised, is the prefill's to take."""

    def __init__(self, process: Callable[[StageRequest], Processed]) -> None:
        self._process = process
        self._pending: dict[str, Future[Processed]] = {}
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="prompt-processing")

    def start(self, request: StageRequest) -> None:
        """Begin processing ``request`` (the stage admitted it)."""
        self._pending[request.request_id] = self._thread.submit(self._process, request)

    def run(self, work: Callable[[], None]) -> None:
        """Run ``work`` on the same thread, after everything submitted before it (e.g. an audio stream's append,
        which a later request's processing then finds done); ``work`` handles its own errors."""
        self._thread.submit(work)

    def result(self, request: StageRequest, wait: bool) -> Processed | RunnerOutput:
        """The request's processed prompt; else the output its prefill returns now: ``PREFILLING`` while the
        prompt is still being made (unless ``wait``), or the request failed with the field a ``FieldError`` of the
        processing names (the caller's input: its processing is forgotten). Any other error is raised. A request
        never started (a caller driving the runner directly) is started now."""
        future = self._pending.get(request.request_id)
        if future is None:
            self.start(request)
            future = self._pending[request.request_id]
        if not future.done() and not wait:
            return RunnerOutput(request.request_id, status=RequestStatus.PREFILLING)
        try:
            return future.result()
        except FieldError as exc:  # e.g. a video file that cannot be decoded
            self.forget(request)
            return RunnerOutput.failed(request.request_id, exc.rule, exc.field)

    def forget(self, request: StageRequest) -> None:
        """Drop the request's processing (taken, failed, or the request left the stage)."""
        future = self._pending.pop(request.request_id, None)
        if future is not None:
            future.cancel()

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
