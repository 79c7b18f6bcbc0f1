"""Stages as Ray actors: each rank of a stage is one actor on the node Ray picks for it (``stages.<name>.node`` /
``resources``), and the actor runs the same stage process the local launcher runs, as its child.

Why a child and not the stage loop inside the actor: the stage process is the unit the rest of the engine knows
(its own interpreter, signal handling, ``os._exit`` on a fatal error), and the local and Ray paths then share every
line of it. The child is started by one long-lived thread of the actor with ``PR_SET_PDEATHSIG``, so it dies with
its actor: ``ray.kill`` of the actor, the actor's worker crashing or its node going away all end the stage.

Death is seen through the actor call that waits for the child: it returns the child's exit code, or raises when
the actor died; a watcher thread turns the first of those into a readable byte on the handle's ``sentinel``, which
the orchestrator's loop watches as it watches a local process's pidfd. Both ranks of a tensor-parallel stage are
placed together by a STRICT_PACK placement group (their process group meets on their node).

Ray must not be imported before ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set on a loopback cluster (it waits for
the GCS otherwise), so this module imports it only in ``_ray()``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any

import msgspec

from omnipipe.placement.launcher import Launcher, StageHandle
from omnipipe.stage.launch import StageLaunch
from omnipipe.stage.tensor_parallel import free_tcp_address

logger = logging.getLogger(__name__)

NODE_SLIVER = 0.001  # how much of a node's label resource one rank asks for (a node label is a custom resource)
ACTOR_DIED_EXIT_CODE = -9  # what a rank whose actor died (killed, crashed, node gone) reports as its exit code
SCHEDULE_TIMEOUT_S = 120.0  # a stage Ray cannot place in this long fails its start with the resources it asked for
CHECK_TIMEOUT_S = 1.0  # how long a dropped connection's check waits for the stage's actor to answer
CLOSE_WAIT_S = 5.0  # how long closing a handle waits for Ray to report its actors gone
RETRY_PAUSE_S = 1.0  # between placing a stage again after its actor died while starting
_PR_SET_PDEATHSIG = 1


class _ActorLost(RuntimeError):
    """An actor of a stage died while the stage was being started."""


def _ray() -> Any:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    return ray


def connect(address: str | None) -> None:
    """Join the Ray cluster at ``address`` (auto, HOST:PORT, ray://...), or start one on this host (None), once
    per process."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=address, namespace="omnipipe", log_to_driver=False, configure_logging=False)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _StageActorImpl:
    """One rank of a stage on a Ray node: starts the stage process and reports how it ends."""

    def __init__(self) -> None:
        self._starts: queue.Queue[tuple[bytes, Future[int]]] = queue.Queue()
        self._process: subprocess.Popen[bytes] | None = None
        # the child's parent thread must live as long as the actor (PR_SET_PDEATHSIG fires when it exits)
        self._keeper = threading.Thread(target=self._keep, name="omnipipe-stage-keeper", daemon=True)
        self._keeper.start()

    def _keep(self) -> None:
        while True:
            raw, result = self._starts.get()
            try:
                process = subprocess.Popen([sys.executable, "-m", "omnipipe.stage.stage_core_proc"],
                                           stdin=subprocess.PIPE, close_fds=True, preexec_fn=_die_with_parent)
                assert process.stdin is not None
                process.stdin.write(raw)
                process.stdin.close()
                self._process = process
                result.set_result(process.pid)
            except BaseException as exc:  # reported to the caller of start()
                result.set_exception(exc)

    def where(self) -> tuple[str, str]:
        """(Ray node id, this node's address)."""
        ray = _ray()
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def free_tcp_address(self, host: str) -> str:
        """``tcp://host:port`` free on this node now (where a tensor-parallel stage's ranks meet)."""
        return free_tcp_address(host)

    def start(self, raw_launch: bytes) -> int:
        """Start the stage process with this launch spec; return its pid (on this node)."""
        result: Future[int] = Future()
        self._starts.put((raw_launch, result))
        return result.result()

    def running(self) -> bool:
        """Whether the stage process still runs."""
        return self._process is not None and self._process.poll() is None

    def wait(self) -> int:
        """Block until the stage process exits; its exit code."""
        assert self._process is not None, "start() the stage first"
        return self._process.wait()


_actor_class: Any = None


def _actor() -> Any:
    global _actor_class
    if _actor_class is None:
        # start() and wait() run at once: a threaded actor (wait blocks for the stage's whole life)
        _actor_class = _ray().remote(max_concurrency=4)(_StageActorImpl)
    return _actor_class


class RayStageHandle(StageHandle):
    """A stage's rank actors. ``pids`` are the stage processes' ids on their node (what their heartbeats carry)."""

    def __init__(self, stage: str, actors: list[Any], pids: list[int], node: str, placement_group: Any) -> None:
        ray = _ray()
        self.stage = stage
        self.actors = actors
        self._node = node
        self._pids = pids
        self._placement_group = placement_group
        self._refs = [actor.wait.remote() for actor in actors]
        self._first: tuple[int, int] | None = None
        self.lost_connection = False  # the end was a dropped connection (connection_lost), not a reported exit
        self._lock = threading.Lock()
        self._read_fd, self._write_fd = os.pipe()
        self._ray = ray
        self._watcher = threading.Thread(target=self._watch, name=f"omnipipe-ray-watch-{stage}", daemon=True)
        self._watcher.start()

    def _code(self, ref: Any) -> int:
        try:
            return int(self._ray.get(ref, timeout=5))
        except Exception:  # the actor died (killed, crashed, its node gone): no exit code of its own
            return ACTOR_DIED_EXIT_CODE

    def _watch(self) -> None:
        """On its own thread: wait for the first rank to end, note which and how, then wake the sentinel. The
        engine's loop only ever reads what this noted (no Ray call there can hold it up)."""
        ready, _ = self._ray.wait(self._refs, num_returns=1, timeout=None)
        ended = (self._refs.index(ready[0]), self._code(ready[0]))
        with self._lock:
            if self._first is None:
                self._first = ended
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # closed: nobody listens any more
            os.write(self._write_fd, b"x")

    def connection_lost(self) -> None:
        """Ray hears of a dead node only after its health checks fail (seconds), while a stage process that ended
        drops its tcp connections at once. Ask rank 0's actor (bounded by CHECK_TIMEOUT_S, on a thread) whether
        the process still runs; if it does not, or the actor does not answer, that is the stage's end: the
        actors are killed (in case it runs on, unreachable) and the sentinel fires. A dropped connection that was
        not the stage's (a peer that failed the handshake) changes nothing."""
        threading.Thread(target=self._check_after_drop, name=f"omnipipe-ray-check-{self.stage}", daemon=True).start()

    def _check_after_drop(self) -> None:
        try:
            if self._ray.get(self.actors[0].running.remote(), timeout=CHECK_TIMEOUT_S):
                return
        except Exception:  # the actor is gone or unreachable
            pass
        with self._lock:
            if self._first is not None:
                return
            self._first = (0, ACTOR_DIED_EXIT_CODE)
            self.lost_connection = True
        logger.warning("stage %s: its connection dropped and its actor says it is gone (or does not answer)",
                       self.stage)
        self.kill()
        self._wake()

    @property
    def pids(self) -> list[int]:
        return list(self._pids)

    @property
    def node(self) -> str | None:
        return self._node

    @property
    def sentinel(self) -> int:
        return self._read_fd

    def _ready(self, timeout_s: float | None, all_of_them: bool) -> list[Any]:
        ready, _ = self._ray.wait(self._refs, num_returns=len(self._refs) if all_of_them else 1,
                                  timeout=timeout_s)
        return ready

    def alive(self) -> bool:
        return self._first is None

    def exit_code(self) -> int | None:
        first = self._first
        return None if first is None else first[1]

    def ended_rank(self) -> int | None:
        first = self._first
        return None if first is None else first[0]

    def kill(self) -> None:
        for actor in self.actors:
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                logger.debug("ray.kill of a stage %s actor failed", self.stage, exc_info=True)

    def wait(self, timeout_s: float | None) -> int | None:
        if len(self._ready(timeout_s, all_of_them=True)) < len(self._refs):
            return None
        self._watcher.join(timeout=10)  # it notes the first end (at once: every rank has ended)
        return self.exit_code()

    def close(self) -> None:
        """Release the actors (their stage processes have ended, or end with them) and the placement group.
        Waits (briefly) until Ray reports the actors gone: ``ray.kill`` only sends the request, and a process
        about to exit would otherwise leave its actors to be reaped when Ray notices the driver is gone."""
        self.kill()
        self._ready(CLOSE_WAIT_S, all_of_them=True)
        if self._placement_group is not None:
            try:
                self._ray.util.remove_placement_group(self._placement_group)
            except Exception:
                logger.debug("removing stage %s's placement group failed", self.stage, exc_info=True)
            self._placement_group = None
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._read_fd = self._write_fd = -1


class RayLauncher(Launcher):
    """Places each stage's ranks as Ray actors: ``resources`` per stage (Ray resources per rank), ``nodes`` the
    node label a stage must run on, ``hosts`` the address a stage binds on (default: its node's address)."""

    name = "ray"
    quick = False  # waits for Ray to place the actors (seconds; up to schedule_timeout_s when no node fits)

    def __init__(self, address: str | None = None, resources: dict[str, dict[str, float]] | None = None,
                 nodes: dict[str, str | None] | None = None, hosts: dict[str, str | None] | None = None,
                 schedule_timeout_s: float = SCHEDULE_TIMEOUT_S) -> None:
        self.address = address
        self.resources = resources or {}
        self.nodes = nodes or {}
        self.hosts = hosts or {}
        self.schedule_timeout_s = schedule_timeout_s

    @classmethod
    def from_deploy(cls, deploy: Any) -> RayLauncher:
        if deploy is None:
            return cls()
        return cls(deploy.placement.address,
                   {name: dict(s.resources) for name, s in deploy.stages.items()},
                   {name: s.node for name, s in deploy.stages.items()},
                   {name: s.host for name, s in deploy.stages.items()})

    def _asks(self, launch: StageLaunch) -> tuple[float, float, dict[str, float]]:
        """(CPUs, GPUs, custom resources) one rank asks for."""
        asks = dict(self.resources.get(launch.stage, {}))
        node = self.nodes.get(launch.stage)
        if node is not None:
            asks[node] = max(asks.get(node, 0.0), NODE_SLIVER)
        cpus = asks.pop("CPU", 0.0)
        gpus = asks.pop("GPU", 1.0 if launch.device.startswith("cuda") else 0.0)
        return cpus, gpus, asks

    def _describe(self, launch: StageLaunch) -> str:
        cpus, gpus, custom = self._asks(launch)
        asks = {"CPU": cpus, "GPU": gpus, **custom}
        return ", ".join(f"{k}: {v:g}" for k, v in asks.items() if v) or "nothing"

    def launch(self, launch: StageLaunch) -> StageHandle:
        """Place and start the stage's ranks. An actor that dies while it starts (Ray placed it on a node that was
        going away and does not know yet) is placed again, until ``schedule_timeout_s``."""
        connect(self.address)
        deadline = time.monotonic() + self.schedule_timeout_s
        while True:
            try:
                return self._launch_once(launch)
            except _ActorLost as lost:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"stage {launch.stage!r}: its actors kept dying while they started "
                                       f"(last: {lost}); the cluster offers {_ray().cluster_resources()}") from None
                logger.warning("stage %s: an actor died while it started (%s); placing it again", launch.stage, lost)
                time.sleep(RETRY_PAUSE_S)

    def _launch_once(self, launch: StageLaunch) -> StageHandle:
        ray = _ray()
        from ray.exceptions import RayActorError
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cpus, gpus, custom = self._asks(launch)
        group = None
        actors: list[Any] = []
        try:
            if launch.world_size > 1:
                bundle = {"CPU": max(cpus, NODE_SLIVER), **({"GPU": gpus} if gpus else {}), **custom}
                group = ray.util.placement_group([bundle] * launch.world_size, strategy="STRICT_PACK")
                if not self._ready_in_time(ray, group.ready(), launch):
                    raise RuntimeError(self._unplaced(launch))
            for rank in range(launch.world_size):
                options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": gpus, "resources": custom}
                if group is not None:
                    options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                        group, placement_group_bundle_index=rank)
                actors.append(_actor().options(**options).remote())
            where = actors[0].where.remote()
            if not self._ready_in_time(ray, where, launch):
                raise RuntimeError(self._unplaced(launch))
            node_id, node_address = ray.get(where)
            host = self.hosts.get(launch.stage) or node_address
            # each rank's actor sees only the GPUs Ray gave it (CUDA_VISIBLE_DEVICES), from cuda:0 (stage/device.py)
            spec = msgspec.structs.replace(launch, host=host, node=node_id,
                                           placed_gpus=gpus > 0 and launch.device.startswith("cuda"))
            if launch.world_size > 1:
                spec = msgspec.structs.replace(spec, dist_init_address=ray.get(actors[0].free_tcp_address.remote(host)))
            pids = ray.get([actor.start.remote(msgspec.structs.replace(spec, rank=rank).encode())
                            for rank, actor in enumerate(actors)])
        except RayActorError as exc:
            self._release(ray, actors, group)
            raise _ActorLost(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc
        except BaseException:
            self._release(ray, actors, group)
            raise
        logger.info("stage %s started on Ray node %s (%s), pids %s", launch.stage, node_id, host, pids)
        return RayStageHandle(launch.stage, actors, pids, node_id, group)

    @staticmethod
    def _release(ray: Any, actors: list[Any], group: Any) -> None:
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        if group is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(group)

    def _ready_in_time(self, ray: Any, ref: Any, launch: StageLaunch) -> bool:
        ready, _ = ray.wait([ref], timeout=self.schedule_timeout_s)
        return bool(ready)

    def _unplaced(self, launch: StageLaunch) -> str:
        return (f"stage {launch.stage!r}: no Ray node could take it within {self.schedule_timeout_s:g} s "
                f"(each of its {launch.world_size} rank(s) asks for {self._describe(launch)}); "
                f"the cluster offers {_ray().cluster_resources()}")
