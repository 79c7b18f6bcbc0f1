"""The interface a model family implements for one stage."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from omnipipe.stage.request import RequestStatus, StageRequest

if TYPE_CHECKING:
    from omnipipe.stage.tensor_parallel import StepChannel, TensorParallelGroup


class _NotRestorable:
    def __repr__(self) -> str:
        return "NOT_RESTORABLE"


NOT_RESTORABLE: Any = _NotRestorable()
"""What :meth:`StageRunner.snapshot` returns for a request whose runner state a failed step cannot be undone on."""


@dataclass
class RunnerOutput:
    """One step's result for one request."""

    request_id: str
    text_delta: str = ""
    audio: np.ndarray | None = None  # float32 mono, final audio for the user
    # an image for the user: uint8 H x W x C (C = 1 or 3); with ``progress`` it is a preview of one still being drawn
    image: np.ndarray | None = None
    # a diffusion step done: {"step": i, "steps": n}; reaches the caller as a "progress" event (or with ``image``)
    progress: dict[str, Any] | None = None
    data: dict[str, Any] | None = None  # step data for the next stage (chunk processor or forwarding)
    # structured results for the caller beside this step's text (e.g. a transcript segment's times); reaches
    # ``OmniRequestOutput.details`` where the stage's text does (its final output)
    details: dict[str, Any] | None = None
    num_units: int = 0  # tokens or frames this step produced
    # seconds of the user's playback this output carries or will become (audio samples / rate; a talker's frames at
    # the frame rate); None when the runner cannot tell. The ``deadline`` schedule serves by it
    # (``schedulers/service_order.py``)
    playback_s: float | None = None
    # where this step left the request (``RequestStatus``; the scheduler moves it there): RUNNING, it runs again
    # (decodes, takes its next input); PREFILLING (AR), its prompt is not all in the cache yet (chunked prefill, or
    # its media still being processed): another prefill step after the running requests' next decode step;
    # WAITING_FOR_CHUNK (AR), it waits outside the batch until its next input chunk arrives; WAITING_FOR_MEMORY (AR,
    # a prefill step), its KV cache does not fit what is free now: back to the head of the queue, and no request is
    # admitted until one leaves the stage; FINISHED, with ``finish_reason``; FAILED, with ``error``
    status: RequestStatus = RequestStatus.RUNNING
    finish_reason: str | None = None  # FINISHED: why ("stop", "length", "tool_calls"; None: the input ran out)
    error: str | None = None  # FAILED: this request failed (e.g. its input is too long); the rest of the batch goes on
    # with ``error``: the request's own input is at fault, and this is the field it came in (``prompt``); the
    # caller gets a FieldError naming it (HTTP 400) instead of a failure, and ``error`` is the rule it broke
    error_field: str | None = None

    def __post_init__(self) -> None:
        if self.status is RequestStatus.WAITING:
            raise ValueError("a runner output cannot put a request back to WAITING: that is the scheduler's")
        if (self.status is RequestStatus.FAILED) != (self.error is not None):
            raise ValueError(f"{self.request_id}: an output has an error exactly when its status is FAILED "
                             f"(status {self.status.name}, error {self.error!r})")
        if self.finish_reason is not None and self.status is not RequestStatus.FINISHED:
            raise ValueError(f"{self.request_id}: finish_reason {self.finish_reason!r} without FINISHED")

    @classmethod
    def failed(cls, request_id: str, error: str, error_field: str | None = None) -> RunnerOutput:
        """The output that fails ``request_id`` alone with ``error`` (a 400 naming ``error_field`` when given)."""
        return cls(request_id, status=RequestStatus.FAILED, error=error, error_field=error_field)

    @classmethod
    def decoded(cls, request_id: str, finish_reason: str | None, **fields: Any) -> RunnerOutput:
        """A decode step's output: FINISHED with ``finish_reason`` when the step gives one, else RUNNING."""
        status = RequestStatus.RUNNING if finish_reason is None else RequestStatus.FINISHED
        return cls(request_id, status=status, finish_reason=finish_reason, **fields)

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


@dataclass
class RunnerContext:
    stage: str
    device: str
    threads: int
    max_num_seqs: int
    options: dict[str, Any]
    rank: int = 0
    world_size: int = 1
    # a tensor-parallel stage (world_size > 1): its process groups, and the channel rank 0 drives the others by
    tensor_parallel: TensorParallelGroup | None = None
    steps: StepChannel | None = None
    # how a request's multimodal inputs reach every rank (``stage/broadcast.py``): blocking, async or async_raw
    input_broadcast: str = "async_raw"
    input_broadcast_threshold_bytes: int = 256 * 1024


class StageRunner(ABC):
    """Loads a model and runs one step over a batch of requests.

    Each output's ``status`` says where the step left its request; the scheduler moves the request there.
    AR stages: ``execute(batch)`` is called with newly admitted requests or with the running batch; the runner goes
    by each request's own ``prefilled`` (the scheduler's phase is its own business): a request not prefilled yet
    reads ``request.take_all_inputs()`` and builds its cache, one prefilled takes a decode step
    (``stage/batched_decoder.py``). A prefill may take several steps (``PREFILLING``: decode steps of
    the others run between them) or wait for KV memory (``WAITING_FOR_MEMORY``); a request that has read all its
    input waits for more (``WAITING_FOR_CHUNK``).
    Generation stages: ``execute(batch)``; each request has at least one input chunk, take one with
    ``request.take_input()`` and return its result; the scheduler finishes a request once its input is exhausted.
    Diffusion stages: ``execute(batch)`` is one denoising step for every request of the batch, each at its
    own step; a request new to the batch has ``runner_state is None`` and all its input ready
    (``request.take_all_inputs()``); return ``FINISHED`` with the image at its last step.

    A problem with one request should fail that request alone: reject unusable params in :meth:`validate` (the
    stage fails the request when it arrives, before it shares a batch), or return ``RunnerOutput.failed(...)`` for
    it. If ``execute`` raises on a batch of several, the stage retries its members one by one so that only the
    culprit fails; :meth:`snapshot` and :meth:`restore` let it undo what the failed call did to each member's
    runner state first (the stage itself restores the request's inputs, ``consumed_inputs`` and ``prefilled``).
    """

    # True for a runner that can shard its model over ``context.world_size`` ranks: rank 0 runs the stage loop
    # and drives the others through ``context.steps``; the others run :meth:`follow`
    supports_tensor_parallel = False
    # a runner that takes audio streamed in before its request (:meth:`append_audio`): how many streams it keeps
    # open and how many seconds each may hold (reported in StageReady; the engine refuses appends beyond them, and
    # appends for a stage whose runner takes none)
    max_audio_streams = 0
    max_audio_stream_s = 0.0

    def __init__(self, context: RunnerContext) -> None:
        self.context = context

    @abstractmethod
    def load(self) -> None:
        """Load weights. Called once in the stage process before it reports ready."""

    @abstractmethod
    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        """Run one step for every request of ``batch``; return one output per request, in order."""

    def follow(self) -> None:
        """Ranks 1..N-1 of a tensor-parallel stage: run what rank 0 sends through ``context.steps`` until it says
        stop. Only for a runner with ``supports_tensor_parallel``."""
        raise NotImplementedError(f"{type(self).__name__} does not support tensor parallelism")

    def admit(self, request: StageRequest) -> None:  # noqa: B027 - an optional hook
        """Called once when a request is accepted by the stage, before it is scheduled (e.g. to start moving its
        inputs to the other ranks while other requests run)."""

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Release what the runner holds beyond per-request state (threads, process groups' users); called once
        when the stage stops."""

    def memory_stats(self) -> dict[str, int] | None:
        """What the runner's KV cache holds (``stage/batched_decoder.py``: its blocks, those reserved, the tokens
        used), for /debug/state and metrics; None for a runner without one."""
        return None

    def warmup(self) -> None:  # noqa: B027 - an optional hook
        """Run the model once on a dummy input so the first real request does not pay one-time costs."""

    def validate(self, params: dict[str, Any]) -> str | None:
        """Check a request's params for this stage when it arrives: an error message fails that request alone
        (before it can share a batch with others), None accepts it. Raise ``FieldError`` (field as the caller
        named it, e.g. ``sampling_params.extra.width``) when the caller's value is at fault: they get a 400."""
        return None

    def snapshot(self, request: StageRequest) -> Any:
        """Taken before a batched step: what :meth:`restore` needs to put this runner's state for ``request``
        back as it was, should the step raise and the batch be retried one request at a time.

        Return ``NOT_RESTORABLE`` when a failed step cannot be undone for ``request``; the stage then fails it
        with the batch rather than retry it on half-advanced state (which would silently give wrong output). The
        default covers a request without runner state yet (a prefill, or a stateless generation stage):
        :meth:`restore` frees whatever the failed step built. A runner that keeps state across steps must
        override both methods to have its requests retried (see the toy thinker)."""
        return None if request.runner_state is None else NOT_RESTORABLE

    def restore(self, request: StageRequest, snapshot: Any) -> None:
        """Undo what a failed batched step did to this runner's state for ``request``, given :meth:`snapshot`'s
        value from before the step (never ``NOT_RESTORABLE``)."""
        self.free(request)

    def free(self, request: StageRequest) -> None:
        """Drop whatever per-request state (KV cache, buffers) the runner holds for ``request``."""
        request.runner_state = None

    def end_session(self, session_id: str) -> None:  # noqa: B027 - an optional hook
        """The caller ended a session (``AsyncOmni.end_session``): drop what the runner keeps across that session's
        requests (e.g. a conversation's KV cache). Called for every session on every stage, known here or not."""

    def append_audio(self, stream_id: str, session_id: str | None, pcm16k: np.ndarray, seq: int) -> None:
        """More of the audio stream ``stream_id`` (float32 mono at 16 kHz; ``seq`` counts the stream's appends from
        0): a runner with ``max_audio_streams`` processes it as it arrives, for the request whose prompt audio is
        ``[{"stream": stream_id}]``. Called on the stage loop, in order with the requests (the same socket)."""
        raise NotImplementedError(f"{type(self).__name__} takes no audio streams")

    def drop_audio_stream(self, stream_id: str) -> None:  # noqa: B027 - an optional hook
        """Forget the audio stream ``stream_id`` (unknown: nothing to do)."""

    def woken_requests(self) -> list[str]:
        """The requests whose next input came to the runner itself since the last call, not as a chunk (audio
        appended to the stream a live session hears, or the stream's end): the stage wakes each one that waits for
        a chunk. Asked after the messages of the control socket are handled."""
        return []
