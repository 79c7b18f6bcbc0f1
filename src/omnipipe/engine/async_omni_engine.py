"""AsyncOmniEngine: the thin proxy between the API layer and the orchestrator thread.

Requests go to the orchestrator's loop and events come back to the caller's loop by one thread-safe call each
(``call_soon_threadsafe``: a wake-up of the other loop, no queue object between the threads). It runs input
processing (the pipeline's prompt processor: decoding media, choosing the entry stage) in the caller's process,
and starts/stops the orchestrator.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnipipe.config.deploy_config import DeployConfig
from omnipipe.config.pipeline_spec import EntryInput, PipelineSpec
from omnipipe.engine.events import (
    AbortRequests,
    AddRequest,
    AppendAudio,
    DropAudio,
    EndSession,
    EngineEvent,
    QueryState,
    ShutdownEngine,
)
from omnipipe.engine.liveness import EngineHealth
from omnipipe.engine.orchestrator import Orchestrator
from omnipipe.engine.startup import EngineStartError
from omnipipe.stage.schedulers import SCHEDULERS, has_scheduler
from omnipipe.util.dotted import resolve
from omnipipe.util.field_error import FieldError

logger = logging.getLogger(__name__)


class EngineOverloadedError(RuntimeError):
    """The engine already holds ``max_pending_requests`` requests."""


class AudioStreamsNotTakenError(RuntimeError):
    """The pipeline's audio entry stage takes no audio streams (its runner has no ``max_audio_streams``)."""


@dataclass
class _AudioStream:
    """An open audio stream as the engine counts it: its session, appends sent and samples."""

    session_id: str | None
    appends: int = 0
    samples: int = 0


def stream_ids(entry: EntryInput) -> list[str]:
    """The audio streams an entry input names (``{"stream": id}`` items of its ``audios``)."""
    audios = entry.data.get("audios") if isinstance(entry.data, dict) else None
    return [item["stream"] for item in audios or [] if isinstance(item, dict) and isinstance(item.get("stream"), str)]


def check_stage_kinds(pipeline: PipelineSpec) -> None:
    """Refuse a pipeline with a stage whose kind no scheduler serves, before any process starts."""
    for stage in pipeline.stages:
        if not has_scheduler(stage.kind):
            raise EngineStartError(
                f"pipeline {pipeline.name!r}: stage {stage.name!r} has kind {stage.kind!r}, which no scheduler "
                f"serves yet (kinds served: {', '.join(sorted(SCHEDULERS))})")


class AsyncOmniEngine:
    def __init__(self, pipeline: PipelineSpec, deploy: DeployConfig, on_event: Callable[[EngineEvent], None],
                 log_level: str = "WARNING", progress: Callable[[str], None] | None = None) -> None:
        """``on_event`` takes each event on the caller's loop (the loop that called ``start``) as it arrives."""
        check_stage_kinds(pipeline)
        self.pipeline = pipeline
        self.deploy = deploy
        self.run_id = f"{os.getpid():x}{uuid.uuid4().hex[:6]}"
        self._prompt_processor = resolve(pipeline.prompt_processor)
        self._ids = itertools.count(1)
        self.on_event = on_event
        self.orchestrator: Orchestrator | None = None
        self.log_level = log_level
        self.progress = progress
        self.in_flight = 0
        self.audio_streams: dict[str, _AudioStream] = {}  # open streams, until a request takes one or it is dropped

    async def start(self) -> None:
        """Start the orchestrator (blocks until stages load); its events reach this loop."""
        loop = asyncio.get_running_loop()

        def emit(event: EngineEvent) -> None:  # on the orchestrator's thread
            with contextlib.suppress(RuntimeError):  # the caller's loop has closed: nobody is left to tell
                loop.call_soon_threadsafe(self.on_event, event)

        orchestrator = self.orchestrator = Orchestrator(self.pipeline, self.deploy, self.run_id, emit=emit,
                                                        log_level=self.log_level, progress=self.progress)
        starting = asyncio.ensure_future(asyncio.to_thread(orchestrator.start))
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:  # e.g. Ctrl-C while the stages load: stop them now, not once they have loaded
            if self.progress is not None:
                self.progress("stopping stages...")
            orchestrator.cancel_start()
            await asyncio.gather(starting, return_exceptions=True)
            self.orchestrator = None
            if orchestrator.is_alive:  # it had started after all
                orchestrator.submit(ShutdownEngine())
                await asyncio.to_thread(orchestrator.join)
            raise

    def kill_now(self) -> None:
        """Kill every stage at once and remove the run's files, from any thread (the process is about to exit)."""
        if self.orchestrator is not None:
            self.orchestrator.kill_now()

    def new_internal_id(self, request_id: str) -> str:
        return f"{next(self._ids):x}.{request_id}"

    def process_inputs(self, prompt: Any) -> EntryInput:
        """Run the pipeline's prompt processor (may decode audio/images: call off the event loop)."""
        entry = self._prompt_processor(prompt)
        if not isinstance(entry, EntryInput):
            raise TypeError(f"{self.pipeline.prompt_processor} returned {type(entry).__name__}, not EntryInput")
        return entry

    def add_request(self, command: AddRequest) -> None:
        assert self.orchestrator is not None
        if self.in_flight >= self.deploy.max_pending_requests:
            raise EngineOverloadedError(
                f"the engine is at its admission limit of {self.deploy.max_pending_requests} requests "
                "(max_pending_requests); retry later")
        self.in_flight += 1
        self.orchestrator.submit(command)

    def request_done(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)

    def abort(self, request_ids: list[str]) -> None:
        if self.orchestrator is not None and self.orchestrator.is_alive:
            self.orchestrator.submit(AbortRequests(request_ids))

    def end_session(self, session_id: str) -> None:
        """Have every stage drop what it keeps for ``session_id`` (after any abort submitted before this call),
        the session's audio streams included (each dropped on the socket its appends took, so after them all)."""
        for stream_id in [key for key, stream in self.audio_streams.items() if stream.session_id == session_id]:
            self.drop_audio_stream(stream_id)
        if self.orchestrator is not None and self.orchestrator.is_alive:
            self.orchestrator.submit(EndSession(session_id))

    # ------------------------------------------------------------------ audio streams
    @property
    def audio_stage(self) -> str:
        """The stage a prompt's audio goes to: the comprehension stage (the first stage without one)."""
        return self.pipeline.comprehension_stage or self.pipeline.stages[0].name

    def append_audio(self, stream_id: str, session_id: str | None, pcm: np.ndarray) -> None:
        """Send ``pcm`` (float32 mono at 16 kHz, checked by the caller) to the audio stage's stream ``stream_id``,
        within the stage's limits (FieldError naming the argument beyond them)."""
        assert self.orchestrator is not None
        stage = self.audio_stage
        client = self.orchestrator.clients[stage]
        if not client.max_audio_streams:
            raise AudioStreamsNotTakenError(
                f"pipeline {self.pipeline.name!r}: its audio stage {stage!r} ({self.pipeline.stage(stage).runner}) "
                "takes no audio streams; give the whole clip in the prompt instead")
        stream = self.audio_streams.get(stream_id)
        if stream is None:
            if len(self.audio_streams) >= client.max_audio_streams:
                raise FieldError("stream_id", f"stage {stage!r} keeps at most {client.max_audio_streams} open audio "
                                              "stream(s), and that many are open: use or drop one first")
            stream = _AudioStream(session_id)
        elif stream.session_id != session_id:
            raise FieldError("session_id", f"stream {stream_id!r} belongs to session {stream.session_id!r}")
        if stream.samples + len(pcm) > client.max_audio_stream_s * 16_000:
            raise FieldError("pcm16k", f"stream {stream_id!r} would be longer than {client.max_audio_stream_s:g} s, "
                                       f"the most stage {stage!r} takes")
        self.audio_streams[stream_id] = stream
        self.orchestrator.submit(AppendAudio(stage, stream_id, session_id, pcm.tobytes(), stream.appends))
        stream.appends += 1
        stream.samples += len(pcm)

    def drop_audio_stream(self, stream_id: str) -> None:
        """Forget the stream here and at its stage (one the stage does not hold: nothing happens there)."""
        self.audio_streams.pop(stream_id, None)
        if self.orchestrator is not None and self.orchestrator.is_alive:
            self.orchestrator.submit(DropAudio(self.audio_stage, stream_id))

    def audio_streams_taken(self, entry: EntryInput) -> None:
        """A request added with ``entry`` takes the streams it names at its stage: they are no longer open."""
        for stream_id in stream_ids(entry):
            self.audio_streams.pop(stream_id, None)

    def health(self) -> EngineHealth | None:
        """Whether the engine can make progress (None before it has started); never waits on the engine."""
        return self.orchestrator.health() if self.orchestrator is not None else None

    async def query_state(self, timeout_s: float = 15.0) -> dict[str, Any]:
        """What the orchestrator and every stage hold; raises TimeoutError if the engine loop does not answer."""
        assert self.orchestrator is not None
        command = QueryState()
        self.orchestrator.submit(command)
        return await asyncio.wait_for(asyncio.wrap_future(command.result), timeout_s)

    async def shutdown(self) -> None:
        if self.orchestrator is None:
            return
        orchestrator, self.orchestrator = self.orchestrator, None
        if orchestrator.is_alive:
            orchestrator.submit(ShutdownEngine())
        await asyncio.to_thread(orchestrator.join)
