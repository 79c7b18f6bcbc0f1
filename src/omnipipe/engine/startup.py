"""Starting a run's stages: the launch of each (its addresses, chunk links and deploy settings), and the wait
until every one says it is ready, failing with a message that names the stage that could not start."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from omnipipe.config.deploy_config import ORCHESTRATOR, DeployConfig, EdgeDeploy
from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.engine.route_plan import streams
from omnipipe.engine.stage_client import StageClient
from omnipipe.stage.launch import ChunkLink, StageLaunch
from omnipipe.transport import control_plane
from omnipipe.transport.messages import StageError, StageReady

READY_POLL_S = 0.5  # how often the wait looks for a stage that ended or a cancelled start-up
LAST_WORDS_S = 0.05  # how long a stage that ended has for its last error message to arrive


class EngineStartError(RuntimeError):
    """A stage could not be started; the message names it."""


def stage_launches(pipeline: PipelineSpec, deploy: DeployConfig, clients: dict[str, StageClient], run_id: str,
                   address: Callable[[str], str], abort_address: str, log_level: str,
                   control_keys: control_plane.ControlKeys | None) -> dict[str, StageLaunch]:
    """Each stage's launch, once its client has bound the addresses it names. ``address(name)`` is where to bind
    the socket ``name``: a consumer of streamed chunks binds its own chunk socket; under tcp its producers learn
    the port it chose from ChunkRoutes."""
    chunk_inputs = {stage.name: address(f"{stage.name}-chunks") for stage in pipeline.stages
                    if any(streams(e, deploy.async_chunk) for e in pipeline.edges_into(stage.name))}
    known_up_front = deploy.transport == "ipc"
    launches = {}
    for stage in pipeline.stages:
        settings = deploy.stage(stage.name)
        client = clients[stage.name]
        links = {}
        for edge in pipeline.edges_from(stage.name):
            if streams(edge, deploy.async_chunk):
                backend, threshold = deploy.edge_relay(edge.source, edge.target)
                link_address = chunk_inputs[edge.target] if known_up_front else None
                links[edge.target] = ChunkLink(link_address, backend, threshold, edge.chunk_processor or "",
                                               dict(deploy.edges.get(edge.name, EdgeDeploy()).options),
                                               edge.options)
        launches[stage.name] = StageLaunch(
            run_id=run_id, stage=stage.name, kind=stage.kind, runner=stage.runner, device=settings.device,
            threads=settings.threads, max_num_seqs=settings.max_num_seqs, options=settings.options,
            ctrl_address=client.ctrl_address, out_address=client.out_address,
            abort_address=abort_address, chunk_listen_address=chunk_inputs.get(stage.name), chunk_links=links,
            extra_params=stage.extra_params,
            out_relay=deploy.relay_between(stage.name, ORCHESTRATOR),
            out_inline_threshold_bytes=deploy.relay.inline_threshold_bytes,
            relay_options=deploy.relay_options(), log_level=log_level,
            heartbeat_interval_s=deploy.heartbeat_interval_s,
            world_size=settings.tensor_parallel_size, input_broadcast=settings.input_broadcast,
            input_broadcast_threshold_bytes=settings.input_broadcast_threshold_bytes,
            cpu_affinity=list(settings.cpu.affinity or []), nice=settings.cpu.nice,
            control_keys=control_keys, host=settings.host,
        )
    return launches


async def wait_ready(clients: list[StageClient], timeout_s: float, cancelled: threading.Event,
                     on_ready: Callable[[StageClient, StageReady, list[str]], None]) -> None:
    """Wait until every client's process says it is ready (``on_ready(client, message, still_pending)`` hears
    each); fail naming the stage if one dies or errs, when ``timeout_s`` (stage_start_timeout_s) has passed, or
    once ``cancelled`` is set."""
    deadline = time.monotonic() + timeout_s
    pending = {c.name: c for c in clients}
    recv_tasks: dict[asyncio.Task[Any], StageClient] = {asyncio.create_task(c.recv()): c for c in clients}
    try:
        while pending:
            if cancelled.is_set():
                raise EngineStartError("start-up cancelled")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EngineStartError(f"stages {', '.join(pending)} did not load within "
                                       f"{timeout_s:.0f} s (stage_start_timeout_s)")
            done, _ = await asyncio.wait(list(recv_tasks), timeout=min(remaining, READY_POLL_S),
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                client = recv_tasks.pop(task)
                message = task.result()
                if isinstance(message, StageReady):
                    pending.pop(client.name, None)
                    client.mark_ready(message)
                    on_ready(client, message, list(pending))
                    continue
                if isinstance(message, StageError) and not message.request_id:
                    client.note_load_error(message.message)
                recv_tasks[asyncio.create_task(client.recv())] = client
            for client in list(pending.values()):
                if client.handle is not None and not client.is_running():
                    await _raise_start_failure(client, recv_tasks)
    finally:
        for task in recv_tasks:
            task.cancel()
        await asyncio.gather(*recv_tasks, return_exceptions=True)


async def _raise_start_failure(client: StageClient, recv_tasks: dict[asyncio.Task[Any], StageClient]) -> None:
    """``client``'s process ended while loading: raise naming it, with its last error message if one came."""
    code = client.exit_code()
    await asyncio.sleep(LAST_WORDS_S)
    for task in [t for t, c in recv_tasks.items() if c is client and t.done()]:
        message = task.result()
        if isinstance(message, StageError):
            client.note_load_error(message.message)
    detail = f": {client.load_error}" if client.load_error else ""
    raise EngineStartError(f"stage {client.name!r} failed to start (exit code {code}){detail}")
