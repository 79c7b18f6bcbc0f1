"""The engine's state snapshot (``AsyncOmni.debug_state``, tests): what the orchestrator and every stage still
hold. Each live stage is asked by a ``StateQuery`` with a nonce; its ``StateReply`` comes back on its output
socket, read by the orchestrator's output handler and handed here."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import zmq.asyncio

from omnipipe.engine.stage_client import StageClient
from omnipipe.transport import control_plane
from omnipipe.transport.messages import StateQuery, StateReply

STAGE_SEND_TIMEOUT_S = 1.0  # a stage whose death is not yet known takes nothing: do not wait for it to come back
REPLIES_TIMEOUT_S = 10.0


class StageReplies:
    """Asks the live stages what they hold and gathers their replies (queries may overlap: each has its nonce)."""

    def __init__(self) -> None:
        self._waiters: dict[int, tuple[asyncio.Future[list[StateReply]], list[StateReply], int]] = {}
        self._nonce = 0

    async def gather(self, clients: Iterable[StageClient]) -> list[StateReply]:
        """The replies of every live stage that is not stalled (a stalled stage cannot answer: its liveness
        reports it instead of holding up the query); whatever came within the timeout."""
        self._nonce += 1
        nonce = self._nonce
        alive = [c for c in clients if c.alive and c.liveness.stalled_since is None]
        future: asyncio.Future[list[StateReply]] = asyncio.get_running_loop().create_future()
        self._waiters[nonce] = (future, [], len(alive))
        for client in alive:
            try:
                await asyncio.wait_for(client.send(StateQuery(nonce)), timeout=STAGE_SEND_TIMEOUT_S)
            except TimeoutError:
                _, replies_so_far, expected = self._waiters[nonce]
                self._waiters[nonce] = (future, replies_so_far, expected - 1)
                if len(replies_so_far) >= expected - 1 and not future.done():
                    future.set_result(replies_so_far)
        try:
            return await asyncio.wait_for(future, timeout=REPLIES_TIMEOUT_S) if alive else []
        except TimeoutError:
            return self._waiters[nonce][1]
        finally:
            self._waiters.pop(nonce, None)

    def on_reply(self, reply: StateReply) -> None:
        """A stage's answer (dropped if its query has already ended)."""
        waiter = self._waiters.get(reply.nonce)
        if waiter is None:
            return
        future, replies, expected = waiter
        replies.append(reply)
        if len(replies) >= expected and not future.done():
            future.set_result(replies)


def state_snapshot(replies: list[StateReply], clients: dict[str, StageClient], held_request_ids: Iterable[str],
                   relay_slots: int, ctx: zmq.asyncio.Context) -> dict[str, Any]:
    """The snapshot as a dict: the requests the orchestrator holds (in flight or parked) and its relay slots in
    use, each stage's reply, and where the stages run."""
    return {
        "orchestrator_requests": sorted(held_request_ids),
        "orchestrator_relay_slots": relay_slots,
        "stages": {
            r.stage: {"requests": r.request_ids, "running": r.num_running, "waiting": r.num_waiting,
                      "waiting_for_chunk": r.num_waiting_for_chunk, "relay_slots": r.relay_slots_in_use,
                      "pending_chunks": r.pending_chunks, **({"kv_cache": r.kv_cache} if r.kv_cache else {})}
            for r in replies
        },
        "pids": {name: c.pid for name, c in clients.items() if c.alive},
        # every rank's process of a tensor-parallel stage, rank order
        "rank_pids": {name: list(c.handle.pids) for name, c in clients.items()
                      if c.alive and c.handle is not None},
        "restarts": {name: c.restarts for name, c in clients.items()},
        # where each stage runs: a Ray node id under placement ray, None on this host
        "nodes": {name: c.handle.node if c.handle is not None else None for name, c in clients.items()},
        # tcp connections the control plane turned away (an unknown CURVE key)
        "refused_connections": control_plane.refused_connections(ctx),
    }
