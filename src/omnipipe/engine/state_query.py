"""The engine's state snapshot (``AsyncOmni.debug_state``, tests): what the orchestrator and every stage still
hold. Each ready stage is asked by a ``StateQuery`` with a nonce; its ``StateReply`` comes back on its output
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
    """Asks the ready stages what they hold and gathers their replies (queries may overlap: each has its nonce)."""

    def __init__(self) -> None:
        # per query: its result, the replies so far, and the stages whose reply is still awaited
        self._waiters: dict[int, tuple[asyncio.Future[list[StateReply]], list[StateReply], set[str]]] = {}
        self._nonce = 0

    async def gather(self, clients: Iterable[StageClient]) -> list[StateReply]:
        """The replies of every ready stage that is not stalled; whatever came within the timeout. A stalled stage
        cannot answer (its liveness reports it instead of holding up the query); nor can a stage that is starting
        again after a death, before it is ready: it is not asked (a query sent in the moment after a death can
        even go to the dead process's connection, which ZMQ has not dropped yet, and be lost). A stage that dies
        while its reply is awaited is not waited for (``stage_gone``)."""
        self._nonce += 1
        nonce = self._nonce
        asked = [c for c in clients if c.alive and c.ready.is_set() and c.liveness.stalled_since is None]
        if not asked:
            return []
        future: asyncio.Future[list[StateReply]] = asyncio.get_running_loop().create_future()
        replies: list[StateReply] = []
        self._waiters[nonce] = (future, replies, {c.name for c in asked})
        try:
            for client in asked:
                try:
                    await asyncio.wait_for(client.send(StateQuery(nonce)), timeout=STAGE_SEND_TIMEOUT_S)
                except TimeoutError:
                    self._not_awaited(nonce, client.name)
            return await asyncio.wait_for(future, timeout=REPLIES_TIMEOUT_S)
        except TimeoutError:
            return list(replies)
        finally:
            self._waiters.pop(nonce, None)

    def on_reply(self, reply: StateReply) -> None:
        """A stage's answer (dropped if its query has already ended)."""
        waiter = self._waiters.get(reply.nonce)
        if waiter is None:
            return
        waiter[1].append(reply)
        self._not_awaited(reply.nonce, reply.stage)

    def stage_gone(self, stage: str) -> None:
        """``stage`` died: no query waits for its reply any longer."""
        for nonce in list(self._waiters):
            self._not_awaited(nonce, stage)

    def _not_awaited(self, nonce: int, stage: str) -> None:
        future, replies, pending = self._waiters[nonce]
        pending.discard(stage)
        if not pending and not future.done():
            future.set_result(list(replies))


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
