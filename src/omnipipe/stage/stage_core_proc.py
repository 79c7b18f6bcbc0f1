"""The body of one stage process: a control loop around a scheduler and a runner.

The loop blocks on its sockets (control, abort broadcast, chunk wake-ups) whenever the scheduler has nothing
runnable, and polls them without blocking between steps otherwise. Chunk IO runs on the transfer adapter's
threads, so the loop only computes and routes. A step itself (schedule, run, postprocess, and the retry of a
failed batch request by request) is ``step.py``; this module delivers what a step produced.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from omnipipe.chunk.connector import ChunkConnector, EdgeLink, ReceivedChunk
from omnipipe.chunk.context import ChunkContext
from omnipipe.chunk.transfer_adapter import ChunkTransferAdapter
from omnipipe.stage.device import enter_device, stage_device
from omnipipe.stage.heartbeat import Heartbeat
from omnipipe.stage.launch import StageLaunch
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerContext, RunnerOutput, StageRunner
from omnipipe.stage.schedulers import Scheduler, scheduler_for
from omnipipe.stage.step import StageStep
from omnipipe.stage.tensor_parallel import StepChannel, TensorParallelGroup
from omnipipe.transport import control_plane
from omnipipe.transport.messages import (
    Abort,
    AudioAppend,
    ChunkRoutes,
    DropAudioStream,
    DropSession,
    Shutdown,
    StageError,
    StageOutput,
    StageReady,
    StateQuery,
    StateReply,
    Submit,
)
from omnipipe.transport.relay import torch_dist
from omnipipe.transport.relay.base import Relay, RelayError
from omnipipe.transport.relay.registry import create_receivers, create_relay
from omnipipe.transport.relay_io import read_payload, write_payload
from omnipipe.util.dotted import resolve, resolve_class
from omnipipe.util.field_error import FieldError
from omnipipe.util.options import NoOptions, options_from_dict
from omnipipe.util.process import die_with_parent

logger = logging.getLogger(__name__)

_ABORTED_MEMORY = 4096
ChunkProcessor = Callable[[dict[str, Any], dict[str, Any], bool, ChunkContext], list[dict[str, Any]]]


def apply_cpu_placement(launch: StageLaunch) -> None:
    """Deploy ``stages.<name>.cpu``: pin this process (and the threads it starts later) to its cores and lower its
    priority, before any model or thread pool exists."""
    if launch.cpu_affinity:
        os.sched_setaffinity(0, launch.cpu_affinity)
    if launch.nice:
        os.nice(launch.nice)


def run_stage_process(launch_bytes: bytes) -> None:
    """Entry point of a spawned stage process (one rank of it)."""
    launch = StageLaunch.decode(launch_bytes)
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the engine's to handle
    apply_cpu_placement(launch)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(launch.threads)
    # Stages share the machine's cores: an OpenMP thread that waits should sleep, not spin on a core another stage
    # needs (measured: a 2-thread decode step beside two busy processes, 6.8 s spinning vs 1.9 s passive; 5%
    # slower on an idle machine). A caller's own setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    where = f"stage {launch.stage}" + (f" rank {launch.rank}" if launch.world_size > 1 else "")
    logging.basicConfig(level=launch.log_level, format=f"%(asctime)s %(levelname)s [{where}] %(message)s")
    if launch.rank != 0:
        run_follower(launch)
        return
    proc = StageCoreProc(launch)
    try:
        proc.run()
    finally:
        proc.close()


def runner_context(launch: StageLaunch) -> RunnerContext:
    """The runner's context, on this rank's device (checked and made current first); for a tensor-parallel stage
    this rank joins the stage's process groups first."""
    device = stage_device(launch.device, launch.rank, launch.placed_gpus)
    enter_device(launch.stage, device)
    context = RunnerContext(launch.stage, device, launch.threads, launch.max_num_seqs, dict(launch.options),
                            launch.rank, launch.world_size, input_broadcast=launch.input_broadcast,
                            input_broadcast_threshold_bytes=launch.input_broadcast_threshold_bytes)
    if launch.world_size > 1:
        runner_cls = resolve(launch.runner)
        if not getattr(runner_cls, "supports_tensor_parallel", False):
            raise ValueError(f"{launch.runner} does not support tensor_parallel_size > 1")
        if not launch.dist_init_address:
            raise ValueError("a tensor-parallel stage needs dist_init_address")
        context.tensor_parallel = TensorParallelGroup.join(launch.rank, launch.world_size, launch.dist_init_address,
                                                           device)
        context.steps = StepChannel(context.tensor_parallel)
    return context


def _build_runner(launch: StageLaunch, context: RunnerContext) -> StageRunner:
    runner_cls = resolve(launch.runner)
    torch = sys.modules.get("torch")  # imported by a runner that uses it; others never pay for it
    if torch is not None:  # (one that imports it later reads OMP_NUM_THREADS, set above)
        torch.set_num_threads(launch.threads)
    return runner_cls(context)


def run_follower(launch: StageLaunch) -> None:
    """Ranks 1..N-1 of a tensor-parallel stage: join the group, load this rank's shard, then run what rank 0
    sends until it says stop. They hold no control socket: rank 0 speaks for the stage. Any failure ends the
    process, which the engine sees as the stage's death (every rank is then stopped and the stage restarted)."""
    context = runner_context(launch)
    runner = _build_runner(launch, context)
    try:
        runner.load()
        runner.follow()
    finally:
        runner.close()
        assert context.tensor_parallel is not None
        context.tensor_parallel.close()


def _listen_address(launch: StageLaunch) -> str | None:
    """The chunk socket's address: on this stage's own host where the launcher named one (tcp only)."""
    address = launch.chunk_listen_address
    if address is not None and launch.host is not None and address.startswith("tcp://"):
        return f"tcp://{launch.host}:*"
    return address


class StageCoreProc:
    def __init__(self, launch: StageLaunch) -> None:
        self.launch = launch
        self.stage = launch.stage
        self.ctx = zmq.Context()
        if launch.control_keys is not None:
            control_plane.secure_context(self.ctx, launch.control_keys)
        self.ctrl = control_plane.make_socket(self.ctx, zmq.PULL, launch.ctrl_address, bind=False)
        self.out = control_plane.make_socket(self.ctx, zmq.PUSH, launch.out_address, bind=False)
        self.abort_sub = control_plane.make_socket(self.ctx, zmq.SUB, launch.abort_address, bind=False)
        wake_address = f"inproc://wake-{self.stage}"
        self.wake = control_plane.make_socket(self.ctx, zmq.PULL, wake_address, bind=True)

        if launch.device.startswith("cuda"):  # nccl transfers use this stage's GPU, whichever thread makes them
            torch_dist.set_process_device(stage_device(launch.device, launch.rank, launch.placed_gpus))
        relay_options = {backend: dict(options) for backend, options in launch.relay_options.items()}
        if launch.host is not None:  # relays that listen (mooncake) do so on this stage's own host
            for options in relay_options.values():
                if "host" in options:
                    options["host"] = launch.host
        self.out_relay: Relay = create_relay(launch.out_relay, run_id=launch.run_id, owner=f"{self.stage}-out",
                                             options=relay_options)
        self.send_relays: dict[str, Relay] = {
            target: create_relay(link.relay, run_id=launch.run_id, owner=f"{self.stage}-to-{target}",
                                 options=relay_options)
            for target, link in launch.chunk_links.items()
        }
        self.recv_relays_main = create_receivers(launch.run_id, f"{self.stage}-rx")
        # chunks are consumed by the runner and dropped: read them in place, the buffer frees when they go
        recv_relays_chunks = create_receivers(launch.run_id, f"{self.stage}-rxc", zero_copy=True)
        links = {target: EdgeLink(link.address, self.send_relays[target], link.inline_threshold_bytes)
                 for target, link in launch.chunk_links.items()}
        connector = ChunkConnector(self.ctx, self.stage, links, _listen_address(launch), recv_relays_chunks)
        self._recv_relays_chunks = recv_relays_chunks
        self.adapter = ChunkTransferAdapter(self.ctx, connector, self.stage, wake_address)
        self.chunk_processors: dict[str, ChunkProcessor] = {
            target: resolve(link.chunk_processor) for target, link in launch.chunk_links.items()
        }
        self._option_schemas: dict[str, type] = {
            target: resolve_class(link.options_schema)
            for target, link in launch.chunk_links.items() if link.options_schema
        }
        self._extra_schema: type = resolve_class(launch.extra_params) if launch.extra_params else NoOptions

        self.scheduler: Scheduler = scheduler_for(launch.kind)(launch.max_num_seqs, dict(launch.options))
        self.requests: dict[str, StageRequest] = {}
        self.chunk_contexts: dict[str, dict[str, ChunkContext]] = {}  # request -> target -> context
        self.edge_stats: dict[str, dict[str, dict[str, float]]] = {}
        self.aborted: OrderedDict[str, None] = OrderedDict()
        for request_id in launch.aborted_request_ids:
            self.aborted[request_id] = None
            self.adapter.cleanup(request_id, aborted=True)
        self.runner: StageRunner | None = None
        self.steps: StageStep | None = None  # made once the runner is loaded
        self.tensor_parallel: TensorParallelGroup | None = None
        self.running = True
        self.heartbeat = Heartbeat(self.ctx, launch.out_address, self.stage, launch.heartbeat_interval_s)

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> None:
        start = time.perf_counter()
        try:
            context = runner_context(self.launch)
            self.tensor_parallel = context.tensor_parallel
            self.runner = _build_runner(self.launch, context)
            self.runner.load()
            if self.launch.options.get("warmup", True):
                self.runner.warmup()
            self.steps = StageStep(self.scheduler, self.runner, self._deliver, self._fail, self.requests.__contains__,
                                   per_request=bool(self.launch.options.get("step_per_request", False)))
        except Exception as exc:
            logger.exception("loading the runner failed")
            self._send(StageError("", self.stage, f"failed to load {self.launch.runner}: {type(exc).__name__}: {exc}"))
            raise SystemExit(3) from exc
        self.adapter.start()
        self.heartbeat.start()
        self._send(StageReady(self.stage, os.getpid(), time.perf_counter() - start,
                              self.adapter.connector.listen_address, self.runner.max_audio_streams,
                              self.runner.max_audio_stream_s))
        logger.info("ready in %.2f s", time.perf_counter() - start)

        poller = zmq.Poller()
        for sock in (self.ctrl, self.abort_sub, self.wake):
            poller.register(sock, zmq.POLLIN)
        while self.running:
            busy = self.scheduler.has_work()
            events = dict(poller.poll(0 if busy else None))
            if self.abort_sub in events:
                self._drain(self.abort_sub, control_plane.BROADCAST, self._handle_control)
            if self.ctrl in events:
                self._drain(self.ctrl, control_plane.TO_STAGE, self._handle_control)
                for request_id in self.runner.woken_requests():  # a live session's audio came on that socket
                    if request_id in self.requests:
                        self.scheduler.on_input(self.requests[request_id])
            if self.wake in events:
                while self.wake.poll(0):
                    self.wake.recv()
                self._report_save_errors()
            self._collect_chunks()
            if not self.running:
                break
            for request in self.scheduler.finish_exhausted():
                self._deliver(request, RunnerOutput(request.request_id), finished=True)
            if self.scheduler.has_work():
                self.heartbeat.step_started = time.monotonic()
                try:
                    self.steps.run()
                finally:
                    self.heartbeat.step_started = None

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()  # a tensor-parallel runner tells the other ranks to stop here
        if self.tensor_parallel is not None:
            self.tensor_parallel.close()
        self.heartbeat.stop()
        self.adapter.close()
        for relay in [self.out_relay, *self.send_relays.values(), *self.recv_relays_main.values(),
                      *self._recv_relays_chunks.values()]:
            relay.close()
        self.out.close(linger=1000)  # let a last error or output leave
        for sock in (self.ctrl, self.abort_sub, self.wake):
            sock.close(0)
        control_plane.release_context(self.ctx)
        self.ctx.term()

    def _send(self, message: Any) -> None:
        self.out.send(control_plane.encode(message), copy=False)

    def _drain(self, sock: zmq.Socket, decoder: Any, handler: Callable[[Any], None]) -> None:
        while sock.poll(0):
            message = control_plane.decode(decoder, sock.recv(), f"stage {self.stage}")
            if message is not None:
                handler(message)

    # ------------------------------------------------------------------ control
    def _handle_control(self, message: Any) -> None:
        if isinstance(message, Submit):
            self._add_request(message)
        elif isinstance(message, AudioAppend):
            self._append_audio(message)
        elif isinstance(message, DropAudioStream):
            if self.runner is not None and self.runner.max_audio_streams:
                self.runner.drop_audio_stream(message.stream_id)
        elif isinstance(message, ChunkRoutes):
            for target, address in message.routes.items():
                if target in self.send_relays:
                    self.adapter.set_route(target, address)
        elif isinstance(message, Abort):
            for request_id in message.request_ids:
                self._abort(request_id)
        elif isinstance(message, DropSession):
            if self.runner is not None:
                self.runner.end_session(message.session_id)
        elif isinstance(message, StateQuery):
            running, waiting, for_chunk = self.scheduler.counts()
            slots = self.out_relay.slots_in_use() + sum(r.slots_in_use() for r in self.send_relays.values())
            kv_cache = (self.runner.memory_stats() if self.runner is not None else None) or {}
            self._send(StateReply(self.stage, message.nonce, sorted(self.requests), running, waiting, for_chunk,
                                   slots, self.adapter.pending_chunks(), kv_cache))
        elif isinstance(message, Shutdown):
            self.running = False

    def _append_audio(self, message: AudioAppend) -> None:
        """Hand an audio stream's samples to the runner (the engine sends them only to a runner that takes them).
        A malformed append is logged and skipped, never the stage's end: the stream's next append then finds a gap
        in ``seq``, and the request that uses the stream fails."""
        if self.runner is None or not self.runner.max_audio_streams:
            logger.warning("audio stream %s: this stage's runner takes no audio streams", message.stream_id)
            return
        if len(message.pcm) % 4:
            logger.warning("audio stream %s: %d bytes are no float32 samples", message.stream_id, len(message.pcm))
            return
        try:
            self.runner.append_audio(message.stream_id, message.session_id,
                                     np.frombuffer(message.pcm, dtype=np.float32), message.seq)
        except Exception:
            logger.exception("audio stream %s: the append failed", message.stream_id)

    def _add_request(self, message: Submit) -> None:
        request_id = message.request_id
        if request_id in self.aborted or request_id in self.requests:
            return
        request = StageRequest(request_id, dict(message.params), message.emit_final, message.emit_data,
                               list(message.chunk_targets), session_id=message.session_id)
        try:
            for payload in message.inputs:
                request.inputs.append(read_payload(payload, self.recv_relays_main, request_id))
        except (RelayError, ValueError) as exc:
            self._send(StageError(request_id, self.stage, f"input unreadable: {exc}"))
            return
        request.input_finished = message.input_finished
        if request.inputs:
            request.first_input_s = request.arrival_s
        try:  # checked at the API with the same schema; a stage never dies of a request's knobs
            options_from_dict(self._extra_schema, request.params.get("extra"), "extra")
        except FieldError as exc:
            self._fail(request_id, str(exc))
            return
        try:
            problem = self.runner.validate(request.params) if self.runner is not None else None
        except FieldError as exc:  # the request's own input, in this field: the caller's mistake (a 400)
            self._fail(request_id, exc.rule, exc.field)
            return
        if problem is not None:  # fail it alone now rather than inside a batched step later
            self._fail(request_id, problem)
            return
        self.requests[request_id] = request
        if message.chunk_sources:
            self.adapter.register(request_id, list(message.chunk_sources))
        if request.chunk_targets:
            try:
                self.chunk_contexts[request_id] = {
                    target: self._chunk_context(target, message.edge_options.get(f"{self.stage}->{target}", {}))
                    for target in request.chunk_targets}
            except FieldError as exc:  # validated at the API already; a stage never dies of a request's options
                self._send(StageError(request_id, self.stage, str(exc)))
                self._abort(request_id)
                return
        self.scheduler.add(request)
        if self.runner is not None:
            self.runner.admit(request)

    def _chunk_context(self, target: str, overrides: dict[str, Any]) -> ChunkContext:
        """What the chunk processor towards ``target`` knows: the edge's options with this request's overrides
        (validated at the API) and the load when the request arrived."""
        link = self.launch.chunk_links[target]
        options = (options_from_dict(self._option_schemas[target], {**link.options, **overrides},
                                     f"edge_options.{self.stage}->{target}")
                   if target in self._option_schemas else None)
        return ChunkContext(options, len(self.requests), self.launch.max_num_seqs)

    def _collect_chunks(self) -> None:
        for request_id, chunks in self.adapter.take_ready().items():
            request = self.requests.get(request_id)
            if request is None:
                continue
            for chunk in chunks:
                self._count_edge(request_id, chunk)
                if chunk.data is not None:
                    request.inputs.append(chunk.data)
                    if request.first_input_s is None:
                        request.first_input_s = time.perf_counter()
                if chunk.is_last:
                    request.input_finished = True
            self.scheduler.on_input(request)

    def _count_edge(self, request_id: str, chunk: ReceivedChunk) -> None:
        stats = self.edge_stats.setdefault(request_id, {}).setdefault(
            f"{chunk.from_stage}->{self.stage}", {"chunks": 0, "bytes": 0, "transfer_s": 0.0})
        stats["chunks"] += 1
        stats["bytes"] += chunk.nbytes
        stats["transfer_s"] += chunk.transfer_s

    def _report_save_errors(self) -> None:
        while not self.adapter.save_errors.empty():
            request_id, message = self.adapter.save_errors.get()
            if request_id in self.requests:
                self._fail(request_id, message)

    def _abort(self, request_id: str) -> None:
        self.aborted[request_id] = None
        while len(self.aborted) > _ABORTED_MEMORY:
            self.aborted.popitem(last=False)
        request = self.requests.pop(request_id, None)
        self.scheduler.remove(request_id)
        if request is not None and self.runner is not None:
            self.runner.free(request)
        self.adapter.cleanup(request_id, aborted=True)
        self.chunk_contexts.pop(request_id, None)
        self.edge_stats.pop(request_id, None)
        self.out_relay.cleanup(request_id)
        for relay in self.send_relays.values():
            relay.cleanup(request_id)

    # ------------------------------------------------------------------ delivery
    def _deliver(self, request: StageRequest, output: RunnerOutput, finished: bool) -> None:
        """Send a step's output where it goes (the next stages, then the orchestrator: a finished request's
        metrics include what its chunk processors reported); release a finished request."""
        ships = bool(request.chunk_targets) and (output.data is not None or finished)
        if ships and not self._ship_chunks(request, output, finished):
            return
        if not self._emit(request, output, finished):
            return
        if finished:
            self._finish(request)

    def _emit(self, request: StageRequest, output: RunnerOutput, finished: bool) -> bool:
        """Send the orchestrator what it wants of this output (text/audio for the caller, data to forward, the
        finish with metrics). False if the request failed on the way."""
        body: dict[str, Any] = {}
        if request.emit_final and output.audio is not None:
            body["audio"] = output.audio
        if request.emit_final and output.details is not None:
            body["details"] = output.details
        if request.emit_final and output.image is not None:
            body["image"] = output.image
        if request.emit_final and output.progress is not None:
            body["progress"] = output.progress
        if request.emit_data and output.data is not None:
            body["data"] = output.data
        text = output.text_delta if request.emit_final else ""
        if not (body or text or finished):
            return True
        request_id = request.request_id
        try:
            payload = (write_payload(body, self.out_relay, request_id, self.launch.out_inline_threshold_bytes)
                       if body else None)
        except (RelayError, ValueError) as exc:
            self._fail(request_id, f"output could not be sent: {exc}")
            return False
        metrics = self._metrics(request) if finished else None
        self._send(StageOutput(request_id, self.stage, finished, text, output.num_units, payload,
                               output.finish_reason if finished else None, metrics))
        return True

    def _ship_chunks(self, request: StageRequest, output: RunnerOutput, finished: bool) -> bool:
        """Run each outgoing edge's chunk processor on the output and hand ready chunks to the save loop. A
        finished request always ships a last chunk (empty if the processor had nothing left)."""
        request_id = request.request_id
        contexts = self.chunk_contexts[request_id]
        for target in request.chunk_targets:
            state = request.chunk_state.setdefault(target, {})
            try:
                chunks = self.chunk_processors[target](state, output.data or {}, finished, contexts[target])
            except Exception as exc:
                logger.exception("chunk processor for %s failed on %s", target, request_id)
                self._fail(request_id, f"chunk processor for {target} failed: {exc}")
                return False
            for index, chunk in enumerate(chunks):
                self.adapter.save_async(request_id, target, chunk, finished and index == len(chunks) - 1)
            if finished and not chunks:
                self.adapter.save_async(request_id, target, None, True)
        return True

    def _finish(self, request: StageRequest) -> None:
        """Release what this stage holds for a request the scheduler has finished (its chunks still ship)."""
        request_id = request.request_id
        if self.runner is not None:
            self.runner.free(request)
        self.requests.pop(request_id, None)
        self.adapter.cleanup(request_id, aborted=False)
        self.chunk_contexts.pop(request_id, None)
        self.edge_stats.pop(request_id, None)

    def _fail(self, request_id: str, message: str, field: str | None = None) -> None:
        self._send(StageError(request_id, self.stage, message, field))
        self._abort(request_id)

    def _metrics(self, request: StageRequest) -> dict[str, Any]:
        """A finished request's figures. ``arrived_at_s`` (its Submit taken off the socket) and ``sent_at_s`` (this
        message about to be encoded) are raw ``perf_counter`` stamps, CLOCK_MONOTONIC: comparable with the other
        processes' stamps on the same machine, which is how the caller splits its E2E into hops."""
        now = time.perf_counter()
        first_input = request.first_input_s or request.first_scheduled_s or now
        return {
            "arrived_at_s": request.arrival_s,
            "sent_at_s": now,
            "input_wait_s": first_input - request.arrival_s,  # waiting for the upstream stage's first chunk
            "queue_s": max(0.0, (request.first_scheduled_s or now) - first_input),  # input there, not yet scheduled
            "compute_s": request.compute_s,
            "units": request.num_units,
            "prompt_tokens": request.num_prompt_tokens,
            "cached_prompt_tokens": request.num_cached_tokens,
            "max_batch_size": request.max_batch_size,
            "edges": self.edge_stats.get(request.request_id, {}),
        } | request.runner_metrics | {key: value for state in request.chunk_state.values()
                                      for key, value in state.get("metrics", {}).items()}


if __name__ == "__main__":  # started by a placement launcher with the launch spec on stdin
    run_stage_process(sys.stdin.buffer.read())
