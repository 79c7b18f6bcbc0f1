"""The Orchestrator: a background thread with its own asyncio loop that drives every stage.

- request handler: takes commands off the request queue (add, abort, state query, shutdown); an add goes to the
  entry stage and, with async chunk, registers the request at once with every streaming-fed stage (prewarm).
- output handlers, one per stage: route each stage output. Text/audio of a stage the caller asked for goes to
  the output queue; step data for a non-streaming edge is gathered and, when the stage finishes the request,
  turned into the next stage's input by the edge's input processor and forwarded.
- a watcher per stage process (the process sentinel in the event loop): a stage that dies is noticed at once;
  its requests fail with an error naming it, their state is released everywhere, and the stage is restarted.
- a watchdog (``engine/liveness.py``): from the stages' heartbeats it reports a stage that makes no progress and
  kills one stalled past its bound (then handled as a death); its tick shows that this loop itself still runs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from omnipipe.config.deploy_config import ORCHESTRATOR, DeployConfig, EdgeDeploy
from omnipipe.config.pipeline_spec import EdgeSpec, PipelineSpec
from omnipipe.engine.events import AbortRequests, AddRequest, EngineEvent, QueryState, ShutdownEngine
from omnipipe.engine.liveness import LOOP_STALL_S, EngineHealth, StageHealth, StageLiveness
from omnipipe.engine.route_plan import RoutePlan, RoutePlans, streams
from omnipipe.engine.run_dir import create_run_dir, sweep_stale_run_dirs
from omnipipe.engine.stage_client import StageClient
from omnipipe.placement import DEFAULT_LAUNCHER, Launcher, launcher_for
from omnipipe.stage.launch import ChunkLink, StageLaunch
from omnipipe.transport import control_plane
from omnipipe.transport.messages import (
    Abort,
    ChunkRoutes,
    HealthCheck,
    HealthReply,
    Payload,
    Shutdown,
    StageError,
    StageHeartbeat,
    StageOutput,
    StageReady,
    Submit,
)
from omnipipe.transport.relay.base import Relay, RelayError
from omnipipe.transport.relay.registry import create_receivers, create_relay
from omnipipe.transport.relay.shm import segment_prefix, sweep_segments
from omnipipe.transport.relay_io import read_payload, write_payload
from omnipipe.util.dotted import resolve

logger = logging.getLogger(__name__)


RESTART_WINDOW_S = 600.0  # a stage that served this long after a restart has its max_restarts count start over
# A non-streaming handoff (input processor + relay writes) runs in a worker thread, so that a heavy one holds up
# no other stage's outputs. A worker thread's round trip costs two thread wake-ups (~0.3 ms measured on a loaded
# machine), more than a light handoff's work, so an edge whose last INLINE_AFTER_FAST handoffs each took under
# INLINE_HANDOFF_S runs its handoffs of an output up to INLINE_HANDOFF_BYTES on the loop itself; one that takes
# longer sends the edge back to the worker thread until it has been fast that many times in a row again. The cost
# of a wrong guess is bounded: one slow handoff on the loop after a run of fast ones.
INLINE_HANDOFF_BYTES = 64 << 10
INLINE_HANDOFF_S = 0.001
INLINE_AFTER_FAST = 8


class EngineStartError(RuntimeError):
    """A stage could not be started; the message names it."""


@dataclass
class _Request:
    request_id: str
    route: RoutePlan
    params: dict[str, dict[str, Any]]
    edge_options: dict[str, dict[str, Any]]
    arrival_s: float = field(default_factory=time.perf_counter)
    done_stages: set[str] = field(default_factory=set)
    submitted: set[str] = field(default_factory=set)
    forward_data: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    forward_bytes: dict[str, int] = field(default_factory=dict)  # per stage: how big its forward_data came in
    stage_metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    edge_metrics: dict[str, dict[str, Any]] = field(default_factory=dict)


class Orchestrator:
    def __init__(self, pipeline: PipelineSpec, deploy: DeployConfig, run_id: str,
                 emit: Callable[[EngineEvent], None], log_level: str = "WARNING",
                 launcher: Launcher | None = None, progress: Callable[[str], None] | None = None) -> None:
        """``progress`` hears start-up in words (each stage as it becomes ready), from this thread; without it
        those lines are logged at INFO."""
        self.pipeline = pipeline
        self._progress = progress
        self.deploy = deploy
        self.run_id = run_id
        self._emit = emit
        self.log_level = log_level
        sweep_stale_run_dirs()  # what SIGKILLed engines before this one left behind
        self.run_dir = create_run_dir(run_id)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.request_queue: asyncio.Queue[Any] | None = None  # read on this thread's loop; ``submit`` feeds it
        self.clients: dict[str, StageClient] = {}
        self.requests: dict[str, _Request] = {}
        self._started = threading.Event()
        self._cancel_start = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, name="omnipipe-orchestrator", daemon=True)
        self._health_waiters: dict[int, tuple[asyncio.Future[list[HealthReply]], list[HealthReply], int]] = {}
        self._nonce = 0
        self._input_processors = {e.name: resolve(e.input_processor) for e in pipeline.edges}
        self.launcher = launcher or launcher_for(deploy.placement.backend or DEFAULT_LAUNCHER, deploy)
        # tcp: every socket of the run authenticates with keys made for this run (transport/control_plane.py)
        self.control_keys = (control_plane.ControlKeys.generate()
                             if deploy.transport == "tcp" and deploy.control_plane_auth == "curve" else None)
        self.route_plans = RoutePlans(pipeline, deploy.async_chunk)
        # consumer stage -> the producers that stream chunks into it, and its announced chunk socket address
        self._chunk_producers = {s.name: [e.source for e in pipeline.edges_into(s.name) if self._streams(e)]
                                 for s in pipeline.stages}
        self.chunk_addresses: dict[str, str] = {}
        self._parked: dict[str, AddRequest] = {}  # requests waiting for a restarting stage of their plan
        self._forwards: set[asyncio.Task[None]] = set()
        self._fast_handoffs: dict[str, int] = {}  # edge -> its handoffs in a row that took under INLINE_HANDOFF_S
        self._stopping = False
        self._recently_ended: collections.deque[str] = collections.deque(maxlen=1024)  # aborted or failed
        self.last_tick = time.monotonic()  # the watchdog's last run: this loop is alive

    # ================================================================== thread entry
    def start(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self._thread.join(timeout=30)
            raise self._start_error

    def cancel_start(self) -> None:
        """Stop loading (Ctrl-C during start-up): ``start()`` raises EngineStartError once every stage is gone;
        stages still loading are killed rather than waited for."""
        self._cancel_start.set()

    def kill_now(self) -> None:
        """SIGKILL every stage process and remove the run's shm segments and directory, from any thread, without
        waiting for this loop (a second Ctrl-C: the process is about to exit)."""
        for client in list(self.clients.values()):
            if client.handle is not None:
                with contextlib.suppress(OSError):
                    client.handle.kill()
        sweep_segments(segment_prefix(self.run_id))
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _say(self, message: str) -> None:
        if self._progress is not None:
            try:
                self._progress(message)
            except Exception:  # a broken progress callback must not stop the engine
                logger.exception("progress callback failed")
        else:
            logger.info("%s", message)

    def submit(self, command: Any) -> None:
        """Hand a command to this thread's loop, from any thread (one wake-up of that loop, in order). A command
        sent after the loop has ended is dropped: nothing would read it."""
        assert self.loop is not None and self.request_queue is not None
        with contextlib.suppress(RuntimeError):  # the loop is closed
            self.loop.call_soon_threadsafe(self.request_queue.put_nowait, command)

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _thread_main(self) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as exc:  # reported to start() or logged
            if not self._started.is_set():
                self._start_error = exc
                self._started.set()
            else:
                logger.exception("orchestrator stopped on an error")
        finally:
            self.loop.close()

    # ================================================================== setup
    def _address(self, name: str) -> str:
        """Where to bind ``name``: an ipc path in the run directory, or ``tcp://host:*`` (port chosen at bind)."""
        return control_plane.bind_address(self.deploy.transport, self.deploy.host, self.run_dir, name)

    def _streams(self, edge: EdgeSpec) -> bool:
        return streams(edge, self.deploy.async_chunk)

    def _launches(self, abort_address: str) -> dict[str, StageLaunch]:
        # a consumer binds its own chunk socket; under tcp producers learn its port from ChunkRoutes
        chunk_inputs = {stage.name: self._address(f"{stage.name}-chunks") for stage in self.pipeline.stages
                        if self._chunk_producers[stage.name]}
        known_up_front = self.deploy.transport == "ipc"
        launches = {}
        for stage in self.pipeline.stages:
            settings = self.deploy.stage(stage.name)
            client = self.clients[stage.name]
            links = {}
            for edge in self.pipeline.edges_from(stage.name):
                if self._streams(edge):
                    backend, threshold = self.deploy.edge_relay(edge.source, edge.target)
                    address = chunk_inputs[edge.target] if known_up_front else None
                    links[edge.target] = ChunkLink(address, backend, threshold,
                                                   edge.chunk_processor or "",
                                                   dict(self.deploy.edges.get(edge.name, EdgeDeploy()).options),
                                                   edge.options)
            launches[stage.name] = StageLaunch(
                run_id=self.run_id, stage=stage.name, kind=stage.kind, runner=stage.runner, device=settings.device,
                threads=settings.threads, max_num_seqs=settings.max_num_seqs, options=settings.options,
                ctrl_address=client.ctrl_address, out_address=client.out_address,
                abort_address=abort_address, chunk_listen_address=chunk_inputs.get(stage.name), chunk_links=links,
                extra_params=stage.extra_params,
                out_relay=self.deploy.relay_between(stage.name, ORCHESTRATOR),
                out_inline_threshold_bytes=self.deploy.relay.inline_threshold_bytes,
                relay_options=self.deploy.relay_options(), log_level=self.log_level,
                heartbeat_interval_s=self.deploy.heartbeat_interval_s,
                world_size=settings.tensor_parallel_size, input_broadcast=settings.input_broadcast,
                input_broadcast_threshold_bytes=settings.input_broadcast_threshold_bytes,
                cpu_affinity=list(settings.cpu.affinity or []), nice=settings.cpu.nice,
                control_keys=self.control_keys, host=settings.host,
            )
        return launches

    async def _main(self) -> None:
        self.request_queue = asyncio.Queue()
        self.ctx = zmq.asyncio.Context()
        if self.control_keys is not None:
            control_plane.secure_context(self.ctx, self.control_keys)
        self.abort_pub = control_plane.make_socket(self.ctx, zmq.PUB, self._address("abort"), bind=True)
        abort_address = control_plane.bound_address(self.abort_pub)
        self.recv_relays = create_receivers(self.run_id, "orch-rx")
        # what the API process writes: each stage's input where a request enters it (one relay per backend),
        # and the input of each non-streaming edge's target
        self.send_relays: dict[str, Relay] = {}
        self.entry_relays: dict[str, Relay] = {}
        for backend in sorted({self.deploy.relay_between(ORCHESTRATOR, s.name) for s in self.pipeline.stages}):
            self.send_relays[f"<entry:{backend}>"] = create_relay(backend, run_id=self.run_id,
                                                                  owner=f"orch-entry-{backend}",
                                                                  options=self.deploy.relay_options())
        for stage in self.pipeline.stages:
            self.entry_relays[stage.name] = self.send_relays[
                f"<entry:{self.deploy.relay_between(ORCHESTRATOR, stage.name)}>"]
        for edge in self.pipeline.edges:
            backend = self.deploy.handoff_relay(edge.source, edge.target)
            self.send_relays[edge.name] = create_relay(backend, run_id=self.run_id, owner=f"orch-{edge.source}",
                                                       options=self.deploy.relay_options())
        try:
            for stage in self.pipeline.stages:
                settings = self.deploy.stage(stage.name)
                self.clients[stage.name] = StageClient(self.ctx, stage.name, self.launcher,
                                                       self._address(f"{stage.name}-ctrl"),
                                                       self._address(f"{stage.name}-out"),
                                                       StageLiveness(settings.stall_report_s, settings.stall_restart_s),
                                                       dist_host=self.deploy.host)
            for name, launch in self._launches(abort_address).items():
                self.clients[name].launch = launch
            self._say(f"starting {len(self.clients)} stage(s) of {self.pipeline.name!r}: {', '.join(self.clients)}")
            for client in self.clients.values():
                client.spawn()
            await self._wait_ready(list(self.clients.values()))
            for producer in self.clients.values():
                await self._send_chunk_routes(producer.name)
        except BaseException:
            await self._teardown()
            raise
        tasks = [asyncio.create_task(self._output_handler(c), name=f"out-{c.name}") for c in self.clients.values()]
        tasks.append(asyncio.create_task(self._watchdog(), name="watchdog"))
        tasks += [asyncio.create_task(self._connection_watch(c), name=f"conn-{c.name}")
                  for c in self.clients.values() if c.monitor is not None]
        for client in self.clients.values():
            self._watch(client)
        self._started.set()
        try:
            await self._request_handler()
        finally:
            for task in [*tasks, *self._forwards]:
                task.cancel()
            await asyncio.gather(*tasks, *self._forwards, return_exceptions=True)
            await self._teardown()

    async def _wait_ready(self, clients: list[StageClient]) -> None:
        """Wait until every client's process says it is ready; fail naming the stage if one dies or errs."""
        deadline = time.monotonic() + self.deploy.stage_start_timeout_s
        pending = {c.name: c for c in clients}
        recv_tasks = {asyncio.create_task(c.recv()): c for c in clients}
        try:
            while pending:
                if self._cancel_start.is_set():
                    raise EngineStartError("start-up cancelled")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise EngineStartError(f"stages {', '.join(pending)} did not load within "
                                           f"{self.deploy.stage_start_timeout_s:.0f} s (stage_start_timeout_s)")
                done, _ = await asyncio.wait(list(recv_tasks), timeout=min(remaining, 0.5),
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    client = recv_tasks.pop(task)
                    message = task.result()
                    if isinstance(message, StageReady):
                        pending.pop(client.name, None)
                        if message.chunk_address is not None:
                            self.chunk_addresses[client.name] = message.chunk_address
                        client.ready.set()
                        client.ready_since = time.monotonic()
                        client.liveness.reset()
                        waiting = f"; waiting for {', '.join(pending)}" if pending else ""
                        self._say(f"stage {client.name} ready ({message.load_time_s:.1f} s){waiting}")
                        continue
                    if isinstance(message, StageError) and not message.request_id:
                        client.load_error = message.message
                    recv_tasks[asyncio.create_task(client.recv())] = client
                for client in list(pending.values()):
                    if client.handle is not None and not client.is_running():
                        code = client.exit_code()
                        await asyncio.sleep(0.05)  # give a last error message a moment to arrive
                        for task in [t for t, c in recv_tasks.items() if c is client and t.done()]:
                            message = task.result()
                            if isinstance(message, StageError):
                                client.load_error = message.message
                        detail = f": {client.load_error}" if client.load_error else ""
                        raise EngineStartError(f"stage {client.name!r} failed to start (exit code {code}){detail}")
        finally:
            for task in recv_tasks:
                task.cancel()
            await asyncio.gather(*recv_tasks, return_exceptions=True)

    async def _teardown(self) -> None:
        self._stopping = True
        for client in self.clients.values():  # a stage still loading reads no Shutdown message: do not wait for it
            if client.handle is not None and not client.ready.is_set():
                client.handle.kill()
        for client in self.clients.values():
            if client.alive and client.ready.is_set():
                try:
                    await asyncio.wait_for(client.send(Shutdown("engine shutdown")), timeout=1.0)
                except (asyncio.TimeoutError, zmq.ZMQError) as exc:  # stop() below kills it after a timeout
                    logger.warning("stage %s did not take the shutdown message: %r", client.name, exc)
        for client in self.clients.values():
            if self.loop is not None and client.handle is not None:
                with contextlib.suppress(ValueError, OSError):  # no reader left: the stage had already died
                    self.loop.remove_reader(client.sentinel)
            await asyncio.to_thread(client.stop)
            client.close_sockets()
        for relay in [*self.recv_relays.values(), *self.send_relays.values()]:
            relay.close()
        self.abort_pub.close(0)
        control_plane.release_context(self.ctx)
        self.ctx.destroy(linger=0)  # also closes the socket of a StageClient whose bind failed half-way
        sweep_segments(segment_prefix(self.run_id))
        shutil.rmtree(self.run_dir, ignore_errors=True)

    # ================================================================== requests
    async def _request_handler(self) -> None:
        assert self.request_queue is not None
        while True:
            command = await self.request_queue.get()
            if isinstance(command, AddRequest):
                await self._add_request_or_fail(command)
            elif isinstance(command, AbortRequests):
                await self._abort(command.request_ids, notify=None)
            elif isinstance(command, QueryState):
                asyncio.create_task(self._query_state(command))
            elif isinstance(command, ShutdownEngine):
                await self._abort([*self.requests, *self._parked], notify="engine shut down")
                return

    def _submit_for(self, request: _Request, stage: str, inputs: list[Payload], input_finished: bool) -> Submit:
        route = request.route.routes[stage]
        return Submit(
            request_id=request.request_id, inputs=inputs, input_finished=input_finished,
            params=request.params.get(stage, {}), emit_final=route.emit_final, emit_data=route.emit_data,
            chunk_targets=list(route.chunk_targets), chunk_sources=list(route.chunk_sources),
            edge_options=request.edge_options,
        )

    async def _add_request_or_fail(self, command: AddRequest) -> None:
        """Add a request; whatever goes wrong on the way (a value the wire cannot carry, a relay error) fails that
        request alone and never the loop that serves every other request."""
        try:
            await self._add_request(command)
        except Exception as exc:
            logger.exception("request %s could not be sent to its stages", command.request_id)
            message = f"the request could not be sent to its stages: {type(exc).__name__}: {exc}"
            request = self.requests.get(command.request_id)
            if request is not None:
                self._fail(request, "", message)
            else:
                self._emit(EngineEvent(command.request_id, "error", "", error=message))

    async def _add_request(self, command: AddRequest) -> None:
        down = [name for name in command.plan if not self.clients[name].alive and not self._restartable(name)]
        if down:
            self._emit(EngineEvent(command.request_id, "error", down[0], error=f"stage {down[0]!r} is down"))
            return
        if not all(self.clients[name].ready.is_set() for name in command.plan):
            self._parked[command.request_id] = command  # submitted when the restarting stage is back
            return
        route = self.route_plans.get(command.entry.stage, command.plan, command.modalities)
        request = _Request(command.request_id, route, command.params, command.edge_options)
        self.requests[request.request_id] = request
        entry = command.entry.stage
        try:
            payload = write_payload(command.entry.data, self.entry_relays[entry], request.request_id,
                                    self.deploy.relay.inline_threshold_bytes)
        except (RelayError, ValueError) as exc:
            self._fail(request, entry, f"input could not be sent: {exc}")
            return
        await self._send(entry, self._submit_for(request, entry, [payload], True), request)
        # prewarm: every stage fed only by streaming edges is registered now and waits for chunks
        for stage in route.prewarm:
            await self._send(stage, self._submit_for(request, stage, [], False), request)

    async def _submit_parked(self) -> None:
        """Submit the requests that waited for a restarting stage, now that every stage of their plan is ready."""
        for request_id, command in list(self._parked.items()):
            if all(self.clients[name].ready.is_set() for name in command.plan):
                del self._parked[request_id]
                await self._add_request_or_fail(command)

    def _fail_parked(self, stage: str, message: str) -> None:
        for request_id, command in list(self._parked.items()):
            if stage in command.plan:
                del self._parked[request_id]
                self._emit(EngineEvent(request_id, "error", stage, error=message, stage_lost=True))

    async def _send_chunk_routes(self, producer: str) -> None:
        """Tell ``producer`` where each stage it streams to listens for chunks."""
        routes = {edge.target: self.chunk_addresses[edge.target] for edge in self.pipeline.edges_from(producer)
                  if self._streams(edge) and edge.target in self.chunk_addresses}
        if routes:
            await self.clients[producer].send(ChunkRoutes(routes))

    async def _on_stage_back(self, client: StageClient, message: StageReady) -> None:
        """A restarted stage is ready: re-announce routes that involve it, then submit what waited for it."""
        client.ready.set()
        client.ready_since = time.monotonic()
        client.liveness.reset()
        logger.warning("stage %s is back (pid %d)", client.name, message.pid)
        if message.chunk_address is not None:
            self.chunk_addresses[client.name] = message.chunk_address
            for producer in self._chunk_producers[client.name]:
                await self._send_chunk_routes(producer)
        await self._send_chunk_routes(client.name)
        await self._submit_parked()

    def _restartable(self, stage: str) -> bool:
        settings = self.deploy.stage(stage)
        client = self.clients[stage]
        return (settings.restart_on_failure and client.restarts_in_a_row < settings.max_restarts
                and client.start_error is None)

    async def _send(self, stage: str, message: Submit, request: _Request) -> None:
        request.submitted.add(stage)
        await self.clients[stage].send(message)

    async def _abort(self, request_ids: list[str], notify: str | None) -> None:
        for rid in request_ids:
            if self._parked.pop(rid, None) is not None and notify:
                self._emit(EngineEvent(rid, "error", "", error=notify))
        known = [rid for rid in request_ids if rid in self.requests]
        if not request_ids:
            return
        await self.abort_pub.send(control_plane.encode(Abort(list(request_ids))))
        self._recently_ended.extend(request_ids)
        for rid in known:
            request = self.requests.pop(rid)
            for relay in self.send_relays.values():
                relay.cleanup(rid)
            if notify:
                self._emit(EngineEvent(rid, "error", "", error=notify))
            del request

    def _fail(self, request: _Request, stage: str, message: str, field: str | None = None,
              stage_lost: bool = False) -> None:
        if self.requests.pop(request.request_id, None) is None:
            return
        self._recently_ended.append(request.request_id)
        for relay in self.send_relays.values():
            relay.cleanup(request.request_id)
        self._emit(EngineEvent(request.request_id, "error", stage, error=message, error_field=field,
                               stage_lost=stage_lost))
        asyncio.ensure_future(self.abort_pub.send(control_plane.encode(Abort([request.request_id]))))

    # ================================================================== outputs
    async def _output_handler(self, client: StageClient) -> None:
        while True:
            message = await client.recv()
            if message is None:
                continue
            try:
                if isinstance(message, StageOutput):
                    await self._route_output(message)
                elif isinstance(message, StageError):
                    self._on_stage_error(client, message)
                elif isinstance(message, StageHeartbeat):
                    if message.pid == client.pid:  # not a last beat of a process already replaced
                        client.liveness.beat(message.step_s)
                elif isinstance(message, HealthReply):
                    self._on_health(message)
                elif isinstance(message, StageReady):
                    await self._on_stage_back(client, message)
            except Exception:  # one bad message must not stop routing for everyone
                logger.exception("orchestrator: routing a message from %s failed", client.name)

    async def _route_output(self, message: StageOutput) -> None:
        request = self.requests.get(message.request_id)
        body: dict[str, Any] = {}
        if message.payload is not None:
            try:  # always read: it frees the sender's relay slot even if the request is gone
                body = read_payload(message.payload, self.recv_relays, message.request_id) or {}
            except (RelayError, ValueError) as exc:
                if request is not None:
                    self._fail(request, message.stage, f"stage {message.stage!r} output unreadable: {exc}")
                return
        if request is None:
            return
        stage = message.stage
        spec = self.pipeline.stage(stage)
        if message.text_delta or "details" in body:
            self._emit(EngineEvent(request.request_id, "text", stage, text_delta=message.text_delta,
                                   num_tokens=message.num_tokens, details=body.get("details")))
        if "audio" in body:
            self._emit(EngineEvent(request.request_id, "audio", stage, audio=body["audio"],
                                   sample_rate_hz=spec.sample_rate_hz))
        if "image" in body:  # the finished image (the stage's last output), or a preview with its step
            progress = None if message.finished else body.get("progress")
            self._emit(EngineEvent(request.request_id, "image", stage, image=body["image"], details=progress))
        elif "progress" in body:
            self._emit(EngineEvent(request.request_id, "progress", stage, details=body["progress"]))
        if "data" in body:
            request.forward_data.setdefault(stage, []).append(body["data"])
            assert message.payload is not None
            request.forward_bytes[stage] = (request.forward_bytes.get(stage, 0) + message.payload.nbytes
                                            + len(message.payload.skeleton))
        if not message.finished:
            return
        request.done_stages.add(stage)
        metrics = dict(message.metrics or {})
        request.edge_metrics.update(metrics.pop("edges", {}) or {})
        request.stage_metrics[stage] = metrics
        if message.finish_reason:
            request.stage_metrics[stage]["finish_reason"] = message.finish_reason
        forward_edges = request.route.routes[stage].forward_edges
        outputs = request.forward_data.pop(stage, []) if forward_edges else []
        small = request.forward_bytes.pop(stage, 0) <= INLINE_HANDOFF_BYTES
        for edge in forward_edges:
            if small and self._fast_handoffs.get(edge.name, 0) >= INLINE_AFTER_FAST:  # cheaper than a thread
                await self._forward(request, edge, outputs, inline=True)
                continue
            # off this handler: a heavy handoff must not hold up this stage's other outputs
            task = asyncio.create_task(self._forward(request, edge, outputs), name=f"forward-{edge.name}")
            self._forwards.add(task)
            task.add_done_callback(self._forwards.discard)
        if request.done_stages >= set(request.route.stages):
            self.requests.pop(request.request_id, None)
            reason = next((m.get("finish_reason") for m in request.stage_metrics.values() if m.get("finish_reason")),
                          None)
            self._emit(EngineEvent(request.request_id, "done", stage, finish_reason=reason,
                                   stage_metrics=request.stage_metrics, edge_metrics=request.edge_metrics))

    async def _forward(self, request: _Request, edge: EdgeSpec, outputs: list[dict[str, Any]],
                       inline: bool = False) -> None:
        """Non-streaming edge: the whole upstream output -> the downstream stage's input. The input processor and
        the relay writes run in a worker thread (on this loop if ``inline``: a small output); a request that ended
        meanwhile is not submitted."""
        start = time.perf_counter()
        _, threshold = self.deploy.edge_relay(edge.source, edge.target)
        relay = self.send_relays[edge.name]

        def handoff() -> list[Payload]:
            began = time.perf_counter()
            inputs = self._input_processors[edge.name](outputs)
            payloads = [write_payload(item, relay, request.request_id, threshold) for item in inputs]
            fast = time.perf_counter() - began < INLINE_HANDOFF_S
            self._fast_handoffs[edge.name] = self._fast_handoffs.get(edge.name, 0) + 1 if fast else 0
            return payloads

        try:
            payloads = handoff() if inline else await asyncio.to_thread(handoff)
        except Exception as exc:
            logger.exception("input processor %s failed", edge.input_processor)
            relay.cleanup(request.request_id)
            self._fail(request, edge.source, f"input processor for {edge.name} failed: {exc}")
            return
        if self.requests.get(request.request_id) is not request:  # aborted or failed while the handoff ran
            relay.cleanup(request.request_id)
            return
        request.edge_metrics[edge.name] = {"chunks": len(payloads), "bytes": sum(len(p.skeleton) + p.nbytes for p in payloads),
                                           "transfer_s": time.perf_counter() - start}
        await self._send(edge.target, self._submit_for(request, edge.target, payloads, True), request)

    def _on_stage_error(self, client: StageClient, message: StageError) -> None:
        if not message.request_id:
            client.load_error = message.message
            logger.error("stage %s: %s", client.name, message.message)
            return
        request = self.requests.get(message.request_id)
        if request is None:
            return
        if message.field is not None:  # the request's own input is at fault: its rule, for the caller
            logger.info("stage %s refused request %s: %s %s", client.name, message.request_id, message.field,
                        message.message)
            self._fail(request, message.stage, message.message, message.field)
        else:
            self._fail(request, message.stage, f"stage {message.stage!r}: {message.message}")

    # ================================================================== stage death
    def _watch(self, client: StageClient) -> None:
        assert self.loop is not None
        self.loop.add_reader(client.sentinel, self._on_exit, client)

    def _on_exit(self, client: StageClient) -> None:
        assert self.loop is not None
        self.loop.remove_reader(client.sentinel)
        if self._stopping:
            return
        code = client.exit_code()
        rank = client.ended_rank()
        if client.handle is not None and client.launch is not None and client.launch.world_size > 1:
            client.handle.kill()  # the other ranks cannot go on without it (they would wait in a collective)
            client.handle.wait(5.0)
        client.alive = False
        client.ready.clear()
        if client.ready_since is not None and time.monotonic() - client.ready_since >= RESTART_WINDOW_S:
            client.restarts_in_a_row = 0  # it had been serving a good while: this death starts a new count
        client.ready_since = None
        if client.liveness.killed_for:
            death = f"stage {client.name!r} {client.liveness.killed_for} and was killed"
            client.liveness.killed_for = None  # a later death (even before it is ready again) is its own
        else:
            size = client.launch.world_size if client.launch is not None else 1
            which = f" rank {rank} (of {size})" if size > 1 else ""
            node = client.handle.node if client.handle is not None else None
            where = f" on node {node}" if node else ""
            if getattr(client.handle, "lost_connection", False):
                death = f"stage {client.name!r}{where} dropped its connection to the engine (taken as its death)"
            else:
                death = f"stage {client.name!r}{which}{where} died (exit code {code})"
        logger.error("%s", death)
        victims = [r for r in self.requests.values()
                   if client.name in r.route.stages and client.name not in r.done_stages]
        for request in victims:
            self._fail(request, client.name, death, stage_lost=True)
        removed = sweep_segments(segment_prefix(self.run_id, client.name))
        if removed:
            logger.info("released %d shared-memory segments of stage %s", len(removed), client.name)
        if not self._restartable(client.name):
            self._fail_parked(client.name, f"{death} and is not restarted")
        else:
            client.restarts += 1
            client.restarts_in_a_row += 1
            logger.warning("restarting stage %s (restart %d, %d in a row)", client.name, client.restarts,
                           client.restarts_in_a_row)
            client.launch = msgspec.structs.replace(client.launch, aborted_request_ids=list(self._recently_ended))
            if self.launcher.quick:
                client.spawn()
                self._watch(client)
            else:  # a cluster scheduler may take a while to place it: this loop serves the others meanwhile
                task = asyncio.create_task(self._respawn(client), name=f"respawn-{client.name}")
                self._forwards.add(task)
                task.add_done_callback(self._forwards.discard)

    async def _respawn(self, client: StageClient) -> None:
        try:
            await asyncio.to_thread(client.spawn)
        except Exception as exc:
            client.alive = False
            client.start_error = f"stage {client.name!r} could not be started again: {exc}"
            logger.error("%s", client.start_error)
            self._fail_parked(client.name, client.start_error)
            return
        if self._stopping:
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
                client.connections[fd] = client.generation
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                start = client.connections.pop(fd, None)
                if start == client.generation and client.alive and not self._stopping and client.handle is not None:
                    client.handle.connection_lost()

    # ================================================================== liveness
    async def _watchdog(self) -> None:
        """Every half heartbeat interval: note that this loop runs, and judge each ready stage's progress."""
        period = self.deploy.heartbeat_interval_s / 2
        while True:
            now = time.monotonic()
            late = now - self.last_tick > period + self.deploy.heartbeat_interval_s
            self.last_tick = now
            # a late tick means this loop was held up, and with it the reading of every beat: judge next round,
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
            liveness.killed_for = f"made no progress for {idle_for:.1f} s (stall_restart_s {liveness.restart_s:g})"
            logger.error("stage %s %s; killing it", client.name, liveness.killed_for)
            client.handle.kill()  # the sentinel fires: handled as a death (requests failed, stage restarted)

    def health(self) -> EngineHealth:
        """Whether the engine can make progress; safe to call from any thread (reads, never waits on the loop)."""
        now = time.monotonic()
        problems: list[str] = []
        loop_age = now - self.last_tick
        if not self.is_alive:
            problems.append("the engine loop has stopped")
        elif loop_age > max(LOOP_STALL_S, 2 * self.deploy.heartbeat_interval_s):
            problems.append(f"the engine loop has not run for {loop_age:.1f} s")
        stages: dict[str, StageHealth] = {}
        for name, client in list(self.clients.items()):
            liveness = client.liveness
            up = client.alive and client.ready.is_set()
            idle_for = liveness.no_progress_s(now) if up else None
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

    # ================================================================== state (debug / tests)
    async def _query_state(self, command: QueryState) -> None:
        self._nonce += 1
        nonce = self._nonce
        # a stalled stage cannot answer: it is reported by its liveness instead of holding up the query
        alive = [c for c in self.clients.values() if c.alive and c.liveness.stalled_since is None]
        future: asyncio.Future[list[HealthReply]] = asyncio.get_running_loop().create_future()
        self._health_waiters[nonce] = (future, [], len(alive))
        for client in alive:
            try:  # a stage whose death is not yet known takes nothing: do not wait for it to come back
                await asyncio.wait_for(client.send(HealthCheck(nonce)), timeout=1.0)
            except asyncio.TimeoutError:
                _, replies_so_far, expected = self._health_waiters[nonce]
                self._health_waiters[nonce] = (future, replies_so_far, expected - 1)
                if len(replies_so_far) >= expected - 1 and not future.done():
                    future.set_result(replies_so_far)
        try:
            replies = await asyncio.wait_for(future, timeout=10) if alive else []
        except asyncio.TimeoutError:
            replies = self._health_waiters[nonce][1]
        finally:
            self._health_waiters.pop(nonce, None)
        state = {
            "orchestrator_requests": sorted([*self.requests, *self._parked]),
            "orchestrator_relay_slots": sum(r.slots_in_use() for r in self.send_relays.values()),
            "stages": {
                r.stage: {"requests": r.request_ids, "running": r.num_running, "waiting": r.num_waiting,
                          "waiting_for_chunk": r.num_waiting_for_chunk, "relay_slots": r.relay_slots_in_use,
                          "pending_chunks": r.pending_chunks}
                for r in replies
            },
            "pids": {name: c.pid for name, c in self.clients.items() if c.alive},
            # every rank's process of a tensor-parallel stage, rank order
            "rank_pids": {name: list(c.handle.pids) for name, c in self.clients.items()
                          if c.alive and c.handle is not None},
            "restarts": {name: c.restarts for name, c in self.clients.items()},
            # where each stage runs: a Ray node id under placement ray, None on this host
            "nodes": {name: c.handle.node if c.handle is not None else None for name, c in self.clients.items()},
            # tcp connections the control plane turned away (an unknown CURVE key)
            "refused_connections": control_plane.refused_connections(self.ctx),
        }
        command.result.set_result(state)

    def _on_health(self, reply: HealthReply) -> None:
        waiter = self._health_waiters.get(reply.nonce)
        if waiter is None:
            return
        future, replies, expected = waiter
        replies.append(reply)
        if len(replies) >= expected and not future.done():
            future.set_result(replies)
