"""Deployment knobs, read from YAML and validated at start.

Every problem is reported with the file and the dotted key, e.g.
``deploy.yaml: stages.talker.max_num_seqs: must be an integer >= 1, got 0``.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import yaml

from omnipipe.config.deploy_knobs import (
    build,
    check_device_present,
    core_affinity,
    device_name,
    flag,
    free_mapping,
    integer,
    knob,
    label,
    named_sections,
    niceness,
    number,
    one_of,
    ray_resources,
    section,
    text,
)
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

    # the cores it may run on (os.sched_setaffinity); None: any
    affinity: list[int] | None = knob(core_affinity, None)
    # added to its niceness (os.nice): higher yields the cores to the other stages; 0 to 19
    nice: int = knob(niceness, 0)


@dataclass
class StageDeploy:
    device: str = knob(device_name, "cpu")
    threads: int = knob(integer(1), 1)
    max_num_seqs: int = knob(integer(1), 8)
    restart_on_failure: bool = knob(flag, True)
    # in a row: a stage that served 10 minutes after a restart has its count start over
    max_restarts: int = knob(integer(0), 3)
    # liveness (engine/liveness.py): no progress for stall_report_s is reported (/health "degraded"); past
    # stall_restart_s (None: never) the stage is killed and handled like a dead stage
    stall_report_s: float = knob(number(0.1), 5.0)
    stall_restart_s: float | None = knob(number(0.1, nullable=True), 60.0)
    # rank processes sharding the stage's model (rank 0 runs the stage loop); gloo on CPU, nccl on CUDA
    tensor_parallel_size: int = knob(integer(1), 1)
    # how a request's multimodal inputs reach every rank: blocking (rank 0 materialises and broadcasts the object
    # in its loop), async (the same on a background thread), async_raw (the raw bytes go out on a background
    # thread and every rank materialises them; inputs under input_broadcast_threshold_bytes take the async path)
    input_broadcast: str = knob(one_of(INPUT_BROADCAST_MODES), "async_raw")
    input_broadcast_threshold_bytes: int = knob(integer(0), 256 * 1024)
    # core placement and priority of the stage's processes
    cpu: CpuDeploy = knob(section(CpuDeploy, null_is_empty=True), factory=CpuDeploy)
    # placement ray: the node label it must run on (a custom resource the node offers; each rank asks for a
    # sliver of it) and the Ray resources each rank asks for (CPU, GPU, custom); both ranks of a tensor-parallel
    # stage land on one node
    node: str | None = knob(label("must be a node label (a custom resource of the Ray node)"), None)
    resources: dict[str, float] = knob(ray_resources, factory=dict)
    # the address its tcp sockets bind on; None: its node's address (Ray) or ``host``
    host: str | None = knob(text(nullable=True), None)
    options: dict[str, Any] = knob(free_mapping, factory=dict)  # runner-specific


@dataclass
class EdgeDeploy:
    relay: str | None = knob(one_of(RELAY_BACKENDS + ("local",)), None)  # defaults to relay.backend
    inline_threshold_bytes: int | None = knob(integer(0), None)  # defaults to relay.inline_threshold_bytes
    # the edge's options (its EdgeSpec.options), validated against the edge's schema
    options: dict[str, Any] = knob(free_mapping, factory=dict)


@dataclass
class RelayDeploy:
    """The relays' knobs. A knob named ``<group>_<option>`` is ``option`` of the backends ``_OPTION_GROUPS`` gives
    ``group`` (``shm_slot_bytes``: the shm relay's ``slot_bytes``), so a backend's knobs are only its fields here."""

    backend: str = knob(one_of(RELAY_BACKENDS), "shm")
    inline_threshold_bytes: int = knob(integer(0), 64 * 1024)
    shm_slot_bytes: int = knob(integer(4096), shm.DEFAULT_SLOT_BYTES)
    shm_num_slots: int = knob(integer(1), shm.DEFAULT_NUM_SLOTS)
    # mooncake (edges between hosts): each sender's pool of registered slots, and the transfer protocol
    mooncake_slot_bytes: int = knob(integer(4096), mooncake.DEFAULT_SLOT_BYTES)
    mooncake_num_slots: int = knob(integer(1), mooncake.DEFAULT_NUM_SLOTS)
    mooncake_protocol: str = knob(one_of(mooncake.PROTOCOLS), mooncake.DEFAULT_PROTOCOL)

    # gloo / nccl (transport/relay/torch_dist.py): where a sender hosts its rendezvous store, how long any wait
    # of a transfer may take, and how many unread transfers a sender holds before a put waits
    torch_dist_host: str = knob(text(), torch_dist.DEFAULT_HOST)
    torch_dist_timeout_s: float = knob(number(0.1), torch_dist.DEFAULT_TIMEOUT_S)
    torch_dist_max_pending: int = knob(integer(1), torch_dist.DEFAULT_MAX_PENDING)

    _OPTION_GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {
        "shm": ("shm",), "mooncake": ("mooncake",), "torch_dist": ("gloo", "nccl")}

    def backend_options(self) -> dict[str, dict[str, Any]]:
        """Each backend's options from its knobs: ``{"shm": {"slot_bytes": ..., "num_slots": ...}, ...}``."""
        options: dict[str, dict[str, Any]] = {}
        for group, backends in self._OPTION_GROUPS.items():
            own = {f.name[len(group) + 1:]: getattr(self, f.name) for f in fields(self)
                   if f.name.startswith(f"{group}_")}
            for backend in backends:
                options[backend] = dict(own)
        return options


@dataclass
class PlacementDeploy:
    # local: stage processes on this host; ray: Ray actors on a cluster (placement/)
    backend: str = knob(one_of(PLACEMENTS), "local")
    # ray: the cluster to join (auto, HOST:PORT, ray://...); None: start one here
    address: str | None = knob(label("must be a non-empty string or null"), None)
    # ray: the node label of the host the API process runs on (for relay choice)
    node: str | None = knob(label("must be a non-empty string or null"), None)
    # the relay of an edge whose two ends are not known to share a host
    cross_host_relay: str = knob(one_of(RELAY_BACKENDS), "mooncake")


@dataclass
class DeployConfig:
    async_chunk: bool = knob(flag, True)
    transport: str = knob(one_of(TRANSPORTS), "ipc")  # placement ray: tcp (the default there)
    # the address the API process binds its tcp sockets on (never 0.0.0.0 unless asked)
    host: str = knob(text(), "127.0.0.1")
    # tcp: CURVE keys made per run (transport/control_plane.py); none: plain
    control_plane_auth: str = knob(one_of(CONTROL_PLANE_AUTH), "curve")
    placement: PlacementDeploy = knob(section(PlacementDeploy, null_is_empty=True), factory=PlacementDeploy)
    stage_start_timeout_s: float = knob(number(1), 600.0)
    max_pending_requests: int = knob(integer(1), 1024)
    # how often every stage reports that it lives (stage/heartbeat.py)
    heartbeat_interval_s: float = knob(number(0.05), 0.5)
    relay: RelayDeploy = knob(section(RelayDeploy), factory=RelayDeploy)
    stages: dict[str, StageDeploy] = knob(named_sections(StageDeploy, "stage"), factory=dict)
    edges: dict[str, EdgeDeploy] = knob(named_sections(EdgeDeploy, "edge"), factory=dict)
    source: str = "<defaults>"  # where it was read from (no knob: not set by a file)

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
        options = self.relay.backend_options()
        for backend in LISTENING_BACKENDS:
            options.setdefault(backend, {}).setdefault("host", self.host)
        return options


def merge_settings(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` merged in: mappings key by key, everything else replaced (neither is changed)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_settings(out[key], value)
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
    merged = merge_settings(merge_settings(pipeline.default_deploy, raw), overrides or {})
    try:
        config = build(DeployConfig, merged, "", retired=_MOVED_TO_EDGE_OPTIONS)
    except FieldError as exc:
        raise _fail(origin, exc.field, exc.rule) from None
    config.source = origin
    if config.placement.backend == "ray" and "transport" not in merged:
        config.transport = "tcp"  # stages on other hosts are reached over tcp
    _validate_against_pipeline(config, pipeline, origin)
    return config


# frame knobs that once sat at the top level of a deploy file; they belong to the talker -> vocoder edge
_MOVED_TO_EDGE_OPTIONS = {
    key: f"is an option of the frame edge now: set it under edges.<edge>.options.{key} "
         f"(e.g. edges.talker->code2wav.options.{key})"
    for key in ("codec_chunk_frames", "left_context_frames", "right_context_frames", "initial_codec_chunk_frames")}


def _fail(origin: str, key: str, message: str) -> DeployConfigError:
    return DeployConfigError(f"{origin}: {key}: {message}" if key else f"{origin}: {message}")


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
        _validate_stage(config, stage.name, origin)
        merged = dict(stage.default_options)
        merged.update(config.stages[stage.name].options)
        config.stages[stage.name].options = merged
    _validate_gpu_layout(config, pipeline, origin)


def _validate_stage(config: DeployConfig, name: str, origin: str) -> None:
    """One stage's knobs against each other and against this host (its device, where it runs here)."""
    settings = config.stage(name)
    if settings.stall_report_s < 2 * config.heartbeat_interval_s:
        raise _fail(origin, f"stages.{name}.stall_report_s", f"must be at least twice heartbeat_interval_s "
                    f"({config.heartbeat_interval_s:g} s), got {settings.stall_report_s:g}")
    if settings.stall_restart_s is not None and settings.stall_restart_s <= settings.stall_report_s:
        raise _fail(origin, f"stages.{name}.stall_restart_s", f"must be above stall_report_s "
                    f"({settings.stall_report_s:g} s) or null (never), got {settings.stall_restart_s:g}")
    affinity = settings.cpu.affinity
    if affinity is not None and settings.threads > len(affinity):
        raise _fail(origin, f"stages.{name}.threads", f"{settings.threads} threads on the "
                    f"{len(affinity)} core(s) of cpu.affinity {affinity}: at most {len(affinity)}")
    if config.placement.backend == "local":  # a Ray stage's GPUs are its node's: checked where it runs
        try:
            check_device_present(settings.device, f"stages.{name}.device", settings.tensor_parallel_size)
        except FieldError as exc:
            raise _fail(origin, exc.field, exc.rule) from None


def _first_gpu(device: str) -> str | None:
    """The CUDA device a stage's rank 0 runs on (``cuda`` is ``cuda:0``), None on the CPU."""
    return None if not device.startswith("cuda") else f"cuda:{device.partition(':')[2] or 0}"


def _validate_gpu_layout(config: DeployConfig, pipeline: PipelineSpec, origin: str) -> None:
    """What a layout on GPUs can never run, refused before anything starts:

    - an nccl edge whose two ends run on one GPU (NCCL forms no group of two processes on one device) or one of
      them on the CPU; the key named is the edge's ``relay`` when it sets one, else ``relay.backend``;
    - stages of one host sharing a GPU whose ``gpu_memory_fraction`` shares add up past the whole device."""
    for spec in pipeline.edges:
        relay, _ = config.edge_relay(spec.source, spec.target)
        if relay != "nccl" or not config.same_host(spec.source, spec.target):
            continue
        ends = {name: _first_gpu(config.stage(name).device) for name in (spec.source, spec.target)}
        key = f"edges.{spec.name}.relay" if config.edges.get(spec.name, EdgeDeploy()).relay else "relay.backend"
        on_cpu = [name for name, gpu in ends.items() if gpu is None]
        if on_cpu:
            raise _fail(origin, key, f"nccl moves tensors between GPUs, and stage {on_cpu[0]} of edge {spec.name} "
                        "runs on the CPU: use shm for this edge")
        if ends[spec.source] == ends[spec.target]:
            raise _fail(origin, key, f"nccl needs the two ends of edge {spec.name} on two GPUs, and {spec.source} and "
                        f"{spec.target} both run on {ends[spec.source]}: set this edge's relay to shm "
                        f"(edges.{spec.name}.relay: shm)")
    shares: dict[tuple[str | None, str], list[tuple[str, float]]] = {}
    for stage in pipeline.stages:
        settings = config.stage(stage.name)
        gpu = _first_gpu(settings.device)
        fraction = settings.options.get("gpu_memory_fraction")
        if gpu is not None and isinstance(fraction, (int, float)) and not isinstance(fraction, bool):
            host = None if config.placement.backend == "local" else settings.node
            if config.placement.backend == "local" or host is not None:  # an unpinned Ray stage: host unknown
                shares.setdefault((host, gpu), []).append((stage.name, float(fraction)))
    for (_, gpu), taken in shares.items():
        total = sum(fraction for _, fraction in taken)
        if len(taken) > 1 and total > 1 + 1e-9:
            parts = " + ".join(f"{fraction:g} ({name})" for name, fraction in taken)
            raise _fail(origin, f"stages.{taken[-1][0]}.options.gpu_memory_fraction",
                        f"the stages on {gpu} ask for {parts} = {total:g} of its memory: their shares must add up to "
                        "at most 1")
