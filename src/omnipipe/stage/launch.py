"""Everything a stage process needs to start, sent to it as msgpack bytes (no pickled objects)."""

from __future__ import annotations

from typing import Any

import msgspec

from omnipipe.transport.control_plane import ControlKeys


class ChunkLink(msgspec.Struct, frozen=True):
    address: str | None  # the consumer stage's chunk socket; None: announced later (ChunkRoutes, tcp)
    relay: str
    inline_threshold_bytes: int
    chunk_processor: str  # dotted path
    options: dict[str, Any] = {}  # the edge's deploy options (validated, defaults filled)
    options_schema: str | None = None  # dotted path of the options dataclass the chunk processor reads


class StageLaunch(msgspec.Struct, frozen=True):
    run_id: str
    stage: str
    kind: str
    runner: str
    device: str
    threads: int
    max_num_seqs: int
    options: dict[str, Any]
    ctrl_address: str  # orchestrator PUSH (bound) -> stage PULL
    out_address: str  # stage PUSH -> orchestrator PULL (bound)
    abort_address: str  # orchestrator PUB (bound) -> stage SUB
    chunk_listen_address: str | None  # this stage's PULL for chunks, bound here (tcp://host:*: announced in StageReady)
    chunk_links: dict[str, ChunkLink]  # target stage -> link
    out_relay: str
    out_inline_threshold_bytes: int
    relay_options: dict[str, dict[str, Any]]  # backend -> its options
    log_level: str = "WARNING"
    heartbeat_interval_s: float = 0.5  # how often the stage tells the orchestrator it lives (stage/heartbeat.py)
    extra_params: str | None = None  # dotted path of the dataclass of this stage's ``SamplingParams.extra`` knobs
    aborted_request_ids: list[str] = []  # a restarted stage drops late chunks of these
    world_size: int = 1  # rank processes of this stage (tensor parallel); rank 0 holds the control sockets
    rank: int = 0  # set per process by the launcher
    # the placement gave each rank GPUs of its own, visible to it from cuda:0 (Ray sets CUDA_VISIBLE_DEVICES per
    # actor): a CUDA stage's ranks then all compute on cuda:0 of their own process (stage/device.py)
    placed_gpus: bool = False
    dist_init_address: str | None = None  # where the ranks meet to set up their process groups (tcp://host:port)
    input_broadcast: str = "async_raw"  # how multimodal inputs reach every rank (stage/broadcast.py)
    input_broadcast_threshold_bytes: int = 256 * 1024  # async_raw: smaller raw inputs take the async path
    cpu_affinity: list[int] = []  # the cores this stage's processes may use (deploy stages.<name>.cpu); []: any
    nice: int = 0  # added to the processes' niceness before the model loads
    control_keys: ControlKeys | None = None  # tcp: the run's CURVE keys (transport/control_plane.py); None: plain
    # the address this stage binds its tcp sockets on (its chunk socket, relay pools): its own host's address
    # when it runs on another host (filled by the Ray launcher); None: the one in chunk_listen_address
    host: str | None = None
    node: str | None = None  # where it runs, in words (a Ray node id), for messages and /health

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, raw: bytes) -> StageLaunch:
        return msgspec.msgpack.decode(raw, type=cls)
