"""Messages between the engine proxy and the orchestrator thread (same process: plain objects)."""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnipipe.config.pipeline_spec import EntryInput


@dataclass
class AddRequest:
    request_id: str  # internal, unique for the engine's life
    entry: EntryInput
    plan: list[str]
    modalities: list[str]
    params: dict[str, dict[str, Any]]  # stage -> sampling params dict
    edge_options: dict[str, dict[str, Any]]  # edge name -> per-request overrides of its deploy options
    session_id: str | None = None  # the conversation it belongs to: stages may keep state for it between requests


@dataclass
class AbortRequests:
    request_ids: list[str]


@dataclass
class EndSession:
    """The caller ended a session: every stage drops what it keeps for it."""

    session_id: str


@dataclass
class AppendAudio:
    """More of an audio stream, for ``stage`` (the pipeline's audio entry stage): float32 16 kHz mono as bytes."""

    stage: str
    stream_id: str
    session_id: str | None
    pcm: bytes
    seq: int


@dataclass
class DropAudio:
    """Forget an audio stream at ``stage``."""

    stage: str
    stream_id: str


@dataclass
class QueryState:
    result: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass
class ShutdownEngine:
    """Abort every request, stop the stages and end the orchestrator thread."""


@dataclass
class EngineEvent:
    """Orchestrator -> caller: something happened to a request."""

    request_id: str
    kind: str  # "text" | "audio" | "image" | "progress" | "done" | "error" | "aborted" (by the caller's abort())
    stage: str
    text_delta: str = ""
    num_tokens: int = 0
    details: dict[str, Any] | None = None  # the stage's structured results beside the text (RunnerOutput.details),
    # or an image's / a progress event's {"step", "steps"} (RunnerOutput.progress)
    audio: np.ndarray | None = None
    sample_rate_hz: int | None = None
    image: np.ndarray | None = None  # uint8 H x W x C
    finish_reason: str | None = None
    error: str | None = None
    error_field: str | None = None  # the request's input is at fault, in this field; ``error`` is the rule it broke
    stage_lost: bool = False  # the request failed because a stage it needed died or was killed: a retry may work
    stage_metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    edge_metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
