"""The Orchestrator: a background thread with its own asyncio loop that drives every stage.

- request handler: takes commands off the request queue (add, abort, state query, shutdown); an add goes to the
  entry stage and, with async chunk, registers the request at once with every streaming-fed stage (prewarm).
- output handlers, one per stage: route each stage output. Text/audio of a stage the caller asked for goes to
  the output queue; step data for a non-streaming edge is gathered and, when the stage finishes the request,
  turned into the next stage's input by the edge's input processor and forwarded.
- a watcher per stage process (the process sentinel in the event loop): a stage that dies is noticed at once;
  its requests fail with an error naming it, their state is released everywhere, and the stage is restarted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import janus
import msgspec
import zmq
import zmq.asyncio

from omnipipe.config.deploy_config import DeployConfig, EdgeDeploy
from omnipipe.config.pipeline_spec import EdgeSpec, PipelineSpec, resolve
from omnipipe.engine.events import AbortRequests, AddRequest, EngineEvent, QueryState, ShutdownEngine
from omnipipe.stage.launch import ChunkLink, StageLaunch
from omnipipe.engine.stage_client import StageClient
from omnipipe.transport import control_plane
from omnipipe.transport.messages import (
    Abort,
    HealthCheck,
    HealthReply,
    Shutdown,
    StageError,
    StageOutput,
    StageReady,
    Submit,
)
from omnipipe.transport.relay.base import Relay, RelayError
from omnipipe.transport.relay.registry import create_receivers, create_relay
from omnipipe.transport.relay.shm import segment_prefix, sweep_segments
from omnipipe.transport.relay_io import read_payload, write_payload

logger = logging.getLogger(__name__)


class EngineStartError(RuntimeError):
    """A stage could not be started; the message names it."""


@dataclass
class _Request:
    request_id: str
    plan: list[str]
    modalities: list[str]
    params: dict[str, dict[str, Any]]
    chunk_options: dict[str, Any]
    arrival_s: float = field(default_factory=time.perf_counter)
    done_stages: set[str] = field(default_factory=set)
    submitted: set[str] = field(default_factory=set)
    forward_data: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    stage_metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    edge_metrics: dict[str, dict[str, Any]] = field(default_factory=dict)


class Orchestrator:
    def __init__(self, pipeline: PipelineSpec, deploy: DeployConfig, run_id: str,
                 emit: Callable[[EngineEvent], None], log_level: str = "WARNING") -> None:
        self.pipeline = pipeline
        self.deploy = deploy
        self.run_id = run_id
        self._emit = emit
        self.log_level = log_level
        self.run_dir = tempfile.mkdtemp(prefix=f"omnipipe-{run_id}-")
        self.loop: asyncio.AbstractEventLoop | None = None
        self.request_queue: janus.Queue[Any] | None = None
        self.clients: dict[str, StageClient] = {}
        self.requests: dict[str, _Request] = {}
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, name="omnipipe-orchestrator", daemon=True)
        self._health_waiters: dict[int, tuple[asyncio.Future[list[HealthReply]], list[HealthReply], int]] = {}
        self._nonce = 0
        self._input_processors = {e.name: resolve(e.input_processor) for e in pipeline.edges}
        self._stopping = False
        self._recently_ended: collections.deque[str] = collections.deque(maxlen=1024)  # aborted or failed

    # ================================================================== thread entry
    def start(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self._thread.join(timeout=30)
            raise self._start_error

    def submit(self, command: Any) -> None:
        assert self.request_queue is not None
        self.request_queue.sync_q.put_nowait(command)

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
        if self.deploy.transport == "ipc":
            return f"ipc://{os.path.join(self.run_dir, name)}"
        with socket.socket() as probe:
            probe.bind((self.deploy.host, 0))
            port = probe.getsockname()[1]
        return f"tcp://{self.deploy.host}:{port}"

    def _streams(self, edge: EdgeSpec) -> bool:
        return self.deploy.async_chunk and edge.chunk_processor is not None

    def _launches(self, abort_address: str) -> dict[str, StageLaunch]:
        chunk_inputs = {stage.name: self._address(f"{stage.name}-chunks") for stage in self.pipeline.stages
                        if any(self._streams(e) for e in self.pipeline.edges_into(stage.name))}
        launches = {}
        for stage in self.pipeline.stages:
            settings = self.deploy.stage(stage.name)
            links = {}
            for edge in self.pipeline.edges_from(stage.name):
                if self._streams(edge):
                    backend, threshold = self.deploy.edge_relay(edge.source, edge.target)
                    links[edge.target] = ChunkLink(chunk_inputs[edge.target], backend, threshold,
                                                   edge.chunk_processor or "",
                                                   dict(self.deploy.edges.get(edge.name, EdgeDeploy()).options))
            launches[stage.name] = StageLaunch(
                run_id=self.run_id, stage=stage.name, kind=stage.kind, runner=stage.runner, device=settings.device,
                threads=settings.threads, max_num_seqs=settings.max_num_seqs, options=settings.options,
                ctrl_address=self._address(f"{stage.name}-ctrl"), out_address=self._address(f"{stage.name}-out"),
                abort_address=abort_address, chunk_listen_address=chunk_inputs.get(stage.name), chunk_links=links,
                out_relay=self.deploy.relay.backend, out_inline_threshold_bytes=self.deploy.relay.inline_threshold_bytes,
                relay_options=self.deploy.relay_options(), codec_chunk_frames=self.deploy.codec_chunk_frames,
                left_context_frames=self.deploy.left_context_frames,
                right_context_frames=self.deploy.right_context_frames,
                initial_codec_chunk_frames=self.deploy.initial_codec_chunk_frames, log_level=self.log_level,
            )
        return launches

    async def _main(self) -> None:
        self.request_queue = janus.Queue(maxsize=0)
        self.ctx = zmq.asyncio.Context()
        abort_address = self._address("abort")
        self.abort_pub = control_plane.make_socket(self.ctx, zmq.PUB, abort_address, bind=True)
        self.recv_relays = create_receivers(self.run_id, "orch-rx")
        self.entry_relay = create_relay(self.deploy.relay.backend, run_id=self.run_id, owner="orch-entry",
                                        options=self.deploy.relay_options())
        self.send_relays: dict[str, Relay] = {"<entry>": self.entry_relay}
        for edge in self.pipeline.edges:
            backend, _ = self.deploy.edge_relay(edge.source, edge.target)
            self.send_relays[edge.name] = create_relay(backend, run_id=self.run_id, owner=f"orch-{edge.source}",
                                                       options=self.deploy.relay_options())
        try:
            for name, launch in self._launches(abort_address).items():
                self.clients[name] = StageClient(self.ctx, launch)
            for client in self.clients.values():
                client.spawn()
            await self._wait_ready(list(self.clients.values()))
        except BaseException:
            await self._teardown()
            raise
        tasks = [asyncio.create_task(self._output_handler(c), name=f"out-{c.name}") for c in self.clients.values()]
        for client in self.clients.values():
            self._watch(client)
        self._started.set()
        try:
            await self._request_handler()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._teardown()

    async def _wait_ready(self, clients: list[StageClient]) -> None:
        """Wait until every client's process says it is ready; fail naming the stage if one dies or errs."""
        deadline = time.monotonic() + self.deploy.stage_start_timeout_s
        pending = {c.name: c for c in clients}
        recv_tasks = {asyncio.create_task(c.recv()): c for c in clients}
        try:
            while pending:
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
                        client.ready.set()
                        logger.info("stage %s ready (pid %d, %.1f s)", client.name, message.pid, message.load_time_s)
                        continue
                    if isinstance(message, StageError) and not message.request_id:
                        client.load_error = message.message
                    recv_tasks[asyncio.create_task(client.recv())] = client
                for client in list(pending.values()):
                    if client.process is not None and not client.is_running():
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
        for client in self.clients.values():
            if client.alive:
                try:
                    await asyncio.wait_for(client.send(Shutdown("engine shutdown")), timeout=1.0)
                except (asyncio.TimeoutError, zmq.ZMQError) as exc:  # stop() below kills it after a timeout
                    logger.warning("stage %s did not take the shutdown message: %r", client.name, exc)
        for client in self.clients.values():
            if self.loop is not None and client.process is not None:
                with contextlib.suppress(ValueError, OSError):  # no reader left: the stage had already died
                    self.loop.remove_reader(client.sentinel)
            await asyncio.to_thread(client.stop)
            client.close_sockets()
        for relay in [*self.recv_relays.values(), *self.send_relays.values()]:
            relay.close()
        self.abort_pub.close(0)
        self.ctx.term()
        sweep_segments(segment_prefix(self.run_id))
        shutil.rmtree(self.run_dir, ignore_errors=True)

    # ================================================================== requests
    async def _request_handler(self) -> None:
        assert self.request_queue is not None
        while True:
            command = await self.request_queue.async_q.get()
            if isinstance(command, AddRequest):
                await self._add_request(command)
            elif isinstance(command, AbortRequests):
                await self._abort(command.request_ids, notify=None)
            elif isinstance(command, QueryState):
                asyncio.create_task(self._query_state(command))
            elif isinstance(command, ShutdownEngine):
                await self._abort(list(self.requests), notify="engine shut down")
                return

    def _submit_for(self, request: _Request, stage: str, inputs: list[Any], input_finished: bool) -> Submit:
        plan = request.plan
        wanted = self.pipeline.stage(stage).final_output in request.modalities
        out_edges = [e for e in self.pipeline.edges_from(stage) if e.target in plan]
        in_edges = [e for e in self.pipeline.edges_into(stage) if e.source in plan]
        return Submit(
            request_id=request.request_id, inputs=inputs, input_finished=input_finished,
            params=request.params.get(stage, {}), emit_final=wanted,
            emit_data=any(not self._streams(e) for e in out_edges),
            chunk_targets=[e.target for e in out_edges if self._streams(e)],
            chunk_sources=[e.source for e in in_edges if self._streams(e)],
            chunk_options=request.chunk_options,
        )

    async def _add_request(self, command: AddRequest) -> None:
        down = [name for name in command.plan if not self.clients[name].alive and not self._restartable(name)]
        if down:
            self._emit(EngineEvent(command.request_id, "error", down[0], error=f"stage {down[0]!r} is down"))
            return
        request = _Request(command.request_id, command.plan, command.modalities, command.params, command.chunk_options)
        self.requests[request.request_id] = request
        entry = command.entry.stage
        try:
            payload = write_payload(command.entry.data, self.entry_relay, request.request_id,
                                    self.deploy.relay.inline_threshold_bytes)
        except (RelayError, ValueError) as exc:
            self._fail(request, entry, f"input could not be sent: {exc}")
            return
        await self._send(entry, self._submit_for(request, entry, [payload], True), request)
        # prewarm: every stage fed only by streaming edges is registered now and waits for chunks
        for stage in command.plan:
            if stage == entry:
                continue
            in_edges = [e for e in self.pipeline.edges_into(stage) if e.source in command.plan]
            if in_edges and all(self._streams(e) for e in in_edges):
                await self._send(stage, self._submit_for(request, stage, [], False), request)

    def _restartable(self, stage: str) -> bool:
        settings = self.deploy.stage(stage)
        return settings.restart_on_failure and self.clients[stage].restarts < settings.max_restarts

    async def _send(self, stage: str, message: Submit, request: _Request) -> None:
        request.submitted.add(stage)
        await self.clients[stage].send(message)

    async def _abort(self, request_ids: list[str], notify: str | None) -> None:
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

    def _fail(self, request: _Request, stage: str, message: str) -> None:
        if self.requests.pop(request.request_id, None) is None:
            return
        self._recently_ended.append(request.request_id)
        for relay in self.send_relays.values():
            relay.cleanup(request.request_id)
        self._emit(EngineEvent(request.request_id, "error", stage, error=message))
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
                elif isinstance(message, HealthReply):
                    self._on_health(message)
                elif isinstance(message, StageReady):
                    client.ready.set()
                    logger.warning("stage %s is back (pid %d)", client.name, message.pid)
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
        if message.text_delta:
            self._emit(EngineEvent(request.request_id, "text", stage, text_delta=message.text_delta,
                                   num_tokens=message.num_tokens))
        if "audio" in body:
            self._emit(EngineEvent(request.request_id, "audio", stage, audio=body["audio"],
                                   sample_rate_hz=spec.sample_rate_hz))
        if "data" in body:
            request.forward_data.setdefault(stage, []).append(body["data"])
        if not message.finished:
            return
        request.done_stages.add(stage)
        metrics = dict(message.metrics or {})
        request.edge_metrics.update(metrics.pop("edges", {}) or {})
        request.stage_metrics[stage] = metrics
        if message.finish_reason:
            request.stage_metrics[stage]["finish_reason"] = message.finish_reason
        for edge in self.pipeline.edges_from(stage):
            if edge.target in request.plan and not self._streams(edge):
                if not await self._forward(request, edge):
                    return
        if request.done_stages >= set(request.plan):
            self.requests.pop(request.request_id, None)
            reason = next((m.get("finish_reason") for m in request.stage_metrics.values() if m.get("finish_reason")),
                          None)
            self._emit(EngineEvent(request.request_id, "done", stage, finish_reason=reason,
                                   stage_metrics=request.stage_metrics, edge_metrics=request.edge_metrics))

    async def _forward(self, request: _Request, edge: EdgeSpec) -> bool:
        """Non-streaming edge: the whole upstream output -> the downstream stage's input."""
        start = time.perf_counter()
        try:
            inputs = self._input_processors[edge.name](request.forward_data.pop(edge.source, []))
            _, threshold = self.deploy.edge_relay(edge.source, edge.target)
            payloads = [write_payload(item, self.send_relays[edge.name], request.request_id, threshold)
                        for item in inputs]
        except Exception as exc:
            logger.exception("input processor %s failed", edge.input_processor)
            self._fail(request, edge.source, f"input processor for {edge.name} failed: {exc}")
            return False
        request.edge_metrics[edge.name] = {"chunks": len(payloads), "bytes": sum(len(p.skeleton) + p.nbytes for p in payloads),
                                           "transfer_s": time.perf_counter() - start}
        await self._send(edge.target, self._submit_for(request, edge.target, payloads, True), request)
        return True

    def _on_stage_error(self, client: StageClient, message: StageError) -> None:
        if not message.request_id:
            client.load_error = message.message
            logger.error("stage %s: %s", client.name, message.message)
            return
        request = self.requests.get(message.request_id)
        if request is not None:
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
        client.alive = False
        client.ready.clear()
        logger.error("stage %s died (exit code %s)", client.name, code)
        victims = [r for r in self.requests.values() if client.name in r.plan and client.name not in r.done_stages]
        for request in victims:
            self._fail(request, client.name, f"stage {client.name!r} died (exit code {code})")
        removed = sweep_segments(segment_prefix(self.run_id, client.name))
        if removed:
            logger.info("released %d shared-memory segments of stage %s", len(removed), client.name)
        if self._restartable(client.name):
            client.restarts += 1
            logger.warning("restarting stage %s (restart %d)", client.name, client.restarts)
            client.launch = msgspec.structs.replace(client.launch, aborted_request_ids=list(self._recently_ended))
            client.spawn()
            self._watch(client)

    # ================================================================== state (debug / tests)
    async def _query_state(self, command: QueryState) -> None:
        self._nonce += 1
        nonce = self._nonce
        alive = [c for c in self.clients.values() if c.alive]
        future: asyncio.Future[list[HealthReply]] = asyncio.get_running_loop().create_future()
        self._health_waiters[nonce] = (future, [], len(alive))
        for client in alive:
            await client.send(HealthCheck(nonce))
        try:
            replies = await asyncio.wait_for(future, timeout=10) if alive else []
        except asyncio.TimeoutError:
            replies = self._health_waiters[nonce][1]
        finally:
            self._health_waiters.pop(nonce, None)
        state = {
            "orchestrator_requests": sorted(self.requests),
            "orchestrator_relay_slots": sum(r.slots_in_use() for r in self.send_relays.values()),
            "stages": {
                r.stage: {"requests": r.request_ids, "running": r.num_running, "waiting": r.num_waiting,
                          "waiting_for_chunk": r.num_waiting_for_chunk, "relay_slots": r.relay_slots_in_use,
                          "pending_chunks": r.pending_chunks}
                for r in replies
            },
            "pids": {name: c.pid for name, c in self.clients.items() if c.alive},
            "restarts": {name: c.restarts for name, c in self.clients.items()},
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
