"""Stage supervision: the orchestrator's watch over its stage processes, on its loop.

- a watcher per stage process (the process sentinel in the event loop): a stage that dies is noticed at once;
  its requests fail with an error naming it, its shm segments are released, and the stage is restarted (up to
  ``max_restarts`` in a row), or its parked requests fail.
- parking: a request whose plan holds a restarting stage waits here until every stage of its plan is ready.
- over tcp, a connection watch per stage: a dropped connection to its output socket may be its end.
- a watchdog (``engine/liveness.py``): from the stages' heartbeats it reports a stage that makes no progress and
  kills one stalled past its bound (then handled as a death); its tick shows that the loop itself still runs.
- ``health``: the snapshot of all that, safe to read from any thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from omnipipe.config.deploy_config import DeployConfig
from omnipipe.engine.events import AddRequest, EngineEvent
from omnipipe.engine.liveness import LOOP_STALL_S, EngineHealth, StageHealth, StageState
from omnipipe.engine.stage_client import StageClient
from omnipipe.placement import Launcher
from omnipipe.transport.relay.shm import segment_prefix, sweep_segments

logger = logging.getLogger(__name__)


RESTART_WINDOW_S = 600.0  # a stage that served this long after a restart has its max_restarts count start over


def death_message(client: StageClient, code: int | None, rank: int | None, killed_for: str | None) -> str:
    """How a stage's death is reported to the requests it fails and in the log."""
    if killed_for:
        return f"stage {client.name!r} {killed_for} and was killed"
    size = client.launch.world_size if client.launch is not None else 1
    which = f" rank {rank} (of {size})" if size > 1 else ""
    node = client.handle.node if client.handle is not None else None
    where = f" on node {node}" if node else ""
    if getattr(client.handle, "lost_connection", False):
        return f"stage {client.name!r}{where} dropped its connection to the engine (taken as its death)"
    return f"stage {client.name!r}{which}{where} died (exit code {code})"


class StageSupervisor:
    """Watches the stages of one run for the orchestrator, on its loop (``health`` from any thread)."""

    def __init__(self, clients: dict[str, StageClient], deploy: DeployConfig, launcher: Launcher, run_id: str,
                 emit: Callable[[EngineEvent], None], fail_requests_of: Callable[[str, str], None],
                 recently_ended: collections.deque[str]) -> None:
        """``clients`` is the orchestrator's own map (filled as it binds them). ``fail_requests_of(stage,
        message)`` fails the requests in flight that still need a dead stage; ``recently_ended`` holds the ids of
        requests aborted or failed lately, which a restarted stage is told to drop."""
        self.clients = clients
        self.deploy = deploy
        self.launcher = launcher
        self.run_id = run_id
        self._emit = emit
        self._fail_requests_of = fail_requests_of
        self._recently_ended = recently_ended
        self.parked: dict[str, AddRequest] = {}  # requests waiting for a restarting stage of their plan
        self.tasks: set[asyncio.Task[None]] = set()  # watchdog, connection watches, respawns
        self.stopping = False  # the engine is shutting down: deaths are expected, nothing is restarted
        self.last_tick = time.monotonic()  # the watchdog's last run: the loop is alive

    def start(self) -> None:
        """On the loop, once every stage is ready: watch each process, its connections, and the heartbeats."""
        self._spawn_task(self._watchdog(), "watchdog")
        for client in self.clients.values():
            if client.monitor is not None:
                self._spawn_task(self._connection_watch(client), f"conn-{client.name}")
            self._watch(client)

    def stop(self) -> None:
        """The engine is shutting down: stage ends from here on are not deaths."""
        self.stopping = True

    def unwatch(self, client: StageClient) -> None:
        """Stop watching ``client``'s processes (the teardown ends them)."""
        if client.handle is not None:
            with contextlib.suppress(ValueError, OSError):  # no reader left: the stage had already died
                asyncio.get_running_loop().remove_reader(client.sentinel)

    def _spawn_task(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ================================================================== parking
    def plan_ready(self, plan: list[str]) -> bool:
        return all(self.clients[name].ready.is_set() for name in plan)

    def down_in(self, plan: list[str]) -> list[str]:
        """The stages of ``plan`` that are down for good (dead and not restarted)."""
        return [name for name in plan if not self.clients[name].alive and not self.restartable(name)]

    def park(self, command: AddRequest) -> None:
        """Hold a request until the restarting stage of its plan is back."""
        self.parked[command.request_id] = command

    def unpark(self, request_id: str) -> AddRequest | None:
        return self.parked.pop(request_id, None)

    def unpark_ready(self) -> Iterator[AddRequest]:
        """The parked requests whose every stage is ready again, in the order they came, each taken off the park
        when it is reached (the caller submits each before the next: one aborted or failed meanwhile is skipped)."""
        for request_id, command in list(self.parked.items()):
            if self.parked.get(request_id) is command and self.plan_ready(command.plan):
                del self.parked[request_id]
                yield command

    def _fail_parked(self, stage: str, message: str) -> None:
        for request_id, command in list(self.parked.items()):
            if stage in command.plan:
                del self.parked[request_id]
                self._emit(EngineEvent(request_id, "error", stage, error=message, stage_lost=True))

    # ================================================================== stage death
    def restartable(self, stage: str) -> bool:
        settings = self.deploy.stage(stage)
        client = self.clients[stage]
        return (settings.restart_on_failure and client.restarts_in_a_row < settings.max_restarts
                and client.start_error is None)

    def _watch(self, client: StageClient) -> None:
        asyncio.get_running_loop().add_reader(client.sentinel, self._on_exit, client)

    def _on_exit(self, client: StageClient) -> None:
        asyncio.get_running_loop().remove_reader(client.sentinel)
        if self.stopping:
            return
        code, rank = client.exit_code(), client.ended_rank()
        death = death_message(client, code, rank, client.mark_dead(RESTART_WINDOW_S))
        logger.error("%s", death)
        self._fail_requests_of(client.name, death)
        removed = sweep_segments(segment_prefix(self.run_id, client.name))
        if removed:
            logger.info("released %d shared-memory segments of stage %s", len(removed), client.name)
        if not self.restartable(client.name):
            self._fail_parked(client.name, f"{death} and is not restarted")
            return
        client.prepare_restart(list(self._recently_ended))
        logger.warning("restarting stage %s (restart %d, %d in a row)", client.name, client.restarts,
                       client.restarts_in_a_row)
        if self.launcher.quick:
            client.spawn()
            self._watch(client)
        else:  # a cluster scheduler may take a while to place it: the loop serves the others meanwhile
            self._spawn_task(self._respawn(client), f"respawn-{client.name}")

    async def _respawn(self, client: StageClient) -> None:
        try:
            await asyncio.to_thread(client.spawn)
        except Exception as exc:
            message = f"stage {client.name!r} could not be started again: {exc}"
            client.mark_start_failed(message)
            logger.error("%s", message)
            self._fail_parked(client.name, message)
            return
        if self.stopping:
            return  # the teardown stops it with the others
        self._watch(client)

    async def _connection_watch(self, client: StageClient) -> None:
        """Connections to ``client``'s output socket: a drop of one accepted since the stage last started (its
        process may have ended, on whatever host) is handed to the stage's handle, which checks and may take it
        as the end at once."""
        assert client.monitor is not None
        while True:
            event = parse_monitor_message(await client.monitor.recv_multipart())
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:  # the value is the connection's fd (any peer: the handle checks)
                client.connection_accepted(fd)
            elif event["event"] == zmq.EVENT_DISCONNECTED and not self.stopping:
                client.connection_dropped(fd)

    # ================================================================== liveness
    async def _watchdog(self) -> None:
        """Every half heartbeat interval: note that the loop runs, and judge each ready stage's progress."""
        period = self.deploy.heartbeat_interval_s / 2
        while True:
            now = time.monotonic()
            late = now - self.last_tick > period + self.deploy.heartbeat_interval_s
            self.last_tick = now
            # a late tick means the loop was held up, and with it the reading of every beat: judge next round,
            # once the beats that waited in the sockets have been read
            if not late:
                for client in self.clients.values():
                    if client.alive and client.ready.is_set():
                        self._judge(client, now)
            await asyncio.sleep(period)

    def _judge(self, client: StageClient, now: float) -> None:
        liveness = client.liveness
        verdict = liveness.check(now)
        idle_for = liveness.no_progress_s(now)
        how = f"in one step for {liveness.step_s:.1f} s" if liveness.step_s > 0 else "silent"
        if verdict == "newly_stalled":
            logger.warning("stage %s has made no progress for %.1f s (%s; stall_report_s %g)", client.name,
                           idle_for, how, liveness.report_s)
        elif verdict == "recovered":
            logger.warning("stage %s is making progress again", client.name)
        elif verdict == "restart" and client.handle is not None:
            reason = f"made no progress for {idle_for:.1f} s (stall_restart_s {liveness.restart_s:g})"
            logger.error("stage %s %s; killing it", client.name, reason)
            client.kill_stalled(reason)

    def health(self, loop_running: bool) -> EngineHealth:
        """Whether the engine can make progress; safe to call from any thread (reads, never waits on the loop).
        ``loop_running``: whether the orchestrator's thread still runs."""
        now = time.monotonic()
        problems: list[str] = []
        loop_age = now - self.last_tick
        if not loop_running:
            problems.append("the engine loop has stopped")
        elif loop_age > max(LOOP_STALL_S, 2 * self.deploy.heartbeat_interval_s):
            problems.append(f"the engine loop has not run for {loop_age:.1f} s")
        stages: dict[str, StageHealth] = {}
        for name, client in list(self.clients.items()):
            liveness = client.liveness
            up = client.alive and client.ready.is_set()
            idle_for = liveness.no_progress_s(now) if up else None
            state: StageState
            problem: str | None
            if not client.alive:
                state, problem = "down", f"stage {name!r} is down (restarts used: {client.restarts})"
            elif not client.ready.is_set():
                state, problem = "restarting", f"stage {name!r} is restarting (restart {client.restarts})"
            elif liveness.stalled_since is not None:
                state, problem = "stalled", f"stage {name!r} has made no progress for {idle_for:.1f} s"
            else:
                state, problem = "ok", None
            if problem:
                problems.append(problem)
            stages[name] = StageHealth(state, client.pid if client.alive else None, client.restarts,
                                       now - liveness.last_beat if up else None, idle_for, liveness.stalls, problem)
        return EngineHealth(not problems, loop_age, stages, problems)
