"""The Orchestrator: a background thread with its own asyncio loop that drives every stage.

- start-up: binds each stage's sockets, launches the stages and waits until every one is ready; teardown stops
  them and removes what the run left.
- request handler: takes commands off the request queue (add, abort, end of a session, an audio stream's append or
  drop, state query, shutdown); an add goes to the entry stage (after the appends before it: the same socket) and,
  with async chunk, registers the request at once with every streaming-fed stage (prewarm); an audio stream's
  messages go to the audio stage on that socket too; aborts and session ends are broadcast to every stage.
- output handlers, one per stage: route each stage output. Text/audio of a stage the caller asked for goes to
  the caller; step data for a non-streaming edge is gathered and, when the stage finishes the request,
  turned into the next stage's input by the edge's input processor and forwarded.

Watching the stages (death, restart, parked requests, the liveness watchdog, health) is ``engine/supervision.py``;
the state snapshot is ``engine/state_query.py``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from omnipipe.config.deploy_config import ORCHESTRATOR, DeployConfig
from omnipipe.config.pipeline_spec import EdgeSpec, PipelineSpec
from omnipipe.engine.edge_handoff import EdgeHandoffs
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
from omnipipe.engine.liveness import EngineHealth, StageLiveness
from omnipipe.engine.request_in_flight import RequestInFlight
from omnipipe.engine.route_plan import RoutePlans, streams
from omnipipe.engine.run_dir import create_run_dir, sweep_stale_run_dirs
from omnipipe.engine.stage_client import StageClient
from omnipipe.engine.startup import stage_launches, wait_ready
from omnipipe.engine.state_query import StageReplies, state_snapshot
from omnipipe.engine.supervision import StageSupervisor
from omnipipe.placement import DEFAULT_LAUNCHER, Launcher, launcher_for
from omnipipe.transport import control_plane
from omnipipe.transport.messages import (
    Abort,
    AudioAppend,
    ChunkRoutes,
    DropAudioStream,
    DropSession,
    Payload,
    Shutdown,
    StageError,
    StageHeartbeat,
    StageOutput,
    StageReady,
    StateReply,
    Submit,
)
from omnipipe.transport.relay.base import Relay, RelayError
from omnipipe.transport.relay.registry import create_receivers, create_relay
from omnipipe.transport.relay.shm import segment_prefix, sweep_segments
from omnipipe.transport.relay_io import read_payload, write_payload

logger = logging.getLogger(__name__)


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
        self.requests: dict[str, RequestInFlight] = {}
        self._started = threading.Event()
        self._cancel_start = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, name="omnipipe-orchestrator", daemon=True)
        self._stage_replies = StageReplies()
        self._handoffs = EdgeHandoffs(pipeline, deploy)
        self.launcher = launcher or launcher_for(deploy.placement.backend or DEFAULT_LAUNCHER, deploy)
        # tcp: every socket of the run authenticates with keys made for this run (transport/control_plane.py)
        self.control_keys = (control_plane.ControlKeys.generate()
                             if deploy.transport == "tcp" and deploy.control_plane_auth == "curve" else None)
        self.route_plans = RoutePlans(pipeline, deploy.async_chunk)
        # consumer stage -> the producers that stream chunks into it, and its announced chunk socket address
        self._chunk_producers = {s.name: [e.source for e in pipeline.edges_into(s.name)
                                          if streams(e, deploy.async_chunk)] for s in pipeline.stages}
        self.chunk_addresses: dict[str, str] = {}
        self._forwards: set[asyncio.Task[None]] = set()
        self._recently_ended: collections.deque[str] = collections.deque(maxlen=1024)  # aborted or failed
        self.supervisor = StageSupervisor(self.clients, deploy, self.launcher, run_id, emit,
                                          self._fail_requests_of, self._recently_ended)

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
            launches = stage_launches(self.pipeline, self.deploy, self.clients, self.run_id, self._address,
                                      abort_address, self.log_level, self.control_keys)
            self._say(f"starting {len(self.clients)} stage(s) of {self.pipeline.name!r}: {', '.join(self.clients)}")
            for name, launch in launches.items():
                self.clients[name].spawn(launch)
            await wait_ready(list(self.clients.values()), self.deploy.stage_start_timeout_s, self._cancel_start,
                             self._on_ready)
            for producer in self.clients.values():
                await self._send_chunk_routes(producer.name)
        except BaseException:
            await self._teardown()
            raise
        tasks = [asyncio.create_task(self._output_handler(c), name=f"out-{c.name}") for c in self.clients.values()]
        self.supervisor.start()
        self._started.set()
        try:
            await self._request_handler()
        finally:
            background = [*tasks, *self._forwards, *self.supervisor.tasks]
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self._teardown()

    def _on_ready(self, client: StageClient, message: StageReady, pending: list[str]) -> None:
        """A stage is ready at start-up: note where it takes chunks, and say so."""
        if message.chunk_address is not None:
            self.chunk_addresses[client.name] = message.chunk_address
        waiting = f"; waiting for {', '.join(pending)}" if pending else ""
        self._say(f"stage {client.name} ready ({message.load_time_s:.1f} s){waiting}")

    async def _teardown(self) -> None:
        self.supervisor.stop()
        for client in self.clients.values():  # a stage still loading reads no Shutdown message: do not wait for it
            if client.handle is not None and not client.ready.is_set():
                client.handle.kill()
        for client in self.clients.values():
            if client.alive and client.ready.is_set():
                try:
                    await asyncio.wait_for(client.send(Shutdown("engine shutdown")), timeout=1.0)
                except (TimeoutError, zmq.ZMQError) as exc:  # stop() below kills it after a timeout
                    logger.warning("stage %s did not take the shutdown message: %r", client.name, exc)
        for client in self.clients.values():
            self.supervisor.unwatch(client)
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
            elif isinstance(command, AppendAudio):
                await self._to_ready_stage(command.stage, AudioAppend(command.stream_id, command.session_id,
                                                                      command.pcm, command.seq))
            elif isinstance(command, DropAudio):
                await self._to_ready_stage(command.stage, DropAudioStream(command.stream_id))
            elif isinstance(command, EndSession):  # after any abort sent before it: the same socket, in order
                await self.abort_pub.send(control_plane.encode(DropSession(command.session_id)))
            elif isinstance(command, QueryState):
                asyncio.create_task(self._query_state(command))
            elif isinstance(command, ShutdownEngine):
                await self._abort([*self.requests, *self.supervisor.parked], notify="engine shut down")
                return

    async def _to_ready_stage(self, stage: str, message: AudioAppend | DropAudioStream) -> None:
        """An audio stream's message, on the socket the stage's requests come by (in order with them); dropped
        while the stage is down or restarting (it has lost its streams: the next append's ``seq`` tells it)."""
        client = self.clients[stage]
        if client.alive and client.ready.is_set():
            await client.send(message)

    def _submit_for(self, request: RequestInFlight, stage: str, inputs: list[Payload], input_finished: bool) -> Submit:
        route = request.route.routes[stage]
        return Submit(
            request_id=request.request_id, inputs=inputs, input_finished=input_finished,
            params=request.params.get(stage, {}), emit_final=route.emit_final, emit_data=route.emit_data,
            chunk_targets=list(route.chunk_targets), chunk_sources=list(route.chunk_sources),
            edge_options=request.edge_options, session_id=request.session_id,
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
        down = self.supervisor.down_in(command.plan)
        if down:
            self._emit(EngineEvent(command.request_id, "error", down[0], error=f"stage {down[0]!r} is down"))
            return
        if not self.supervisor.plan_ready(command.plan):
            self.supervisor.park(command)  # submitted when the restarting stage is back
            return
        route = self.route_plans.get(command.entry.stage, command.plan, command.modalities)
        request = RequestInFlight(command.request_id, route, command.params, command.edge_options, command.session_id)
        self.requests[request.request_id] = request
        entry = command.entry.stage
        try:
            payload = write_payload(command.entry.data, self.entry_relays[entry], request.request_id,
                                    self.deploy.relay.inline_threshold_bytes)
        except (RelayError, ValueError) as exc:
            self._fail(request, entry, f"input could not be sent: {exc}")
            return
        await self.clients[entry].send(self._submit_for(request, entry, [payload], True))
        # prewarm: every stage fed only by streaming edges is registered now and waits for chunks
        for stage in route.prewarm:
            await self.clients[stage].send(self._submit_for(request, stage, [], False))

    async def _send_chunk_routes(self, producer: str) -> None:
        """Tell ``producer`` where each stage it streams to listens for chunks."""
        routes = {edge.target: self.chunk_addresses[edge.target] for edge in self.pipeline.edges_from(producer)
                  if streams(edge, self.deploy.async_chunk) and edge.target in self.chunk_addresses}
        if routes:
            await self.clients[producer].send(ChunkRoutes(routes))

    async def _on_stage_back(self, client: StageClient, message: StageReady) -> None:
        """A restarted stage is ready: re-announce routes that involve it, then submit what waited for it."""
        client.mark_ready(message)
        logger.warning("stage %s is back (pid %d)", client.name, message.pid)
        if message.chunk_address is not None:
            self.chunk_addresses[client.name] = message.chunk_address
            for producer in self._chunk_producers[client.name]:
                await self._send_chunk_routes(producer)
        await self._send_chunk_routes(client.name)
        for command in self.supervisor.unpark_ready():
            await self._add_request_or_fail(command)

    async def _abort(self, request_ids: list[str], notify: str | None) -> None:
        for rid in request_ids:
            if self.supervisor.unpark(rid) is not None and notify:
                self._emit(EngineEvent(rid, "error", "", error=notify))
        known = [rid for rid in request_ids if rid in self.requests]
        if not request_ids:
            return
        await self.abort_pub.send(control_plane.encode(Abort(list(request_ids))))
        self._recently_ended.extend(request_ids)
        for rid in known:
            del self.requests[rid]
            for relay in self.send_relays.values():
                relay.cleanup(rid)
            if notify:
                self._emit(EngineEvent(rid, "error", "", error=notify))

    def _fail(self, request: RequestInFlight, stage: str, message: str, field: str | None = None,
              stage_lost: bool = False) -> None:
        if self.requests.pop(request.request_id, None) is None:
            return
        self._recently_ended.append(request.request_id)
        for relay in self.send_relays.values():
            relay.cleanup(request.request_id)
        self._emit(EngineEvent(request.request_id, "error", stage, error=message, error_field=field,
                               stage_lost=stage_lost))
        asyncio.ensure_future(self.abort_pub.send(control_plane.encode(Abort([request.request_id]))))

    def _fail_requests_of(self, stage: str, death: str) -> None:
        """``stage`` died: fail every request in flight that still needs it (and wait no longer for its answer to a
        state query)."""
        self._stage_replies.stage_gone(stage)
        victims = [r for r in self.requests.values() if stage in r.route.stages and stage not in r.done_stages]
        for request in victims:
            self._fail(request, stage, death, stage_lost=True)

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
                elif isinstance(message, StateReply):
                    self._stage_replies.on_reply(message)
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
        output_bytes = request.forward_bytes.pop(stage, 0)
        for edge in forward_edges:
            if self._handoffs.runs_inline(edge, output_bytes):  # cheaper than a thread
                await self._forward(request, edge, outputs, inline=True)
                continue
            # off this handler: a heavy handoff must not hold up this stage's other outputs
            task = asyncio.create_task(self._forward(request, edge, outputs), name=f"forward-{edge.name}")
            self._forwards.add(task)
            task.add_done_callback(self._forwards.discard)
        if request.done_stages >= set(request.route.stages):
            self.requests.pop(request.request_id, None)
            # the first stage's in the pipeline's order that gave one (the thinker's "tool_calls" or "length"), not
            # the first to finish: a talker given nothing to say may end before its thinker does
            metrics_of = request.stage_metrics
            reason = next((metrics_of[name]["finish_reason"] for name in request.route.stages
                           if metrics_of.get(name, {}).get("finish_reason")), None)
            self._emit(EngineEvent(request.request_id, "done", stage, finish_reason=reason,
                                   stage_metrics=request.stage_metrics, edge_metrics=request.edge_metrics))

    async def _forward(self, request: RequestInFlight, edge: EdgeSpec, outputs: list[dict[str, Any]],
                       inline: bool = False) -> None:
        """Non-streaming edge: the whole upstream output -> the downstream stage's input (``engine/edge_handoff.py``:
        in a worker thread, or on this loop if ``inline``); a request that ended meanwhile is not submitted."""
        start = time.perf_counter()
        relay = self.send_relays[edge.name]
        try:
            payloads = await self._handoffs.run(edge, outputs, relay, request.request_id, inline)
        except Exception as exc:
            logger.exception("input processor %s failed", edge.input_processor)
            relay.cleanup(request.request_id)
            self._fail(request, edge.source, f"input processor for {edge.name} failed: {exc}")
            return
        if self.requests.get(request.request_id) is not request:  # aborted or failed while the handoff ran
            relay.cleanup(request.request_id)
            return
        request.edge_metrics[edge.name] = {"chunks": len(payloads),
                                           "bytes": sum(len(p.skeleton) + p.nbytes for p in payloads),
                                           "transfer_s": time.perf_counter() - start}
        await self.clients[edge.target].send(self._submit_for(request, edge.target, payloads, True))

    def _on_stage_error(self, client: StageClient, message: StageError) -> None:
        if not message.request_id:
            client.note_load_error(message.message)
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

    # ================================================================== health and state
    def health(self) -> EngineHealth:
        """Whether the engine can make progress; safe to call from any thread (reads, never waits on the loop)."""
        return self.supervisor.health(self.is_alive)

    async def _query_state(self, command: QueryState) -> None:
        replies = await self._stage_replies.gather(self.clients.values())
        relay_slots = sum(r.slots_in_use() for r in self.send_relays.values())
        command.result.set_result(state_snapshot(replies, self.clients, [*self.requests, *self.supervisor.parked],
                                                 relay_slots, self.ctx))
