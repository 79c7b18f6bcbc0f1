"""AsyncOmni: the asynchronous, streaming API.

    async with AsyncOmni(pipeline="default") as engine:
        async for out in engine.generate("Hello?", output_modalities=["text", "audio"]):
            ...

The engine hands each event to this loop, which puts it in its request's queue (no task in between); ``generate``
reads its own queue and yields ``OmniRequestOutput``s until the request finishes. Leaving the loop early (break,
cancellation, a disconnected client) aborts the request in every stage.

A conversation's requests may name their session (``generate(..., session_id=...)``): a stage may keep state for it
between them (the default thinker keeps the conversation's KV cache, so a turn prefills only its new tokens) until
``end_session(session_id)`` or memory pressure drops it.

Audio may stream in while the user speaks (``append_audio(stream_id, pcm16k)``, float32 at 16 kHz), processed by the
stage that hears it as it arrives; a request then names it as its audio, ``{"audio": [{"stream": stream_id}]}``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from omnipipe.api.metrics import RequestClock
from omnipipe.api.outputs import OmniRequestOutput
from omnipipe.api.prompt import normalize_prompt
from omnipipe.api.sampling_params import SamplingParams
from omnipipe.config.deploy_config import DeployConfig, load_deploy
from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.engine.async_omni_engine import AsyncOmniEngine
from omnipipe.engine.events import AddRequest, EngineEvent
from omnipipe.engine.liveness import EngineHealth
from omnipipe.models.registry import get_pipeline
from omnipipe.util.field_error import FieldError
from omnipipe.util.options import options_from_dict

logger = logging.getLogger(__name__)

MAX_ID_CHARS = 256  # request and session ids


class RequestFailedError(RuntimeError):
    """A request ended with an error (a stage failed or died); the message names the stage."""


class StageLostError(RequestFailedError):
    """A request failed because a stage it needed died or was killed (not because of the request): the stage is
    restarted, so the same request sent again may succeed."""


class EngineClosedError(RuntimeError):
    """The AsyncOmni has been shut down; it takes no more requests."""


@dataclass
class _ClientRequest:
    request_id: str
    internal_id: str
    queue: asyncio.Queue[EngineEvent] = field(default_factory=asyncio.Queue)


class AsyncOmni:
    def __init__(self, pipeline: str | PipelineSpec = "default",
                 deploy: str | Path | dict[str, Any] | DeployConfig | None = None, *, log_level: str = "WARNING",
                 progress: Callable[[str], None] | None = None) -> None:
        """``progress`` is called with a line of text as start-up goes (each stage as it becomes ready, "stopping
        stages..." when start-up is cancelled); without it those lines are logged at INFO."""
        self.pipeline = get_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
        self.deploy = load_deploy(deploy, self.pipeline)
        self.engine = AsyncOmniEngine(self.pipeline, self.deploy, self._dispatch, log_level=log_level,
                                      progress=progress)
        self._requests: dict[str, _ClientRequest] = {}  # by internal id
        self._user_ids: dict[str, str] = {}  # user id -> internal id
        self._start_lock = asyncio.Lock()
        self._started = False
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> AsyncOmni:
        async with self._start_lock:
            if self._closed:
                raise EngineClosedError("this AsyncOmni has been shut down")
            if not self._started:
                await self.engine.start()
                self._started = True
        return self

    async def __aenter__(self) -> AsyncOmni:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.engine.shutdown()
        for state in self._requests.values():
            state.queue.put_nowait(EngineEvent(state.internal_id, "error", "", error="engine shut down"))

    def kill_now(self) -> None:
        """Kill every stage process at once and remove the run's files, without waiting for anything: for a
        process about to exit (a second Ctrl-C). Safe from a signal handler or another thread."""
        self.engine.kill_now()

    # ------------------------------------------------------------------ API
    async def generate(
        self,
        prompt: Any,
        request_id: str | None = None,
        sampling_params: SamplingParams | dict[str, SamplingParams] | None = None,
        output_modalities: list[str] | None = None,
        edge_options: dict[str, dict[str, Any]] | None = None,
        session_id: str | None = None,
    ) -> AsyncIterator[OmniRequestOutput]:
        """Stream one request's outputs. Raises FieldError (a ValueError naming the argument) for bad arguments,
        also when a stage finds the input unusable (e.g. ``prompt``: too long, or spoken audio with no speech in
        it), RequestFailedError on failure.

        ``edge_options``: per-request overrides of an edge's deploy options, by edge name, e.g.
        ``{"talker->code2wav": {"initial_codec_chunk_frames": 5}}``.

        ``session_id``: the conversation this request belongs to (a non-empty string of at most 256 characters);
        stages may keep state for it between its requests until :meth:`end_session`.
        """
        request_id = uuid.uuid4().hex if request_id is None else request_id
        _check_id("request_id", request_id)
        if session_id is not None:
            _check_id("session_id", session_id)
        if request_id in self._user_ids:
            raise FieldError("request_id", f"{request_id!r} is already running")
        modalities = (self.pipeline.output_modalities if output_modalities is None
                      else self.pipeline.check_output_modalities(output_modalities))
        params = self._params_by_stage(sampling_params)
        overrides = self._edge_options(edge_options)
        normalized = normalize_prompt(prompt, self.pipeline.input_modalities, self.pipeline.takes_history,
                                          self.pipeline.takes_tools)
        await self.start()
        entry = await asyncio.to_thread(self.engine.process_inputs, normalized)
        plan = self.pipeline.plan(entry.stage, modalities)
        internal_id = self.engine.new_internal_id(request_id)
        state = _ClientRequest(request_id, internal_id)
        clock = RequestClock()
        self.engine.add_request(AddRequest(internal_id, entry, plan, modalities, params, overrides, session_id))
        self.engine.audio_streams_taken(entry)
        self._requests[internal_id] = state
        self._user_ids[request_id] = internal_id
        text, audio_parts, sample_rate, image = "", [], None, None
        finished = False
        try:
            while True:
                event = await state.queue.get()
                if event.kind == "text":
                    if event.text_delta:  # not a details-only event
                        clock.on_text(event.num_tokens)
                    text += event.text_delta
                    yield OmniRequestOutput(request_id, event.stage, "text", text=text, text_delta=event.text_delta,
                                            num_tokens=event.num_tokens, details=event.details)
                elif event.kind == "audio":
                    chunk = np.asarray(event.audio, dtype=np.float32).reshape(-1)
                    clock.on_audio(len(chunk), event.sample_rate_hz)
                    audio_parts.append(chunk)
                    sample_rate = event.sample_rate_hz
                    yield OmniRequestOutput(request_id, event.stage, "audio", text=text, audio=chunk,
                                            sample_rate_hz=event.sample_rate_hz)
                elif event.kind == "image":
                    if event.details is None:  # the finished image (a preview has its step in details)
                        image = event.image
                    yield OmniRequestOutput(request_id, event.stage, "image", text=text, image=event.image,
                                            details=event.details)
                elif event.kind == "progress":
                    yield OmniRequestOutput(request_id, event.stage, "progress", text=text, details=event.details)
                elif event.kind in ("done", "aborted"):
                    finished = True
                    metrics = clock.finish(event.stage_metrics, event.edge_metrics, plan)
                    full_audio = np.concatenate(audio_parts) if audio_parts else None
                    reason = "abort" if event.kind == "aborted" else event.finish_reason
                    yield OmniRequestOutput(request_id, event.stage, "final", text=text, audio=full_audio,
                                            sample_rate_hz=sample_rate, image=image, finished=True,
                                            finish_reason=reason, metrics=metrics)
                    return
                elif event.kind == "error":
                    finished = True
                    if event.error_field is not None:  # a stage found the request's own input unusable
                        raise FieldError(event.error_field, event.error or "is not usable")
                    error_type = StageLostError if event.stage_lost else RequestFailedError
                    raise error_type(f"request {request_id}: {event.error}")
        finally:
            self._requests.pop(internal_id, None)
            self._user_ids.pop(request_id, None)
            self.engine.request_done()
            if not finished:
                self.engine.abort([internal_id])

    async def abort(self, request_id: str) -> None:
        """Abort a running request in every stage. Its ``generate`` ends with a final output (``finished``,
        ``finish_reason="abort"``) holding the text and audio produced until then; nothing more follows."""
        internal_id = self._user_ids.get(request_id)
        if internal_id is None:
            return
        self.engine.abort([internal_id])
        state = self._requests.get(internal_id)
        if state is not None:
            state.queue.put_nowait(EngineEvent(internal_id, "aborted", ""))

    async def end_session(self, session_id: str) -> None:
        """The session has ended: every stage drops what it keeps for it (the default thinker its KV cache, a Qwen
        thinker the session's open audio streams). Abort or finish the session's requests first: one still running
        may keep its state again when it ends (bounded by the stage's memory budget, as any session's)."""
        _check_id("session_id", session_id)
        self.engine.end_session(session_id)

    async def append_audio(self, stream_id: str, pcm16k: Any, *, session_id: str | None = None) -> None:
        """Stream audio into the pipeline while the user speaks: ``pcm16k``, float32 mono samples at 16 kHz (a 1-D
        array or anything ``np.asarray`` makes one of, in [-1, 1]), the next piece of the stream ``stream_id`` (a
        non-empty string of at most 256 characters; the first append opens it). The stage that hears the prompt's
        audio processes each piece as it comes (the Qwen-Omni thinkers: log-mel features and audio-encoder
        chunks), so a request whose prompt audio is ``[{"stream": stream_id}]`` (``multi_modal_data={"audio":
        [{"stream": stream_id}]}``, its only audio), sent after the last append, starts with that work done; it
        gives what the whole clip in the prompt gives. The request takes the stream: afterwards it is unknown.

        ``session_id``: the session the stream belongs to; :meth:`end_session` drops its open streams. Raises
        FieldError naming the argument (a bad value, more open streams or seconds of audio than the stage keeps)
        and AudioStreamsNotTakenError for a pipeline whose audio stage takes no streams."""
        _check_id("stream_id", stream_id)
        if session_id is not None:
            _check_id("session_id", session_id)
        try:
            samples = np.asarray(pcm16k, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise FieldError("pcm16k", f"must be float32 samples (a 1-D array): {exc}") from None
        if samples.ndim != 1 or samples.size == 0:
            raise FieldError("pcm16k", f"must be a non-empty 1-D array of samples, got shape {samples.shape}")
        if not np.isfinite(samples).all():
            raise FieldError("pcm16k", "has samples that are not finite (NaN or infinity)")
        await self.start()
        self.engine.append_audio(stream_id, session_id, samples)

    async def drop_audio_stream(self, stream_id: str) -> None:
        """Forget the audio stream ``stream_id`` (nothing happens for one not open): a request that names it
        afterwards fails with a FieldError naming ``prompt.multi_modal_data.audio``."""
        _check_id("stream_id", stream_id)
        self.engine.drop_audio_stream(stream_id)

    def health(self) -> EngineHealth | None:
        """Whether the engine can make progress: ``ok``, each stage's state (ok, stalled, restarting, down) with its
        heartbeat age, and the problems in words. None before ``start()``. Never waits on the engine, so it answers
        even when the engine is wedged (see docs/reliability.md)."""
        return self.engine.health()

    async def debug_state(self) -> dict[str, Any]:
        """What every stage and the orchestrator still hold (request ids, relay slots, pending chunks, pids)."""
        await self.start()
        state = await self.engine.query_state()
        state["client_requests"] = sorted(self._user_ids)
        return state

    # ------------------------------------------------------------------ internals
    def _dispatch(self, event: EngineEvent) -> None:
        """An engine event, on this loop: to its request's queue (dropped if the request has ended)."""
        state = self._requests.get(event.request_id)
        if state is not None:
            state.queue.put_nowait(event)

    def _edge_options(self, edge_options: Any) -> dict[str, dict[str, Any]]:
        """Per-request edge option overrides, each checked against the edge's options with the deploy's values."""
        if edge_options is None:
            return {}
        if not isinstance(edge_options, dict):
            raise FieldError("edge_options",
                             f"must be a dict of edge name -> options, got {type(edge_options).__name__}")
        edges = {e.name: e for e in self.pipeline.edges}
        out = {}
        for name, override in edge_options.items():
            edge = edges.get(name)
            schema = self.pipeline.edge_options_schema(edge) if edge is not None else None
            if schema is None:
                with_options = [e for e in edges if self.pipeline.edge_options_schema(edges[e]) is not None]
                raise FieldError(f"edge_options.{name}", "no such edge with options (edges with options: "
                                 f"{', '.join(with_options) or 'none'})")
            if not isinstance(override, dict):
                raise FieldError(f"edge_options.{name}", f"must be a dict, got {type(override).__name__}")
            deployed = self.deploy.edges[name].options
            options_from_dict(schema, {**deployed, **override}, f"edge_options.{name}")
            out[name] = dict(override)
        return out

    def _params_by_stage(self, sampling_params: Any) -> dict[str, dict[str, Any]]:
        if sampling_params is None:
            return {}
        if isinstance(sampling_params, SamplingParams):
            stage = self.pipeline.comprehension_stage or self.pipeline.stages[0].name
            sampling_params.validate()
            sampling_params.check_extra(self.pipeline.stage_extra_schema(stage))
            return {stage: sampling_params.to_dict()}
        if isinstance(sampling_params, dict):
            out = {}
            for stage, params in sampling_params.items():
                if stage not in self.pipeline.stage_names:
                    raise FieldError(f"sampling_params.{stage}", "no such stage (stages: "
                                     f"{', '.join(self.pipeline.stage_names)})")
                if isinstance(params, dict):
                    params = SamplingParams.from_dict(params)
                if not isinstance(params, SamplingParams):
                    raise FieldError(f"sampling_params.{stage}", f"must be SamplingParams, got {type(params).__name__}")
                params.validate()
                params.check_extra(self.pipeline.stage_extra_schema(stage))
                out[stage] = params.to_dict()
            return out
        raise FieldError("sampling_params", "must be SamplingParams or a dict of stage -> SamplingParams, "
                         f"got {type(sampling_params).__name__}")


def _check_id(name: str, value: Any) -> None:
    """A request or session id: a non-empty string of at most ``MAX_ID_CHARS`` characters."""
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS:
        raise FieldError(name, f"must be a non-empty string of at most {MAX_ID_CHARS} characters")
