"""The orchestrator's side of a stage's sockets: frames are read in order whether they wait already or arrive
while the reader sleeps; a send with no room waits (back-pressure) and later sends stay behind it."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from omnipipe.engine.liveness import StageLiveness
from omnipipe.engine.stage_client import StageClient
from omnipipe.transport import control_plane
from omnipipe.transport.messages import ChunkRoutes, StageOutput, StateQuery


def client_and_stage_end(tmp_path) -> tuple[StageClient, zmq.Context, zmq.Socket, zmq.Socket]:
    ctx = zmq.asyncio.Context()
    client = StageClient(ctx, "s", launcher=None, ctrl_bind=f"ipc://{tmp_path}/ctrl",  # type: ignore[arg-type]
                         out_bind=f"ipc://{tmp_path}/out", liveness=StageLiveness(60.0, None))
    stage_ctx = zmq.Context()
    out = control_plane.make_socket(stage_ctx, zmq.PUSH, client.out_address, bind=False)
    ctrl = control_plane.make_socket(stage_ctx, zmq.PULL, client.ctrl_address, bind=False)
    return client, stage_ctx, out, ctrl


def test_frames_waiting_and_arriving_later_are_all_read_in_order(tmp_path) -> None:
    async def run() -> list[str]:
        client, stage_ctx, out, ctrl = client_and_stage_end(tmp_path)
        try:
            for i in range(3):  # already waiting when the reader starts
                out.send(control_plane.encode(StageOutput(f"r{i}", "s", False)))
            got = [(await client.recv()).request_id for _ in range(3)]

            async def late() -> None:
                for i in range(3, 6):
                    await asyncio.sleep(0.02)  # stays: the reader is asleep on the socket's descriptor by then
                    out.send(control_plane.encode(StageOutput(f"r{i}", "s", False)))

            sender = asyncio.create_task(late())
            got += [(await asyncio.wait_for(client.recv(), 10)).request_id for _ in range(3)]
            await sender
            return got
        finally:
            client.close_sockets()
            out.close(0)
            ctrl.close(0)
            stage_ctx.term()

    assert asyncio.run(run()) == [f"r{i}" for i in range(6)]


def test_a_send_without_room_waits_and_later_sends_queue_behind_it(tmp_path) -> None:
    async def run() -> tuple[bool, list]:
        ctx = zmq.asyncio.Context()
        client = StageClient(ctx, "s", launcher=None, ctrl_bind=f"ipc://{tmp_path}/ctrl",  # type: ignore[arg-type]
                             out_bind=f"ipc://{tmp_path}/out", liveness=StageLiveness(60.0, None))
        stage_ctx = zmq.Context()
        try:
            # no stage connected: a PUSH socket has nowhere to put the message, so the first send must wait
            first = asyncio.create_task(client.send(StateQuery(1)))
            await asyncio.sleep(0.05)  # stays: a stretch in which the send must not complete
            waited = not first.done()
            second = asyncio.create_task(client.send(ChunkRoutes({"t": "ipc://x"})))  # must not overtake the first
            third = asyncio.create_task(client.send(StateQuery(3)))
            await asyncio.sleep(0.01)  # stays: the later sends start (and queue) before the stage connects
            ctrl = control_plane.make_socket(stage_ctx, zmq.PULL, client.ctrl_address, bind=False)
            await asyncio.wait_for(asyncio.gather(first, second, third), 10)
            ctrl.setsockopt(zmq.RCVTIMEO, 10_000)
            received = [control_plane.decode(control_plane.TO_STAGE, ctrl.recv(), "test") for _ in range(3)]
            ctrl.close(0)
            return waited, received
        finally:
            client.close_sockets()
            ctx.destroy(0)
            stage_ctx.term()

    waited, received = asyncio.run(run())
    assert waited
    assert received == [StateQuery(1), ChunkRoutes({"t": "ipc://x"}), StateQuery(3)]
