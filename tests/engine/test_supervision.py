"""Stage supervision without stage processes: a client's own transitions at death (the restart window, the
watchdog's reason reported once), and parked requests released only when every stage of their plan is ready."""

from __future__ import annotations

import collections
import time

import zmq.asyncio

from omnipipe.config.deploy_config import load_deploy
from omnipipe.config.pipeline_spec import EntryInput
from omnipipe.engine.events import AddRequest, EngineEvent
from omnipipe.engine.liveness import StageLiveness
from omnipipe.engine.stage_client import StageClient
from omnipipe.engine.supervision import StageSupervisor
from omnipipe.models.registry import get_pipeline


def make_client(ctx: zmq.asyncio.Context, tmp_path, name: str) -> StageClient:
    return StageClient(ctx, name, launcher=None, ctrl_bind=f"ipc://{tmp_path}/{name}-ctrl",  # type: ignore[arg-type]
                       out_bind=f"ipc://{tmp_path}/{name}-out", liveness=StageLiveness(60.0, None))


def test_a_death_after_the_restart_window_starts_the_count_of_restarts_in_a_row_over(tmp_path) -> None:
    ctx = zmq.asyncio.Context()
    client = make_client(ctx, tmp_path, "s")
    try:
        client.restarts_in_a_row = 2
        client.mark_ready()
        client.alive = True
        assert client.mark_dead(restart_window_s=60.0) is None  # a death, not a kill by the watchdog
        assert (client.alive, client.ready.is_set(), client.restarts_in_a_row) == (False, False, 2)
        client.mark_ready()
        time.sleep(0.02)
        client.kill_stalled("made no progress for 9.0 s")  # no handle: nothing to kill, no reason kept
        assert client.mark_dead(restart_window_s=0.01) is None
        assert client.restarts_in_a_row == 0 and client.ready_since is None
    finally:
        client.close_sockets()
        ctx.destroy(linger=0)


def test_parked_requests_are_released_in_order_once_every_stage_of_their_plan_is_ready(tmp_path) -> None:
    pipeline = get_pipeline("toy")
    deploy = load_deploy(None, pipeline)
    ctx = zmq.asyncio.Context()
    clients = {stage.name: make_client(ctx, tmp_path, stage.name) for stage in pipeline.stages}
    events: list[EngineEvent] = []
    supervisor = StageSupervisor(clients, deploy, launcher=None,  # type: ignore[arg-type]
                                 run_id="test", emit=events.append, fail_requests_of=lambda stage, message: None,
                                 recently_ended=collections.deque())
    first, second = pipeline.stages[0].name, pipeline.stages[-1].name
    try:
        commands = [AddRequest(f"r{i}", EntryInput(first, {}), plan, ["text"], {}, {})
                    for i, plan in enumerate([[first, second], [first], [first, second]])]
        for command in commands:
            supervisor.park(command)
        clients[first].mark_ready()
        assert [command.request_id for command in supervisor.unpark_ready()] == ["r1"]
        clients[second].mark_ready()
        assert [command.request_id for command in supervisor.unpark_ready()] == ["r0", "r2"]
        assert supervisor.parked == {} and events == []
    finally:
        for client in clients.values():
            client.close_sockets()
        ctx.destroy(linger=0)
