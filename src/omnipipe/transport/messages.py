"""Typed control-plane messages. Every message is a msgspec Struct encoded as msgpack; no pickle anywhere.

Bulky data never rides here directly: a ``Payload`` carries the tensor-free skeleton of a nested object, the
``TensorInfo`` of every tensor pulled out of it, and either the bytes themselves (``inline``) or the relay
metadata needed to fetch them.
"""

from __future__ import annotations

from typing import Any

import msgspec


class TensorInfo(msgspec.Struct, array_like=True, frozen=True):
    """Where one tensor of a payload lives in the payload's flat byte buffer."""

    path: str
    dtype: str
    shape: list[int]
    offset: int
    nbytes: int
    kind: str  # "numpy" | "torch"


class Payload(msgspec.Struct, frozen=True):
    """A nested object split into a msgpack skeleton and one flat tensor buffer."""

    skeleton: bytes
    tensors: list[TensorInfo]
    nbytes: int
    backend: str  # "inline" | "shm" | "mooncake" | "local"
    data: bytes | None = None  # inline bytes
    relay: dict[str, Any] | None = None  # backend metadata to fetch the buffer


class Submit(msgspec.Struct, tag="submit", frozen=True):
    """Orchestrator -> stage: a new request (or a prewarm registration with no input yet)."""

    request_id: str
    inputs: list[Payload]
    input_finished: bool
    params: dict[str, Any]
    emit_final: bool  # send text/audio outputs to the orchestrator
    emit_data: bool  # send step data to the orchestrator (non-async forwarding)
    chunk_targets: list[str]  # downstream stages to stream chunks to (async chunk)
    chunk_sources: list[str]  # upstream stages that stream chunks into this request (async chunk)
    edge_options: dict[str, dict[str, Any]]  # edge name -> this request's overrides of the edge's options
    session_id: str | None = None  # the conversation the request belongs to (a runner may keep state for it)


class AudioAppend(msgspec.Struct, tag="audio_append", frozen=True):
    """Orchestrator -> the entry stage, on the socket its requests come by (so a request sent after its stream's
    appends finds them all): more of the audio stream ``stream_id``, ``pcm`` float32 mono samples at 16 kHz as
    bytes; ``seq`` counts the stream's appends from 0 (a gap tells the stage appends were lost)."""

    stream_id: str
    session_id: str | None
    pcm: bytes
    seq: int


class DropAudioStream(msgspec.Struct, tag="drop_audio_stream", frozen=True):
    """Orchestrator -> the entry stage: forget the audio stream (after its appends: the same socket)."""

    stream_id: str


class ChunkRoutes(msgspec.Struct, tag="chunk_routes", frozen=True):
    """Orchestrator -> producing stage: where each consumer stage's chunk socket is bound (target -> address).

    Sent once every stage is ready (before any request) and again whenever a consumer stage comes back from a
    restart, since a tcp consumer binds a fresh port each time it starts."""

    routes: dict[str, str]


class Shutdown(msgspec.Struct, tag="shutdown", frozen=True):
    reason: str = ""


class StateQuery(msgspec.Struct, tag="state_query", frozen=True):
    """The engine asks a stage what it holds (the debug state snapshot); liveness is ``StageHeartbeat``'s."""

    nonce: int


class Abort(msgspec.Struct, tag="abort", frozen=True):
    """Broadcast over PUB/SUB to every stage."""

    request_ids: list[str]


class DropSession(msgspec.Struct, tag="drop_session", frozen=True):
    """Broadcast over PUB/SUB to every stage: the session has ended; drop what the runner keeps for it."""

    session_id: str


class ChunkReady(msgspec.Struct, tag="chunk", frozen=True):
    """Stage -> stage (async chunk): one chunk of a request is ready under ``key``."""

    key: str
    request_id: str
    from_stage: str
    to_stage: str
    chunk_id: int
    is_last: bool
    payload: Payload | None
    sent_at_s: float


class StageReady(msgspec.Struct, tag="ready", frozen=True):
    stage: str
    pid: int
    load_time_s: float
    chunk_address: str | None = None  # the address this stage's chunk socket is bound to (read back after bind)
    # the runner's audio streams (``StageRunner.max_audio_streams``, ``max_audio_stream_s``): 0 when it takes none
    max_audio_streams: int = 0
    max_audio_stream_s: float = 0.0


class StageOutput(msgspec.Struct, tag="output", frozen=True):
    """Stage -> orchestrator: one step's result for one request."""

    request_id: str
    stage: str
    finished: bool
    text_delta: str = ""
    num_tokens: int = 0
    payload: Payload | None = None  # final audio, details for the caller and/or data for forwarding
    finish_reason: str | None = None
    metrics: dict[str, Any] | None = None


class StageError(msgspec.Struct, tag="error", frozen=True):
    request_id: str
    stage: str
    message: str
    field: str | None = None  # the request's input is at fault: the field of it (``prompt``); ``message`` is the rule


class StageHeartbeat(msgspec.Struct, tag="heartbeat", frozen=True):
    """Stage -> orchestrator, every ``heartbeat_interval_s`` from a thread of its own: the process lives, and its
    current step (if one is running) has run ``step_s`` seconds. A stopped or wedged process sends none."""

    stage: str
    pid: int
    step_s: float


class StateReply(msgspec.Struct, tag="state_reply", frozen=True):
    """What a stage holds, in answer to the ``StateQuery`` with the same nonce."""

    stage: str
    nonce: int
    request_ids: list[str]
    num_running: int
    num_waiting: int
    num_waiting_for_chunk: int
    relay_slots_in_use: int
    pending_chunks: int
    # a batched AR stage's KV cache (``StageRunner.memory_stats``): blocks, blocks_reserved, tokens_used,
    # block_tokens; the default thinker's also prefix_cache_bytes (what its blocks kept for later requests hold);
    # empty for a stage without one
    kv_cache: dict[str, int] = {}


ToStage = Submit | AudioAppend | DropAudioStream | ChunkRoutes | Shutdown | StateQuery
FromStage = StageOutput | StageError | StageReady | StateReply | StageHeartbeat
Broadcast = Abort | DropSession
