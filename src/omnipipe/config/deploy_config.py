"""Deployment knobs, read from YAML and validated at start.

Every problem is reported with the file and the dotted key, e.g.
``deploy.yaml: stages.talker.max_num_seqs: must be an integer >= 1, got 0``.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.transport.relay import mooncake, shm, torch_dist
from omnipipe.transport.relay.registry import LISTENING_BACKENDS, RELAY_BACKENDS
from omnipipe.util.field_error import FieldError
from omnipipe.util.options import options_from_dict

TRANSPORTS = ("ipc", "tcp")
PLACEMENTS = ("local", "ray")  # where stages run (placement/): this host's processes, or Ray actors on a cluster
CONTROL_PLANE_AUTH = ("curve", "none")
ORCHESTRATOR = "<orchestrator>"  # the API process's end of an entry or output edge (``DeployConfig.relay_between``)
# how a tensor-parallel stage's multimodal inputs reach every rank (stage/broadcast.py)
INPUT_BROADCAST_MODES = ("blocking", "async", "async_raw")


class DeployConfigError(ValueError):
    """A deploy file or dict is invalid; the message names the file and the key."""


@dataclass
class CpuDeploy:
    """Where a stage's process runs on the host's cores (applied in the stage process before its model loads)."""

    affinity: list[int] | None = None  # the cores it may run on (os.sched_setaffinity); None: any
    nice: int = 0  # added to its niceness (os.nice): higher yields the cores to the other stages; 0 to 19


@dataclass
class StageDeploy:
    device: str = "cpu"
    threads: int = 1
    max_num_seqs: int = 8
    restart_on_failure: bool = True
    max_restarts: int = 3  # in a row: a stage that served 10 minutes after a restart has its count start over
    # liveness (engine/liveness.py): no progress for stall_report_s is reported (/health "degraded"); past
    # stall_restart_s (None: never) the stage is killed and handled like a dead stage
    stall_report_s: float = 5.0
    stall_restart_s: float | None = 60.0
    # rank processes sharding the stage's model (rank 0 runs the stage loop); gloo on CPU, nccl on CUDA
    tensor_parallel_size: int = 1
    # how a request's multimodal inputs reach every rank: blocking (rank 0 materialises and broadcasts the object
    # in its loop), async (the same on a background thread), async_raw (the raw bytes go out on a background
    # thread and every rank materialises them; inputs under input_broadcast_threshold_bytes take the async path)
    input_broadcast: str = "async_raw"
    input_broadcast_threshold_bytes: int = 256 * 1024
    cpu: CpuDeploy = field(default_factory=CpuDeploy)  # core placement and priority of the stage's processes
    # placement ray: the node label it must run on (a custom resource the node offers; each rank asks for a
    # sliver of it) and the Ray resources each rank asks for (CPU, GPU, custom); both ranks of a tensor-parallel
    # stage land on one node
    node: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    host: str | None = None  # the address its tcp sockets bind on; None: its node's address (Ray) or ``host``
    options: dict[str, Any] = field(default_factory=dict)  # runner-specific


@dataclass
class EdgeDeploy:
    relay: str | None = None  # defaults to relay.backend
    inline_threshold_bytes: int | None = None  # defaults to relay.inline_threshold_bytes
    options: dict[str, Any] = field(default_factory=dict)  # the edge's options (its EdgeSpec.options), validated


@dataclass
class RelayDeploy:
    backend: str = "shm"
    inline_threshold_bytes: int = 64 * 1024
    shm_slot_bytes: int = shm.DEFAULT_SLOT_BYTES
    shm_num_slots: int = shm.DEFAULT_NUM_SLOTS
    # mooncake (edges between hosts): each sender's pool of registered slots, and the transfer protocol
    mooncake_slot_bytes: int = mooncake.DEFAULT_SLOT_BYTES
    mooncake_num_slots: int = mooncake.DEFAULT_NUM_SLOTS
    mooncake_protocol: str = mooncake.DEFAULT_PROTOCOL

    # gloo / nccl (transport/relay/torch_dist.py): where a sender hosts its rendezvous store, how long any wait
    # of a transfer may take, and how many unread transfers a sender holds before a put waits
    torch_dist_host: str = torch_dist.DEFAULT_HOST
    torch_dist_timeout_s: float = torch_dist.DEFAULT_TIMEOUT_S
    torch_dist_max_pending: int = torch_dist.DEFAULT_MAX_PENDING


@dataclass
class PlacementDeploy:
    backend: str = "local"  # local: stage processes on this host; ray: Ray actors on a cluster (placement/)
    address: str | None = None  # ray: the cluster to join (auto, HOST:PORT, ray://...); None: start one here
    node: str | None = None  # ray: the node label of the host the API process runs on (for relay choice)
    cross_host_relay: str = "mooncake"  # the relay of an edge whose two ends are not known to share a host


@dataclass
class DeployConfig:
    async_chunk: bool = True
    transport: str = "ipc"  # placement ray: tcp (the default there)
    host: str = "127.0.0.1"  # the address the API process binds its tcp sockets on (never 0.0.0.0 unless asked)
    control_plane_auth: str = "curve"  # tcp: CURVE keys made per run (transport/control_plane.py); none: plain
    placement: PlacementDeploy = field(default_factory=PlacementDeploy)
    stage_start_timeout_s: float = 600.0
    max_pending_requests: int = 1024
    heartbeat_interval_s: float = 0.5  # how often every stage reports that it lives (stage/heartbeat.py)
    relay: RelayDeploy = field(default_factory=RelayDeploy)
    stages: dict[str, StageDeploy] = field(default_factory=dict)
    edges: dict[str, EdgeDeploy] = field(default_factory=dict)
    source: str = "<defaults>"

    def stage(self, name: str) -> StageDeploy:
        return self.stages.setdefault(name, StageDeploy())

    def edge_relay(self, source: str, target: str) -> tuple[str, int]:
        """The relay and inline threshold of edge ``source -> target``: the edge's own, else ``relay.backend``
        where both ends share a host, else ``placement.cross_host_relay``."""
        edge = self.edges.get(f"{source}->{target}", EdgeDeploy())
        threshold = edge.inline_threshold_bytes
        return edge.relay or self.relay_between(source, target), (
            self.relay.inline_threshold_bytes if threshold is None else threshold)

    def handoff_relay(self, source: str, target: str) -> str:
        """The relay of the engine's own handoff on a non-streaming edge (the API process writes the target's
        input): the edge's own, else the one between the API process and ``target``."""
        edge = self.edges.get(f"{source}->{target}", EdgeDeploy())
        return edge.relay or self.relay_between(ORCHESTRATOR, target)

    def node_of(self, stage: str) -> str | None:
        """The node label of a stage (or of the API process: ``ORCHESTRATOR``); None where not pinned."""
        return self.placement.node if stage == ORCHESTRATOR else self.stage(stage).node

    def same_host(self, a: str, b: str) -> bool:
        """Whether two stages (or a stage and ``ORCHESTRATOR``) are known to run on one host."""
        if self.placement.backend == "local":
            return True
        node_a, node_b = self.node_of(a), self.node_of(b)
        return node_a is not None and node_a == node_b

    def relay_between(self, source: str, target: str) -> str:
        """The relay for data from ``source`` to ``target`` when no edge names one."""
        return self.relay.backend if self.same_host(source, target) else self.placement.cross_host_relay

    def relay_options(self) -> dict[str, dict[str, Any]]:
        """Options per relay backend, read by that backend's factory (``host``: where a listening one binds, unless
        the backend names its own; a stage on another host replaces it with its own address)."""
        torch_dist_options = {"host": self.relay.torch_dist_host, "timeout_s": self.relay.torch_dist_timeout_s,
                              "max_pending": self.relay.torch_dist_max_pending}
        options: dict[str, dict[str, Any]] = {
            "shm": {"slot_bytes": self.relay.shm_slot_bytes, "num_slots": self.relay.shm_num_slots},
            "mooncake": {"slot_bytes": self.relay.mooncake_slot_bytes, "num_slots": self.relay.mooncake_num_slots,
                         "protocol": self.relay.mooncake_protocol},
            "gloo": dict(torch_dist_options), "nccl": dict(torch_dist_options)}
        for backend in LISTENING_BACKENDS:
            options.setdefault(backend, {}).setdefault("host", self.host)
        return options


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_deploy(
    source: str | Path | dict[str, Any] | DeployConfig | None, pipeline: PipelineSpec,
    overrides: dict[str, Any] | None = None,
) -> DeployConfig:
    """Read a deploy YAML (path), a dict or None (pipeline defaults) and validate it against ``pipeline``.
    ``overrides`` (command-line flags) are merged over the file's keys before validation."""
    if isinstance(source, DeployConfig):
        raw: dict[str, Any] = {}
        config = copy.deepcopy(source)
        _validate_against_pipeline(config, pipeline, config.source)
        return config
    origin = "<dict>"
    if source is None:
        raw = {}
        origin = f"<defaults of {pipeline.name}>"
    elif isinstance(source, dict):
        raw = source
    else:
        path = Path(source)
        origin = str(path)
        if not path.is_file():
            raise DeployConfigError(f"{origin}: deploy file not found")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise DeployConfigError(f"{origin}: not valid YAML: {exc}") from exc
        if not isinstance(raw, dict):
            raise DeployConfigError(f"{origin}: the top level must be a mapping of keys, got {type(raw).__name__}")
    merged = _merge(_merge(pipeline.default_deploy, raw), overrides or {})
    config = _build(DeployConfig, merged, origin, "")
    config.source = origin
    if config.placement.backend == "ray" and "transport" not in merged:
        config.transport = "tcp"  # stages on other hosts are reached over tcp
    _validate_against_pipeline(config, pipeline, origin)
    return config


# frame knobs that once sat at the top level of a deploy file; they belong to the talker -> vocoder edge
_MOVED_TO_EDGE_OPTIONS = ("codec_chunk_frames", "left_context_frames", "right_context_frames",
                          "initial_codec_chunk_frames")


def _fail(origin: str, key: str, message: str) -> DeployConfigError:
    return DeployConfigError(f"{origin}: {key}: {message}" if key else f"{origin}: {message}")


def _build(cls: type, raw: Any, origin: str, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise _fail(origin, prefix.rstrip("."), f"must be a mapping, got {type(raw).__name__}")
    known = {f.name: f for f in fields(cls) if f.name != "source"}
    for key in raw:
        if cls is DeployConfig and key in _MOVED_TO_EDGE_OPTIONS:
            raise _fail(origin, f"{prefix}{key}", "is an option of the frame edge now: set it under "
                        f"edges.<edge>.options.{key} (e.g. edges.talker->code2wav.options.{key})")
        if key not in known:
            raise _fail(origin, f"{prefix}{key}", f"unknown key (expected one of: {', '.join(known)})")
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        key = f"{prefix}{name}"
        kwargs[name] = _convert(cls, name, value, origin, key)
    return cls(**kwargs)


def _convert(cls: type, name: str, value: Any, origin: str, key: str) -> Any:
    if cls is DeployConfig and name == "relay":
        return _build(RelayDeploy, value, origin, f"{key}.")
    if cls is DeployConfig and name == "placement":
        return _build(PlacementDeploy, value if value is not None else {}, origin, f"{key}.")
    if cls is PlacementDeploy and name in ("address", "node"):
        if value is not None and (not isinstance(value, str) or not value):
            raise _fail(origin, key, f"must be a non-empty string or null, got {value!r}")
        return value
    if cls is PlacementDeploy and name == "backend":
        if value not in PLACEMENTS:
            raise _fail(origin, key, f"must be one of {', '.join(PLACEMENTS)}, got {value!r}")
        return value
    if cls is StageDeploy and name == "node":
        if value is not None and (not isinstance(value, str) or not value):
            raise _fail(origin, key, f"must be a node label (a custom resource of the Ray node), got {value!r}")
        return value
    if cls is StageDeploy and name == "resources":
        return _resources(value, origin, key)
    if cls is StageDeploy and name == "cpu":
        return _build(CpuDeploy, value if value is not None else {}, origin, f"{key}.")
    if cls is CpuDeploy and name == "affinity":
        return _affinity(value, origin, key)
    if cls is CpuDeploy and name == "nice":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 19:
            raise _fail(origin, key, f"must be an integer in [0, 19] (a stage may only lower its priority), "
                        f"got {value!r}")
        return value
    if cls is DeployConfig and name in ("stages", "edges"):
        if not isinstance(value, dict):
            raise _fail(origin, key, f"must be a mapping of {name[:-1]} name -> settings")
        item_cls = StageDeploy if name == "stages" else EdgeDeploy
        return {str(k): _build(item_cls, v if v is not None else {}, origin, f"{key}.{k}.") for k, v in value.items()}
    if name == "options":
        if not isinstance(value, dict):
            raise _fail(origin, key, "must be a mapping")
        return dict(value)
    checks: dict[str, Any] = {
        "async_chunk": bool,
        "restart_on_failure": bool,
        "transport": TRANSPORTS,
        "backend": RELAY_BACKENDS,
        "relay": RELAY_BACKENDS + ("local",),
        "cross_host_relay": RELAY_BACKENDS,
        "control_plane_auth": CONTROL_PLANE_AUTH,
        "host": str,
        "device": str,
        "threads": (int, 1),
        "max_num_seqs": (int, 1),
        "max_restarts": (int, 0),
        "inline_threshold_bytes": (int, 0),
        "shm_slot_bytes": (int, 4096),
        "shm_num_slots": (int, 1),
        "mooncake_slot_bytes": (int, 4096),
        "mooncake_num_slots": (int, 1),
        "mooncake_protocol": mooncake.PROTOCOLS,
        "torch_dist_host": str,
        "torch_dist_timeout_s": (float, 0.1),
        "torch_dist_max_pending": (int, 1),
        "max_pending_requests": (int, 1),
        "stage_start_timeout_s": (float, 1),
        "heartbeat_interval_s": (float, 0.05),
        "stall_report_s": (float, 0.1),
        "stall_restart_s": (float, 0.1),
        "tensor_parallel_size": (int, 1),
        "input_broadcast": INPUT_BROADCAST_MODES,
        "input_broadcast_threshold_bytes": (int, 0),
    }
    if name in ("stall_restart_s", "host") and value is None and cls is not DeployConfig:
        return None
    if name == "device":
        if not isinstance(value, str) or not (value == "cpu" or value.startswith("cuda")):
            raise _fail(origin, key, f'must be "cpu" or "cuda[:N]", got {value!r}')
        return value
    check = checks.get(name)
    if check is bool:
        if not isinstance(value, bool):
            raise _fail(origin, key, f"must be true or false, got {value!r}")
    elif check is str:
        if not isinstance(value, str) or not value:
            raise _fail(origin, key, f"must be a non-empty string, got {value!r}")
    elif isinstance(check, tuple) and len(check) == 2 and check[0] in (int, float):
        kind, minimum = check
        ok = isinstance(value, (int, float)) if kind is float else isinstance(value, int)
        if isinstance(value, bool) or not ok or not math.isfinite(value) or value < minimum:
            noun = "an integer" if kind is int else "a number"
            raise _fail(origin, key, f"must be {noun} >= {minimum}, got {value!r}")
        return kind(value)
    elif isinstance(check, tuple):
        if value not in check:
            raise _fail(origin, key, f"must be one of {', '.join(check)}, got {value!r}")
    return value


def _resources(value: Any, origin: str, key: str) -> dict[str, float]:
    """Ray resources a rank asks for: name -> a number >= 0 (CPU, GPU or a custom resource of the cluster)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(origin, key, f"must be a mapping of resource name -> amount, e.g. {{CPU: 1, node_b: 1}}, "
                    f"got {value!r}")
    out = {}
    for name, amount in value.items():
        if not isinstance(name, str) or not name:
            raise _fail(origin, key, f"resource names must be non-empty strings, got {name!r}")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount < 0:
            raise _fail(origin, f"{key}.{name}", f"must be a number >= 0, got {amount!r}")
        out[name] = float(amount)
    return out


def _affinity(value: Any, origin: str, key: str) -> list[int] | None:
    """A list of distinct core numbers this process may use (checked against this host's usable cores)."""
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise _fail(origin, key, f"must be a non-empty list of core numbers, e.g. [0] or [0, 1], got {value!r}")
    if any(isinstance(core, bool) or not isinstance(core, int) or core < 0 for core in value):
        raise _fail(origin, key, f"must list core numbers (integers >= 0), got {value!r}")
    if len(set(value)) != len(value):
        raise _fail(origin, key, f"lists a core twice: {value!r}")
    usable = sorted(os.sched_getaffinity(0))
    missing = [core for core in value if core not in usable]
    if missing:
        raise _fail(origin, key, f"core(s) {missing} are not usable on this host (usable: {usable})")
    return list(value)


def _validate_placement(config: DeployConfig, origin: str) -> None:
    ray = config.placement.backend == "ray"
    if ray and config.transport != "tcp":
        raise _fail(origin, "transport", f"placement ray reaches stages on other hosts over tcp; "
                    f"{config.transport} cannot (leave transport out, or set it to tcp)")
    if not ray:
        for key in ("address", "node"):
            if getattr(config.placement, key) is not None:
                raise _fail(origin, f"placement.{key}", "only means something with placement.backend: ray")
        for name, stage in config.stages.items():
            for key in ("node", "resources"):
                if getattr(stage, key):
                    raise _fail(origin, f"stages.{name}.{key}", "only means something with placement.backend: ray")


def _validate_against_pipeline(config: DeployConfig, pipeline: PipelineSpec, origin: str) -> None:
    _validate_placement(config, origin)
    for name in config.stages:
        if name not in pipeline.stage_names:
            raise _fail(origin, f"stages.{name}", f"no such stage in pipeline {pipeline.name!r} "
                        f"(stages: {', '.join(pipeline.stage_names)})")
    edge_names = [e.name for e in pipeline.edges]
    for name, edge in config.edges.items():
        if name not in edge_names:
            raise _fail(origin, f"edges.{name}", f"no such edge in pipeline {pipeline.name!r} "
                        f"(edges: {', '.join(edge_names) or 'none'})")
        spec = pipeline.edge(*name.split("->", 1))
        if edge.options and spec.options is None:
            raise _fail(origin, f"edges.{name}.options", f"edge {name} takes no options")
        if edge.relay == "local":
            raise _fail(origin, f"edges.{name}.relay", "local needs both stages in one process; "
                        "every stage runs in its own process here, use shm or inline")
    for spec in pipeline.edges:
        schema = pipeline.edge_options_schema(spec)
        if schema is None:
            continue
        edge = config.edges.setdefault(spec.name, EdgeDeploy())
        try:
            edge.options = asdict(options_from_dict(schema, edge.options, f"edges.{spec.name}.options"))
        except FieldError as exc:
            raise _fail(origin, exc.field, exc.rule) from None
    for stage in pipeline.stages:
        settings = config.stage(stage.name)
        if settings.stall_report_s < 2 * config.heartbeat_interval_s:
            raise _fail(origin, f"stages.{stage.name}.stall_report_s", f"must be at least twice heartbeat_interval_s "
                        f"({config.heartbeat_interval_s:g} s), got {settings.stall_report_s:g}")
        if settings.stall_restart_s is not None and settings.stall_restart_s <= settings.stall_report_s:
            raise _fail(origin, f"stages.{stage.name}.stall_restart_s", f"must be above stall_report_s "
                        f"({settings.stall_report_s:g} s) or null (never), got {settings.stall_restart_s:g}")
        affinity = settings.cpu.affinity
        if affinity is not None and settings.threads > len(affinity):
            raise _fail(origin, f"stages.{stage.name}.threads", f"{settings.threads} threads on the "
                        f"{len(affinity)} core(s) of cpu.affinity {affinity}: at most {len(affinity)}")
        merged = dict(stage.default_options)
        merged.update(config.stages[stage.name].options)
        config.stages[stage.name].options = merged
