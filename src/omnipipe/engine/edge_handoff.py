"""The handoff over a non-streaming edge: the upstream stage's whole output, turned into the downstream stage's
input by the edge's input processor and written to the edge's relay.

A handoff runs in a worker thread, so that a heavy one holds up no other stage's outputs. A worker thread's round
trip costs two thread wake-ups (~0.3 ms measured on a loaded machine), more than a light handoff's work, so an
edge whose last INLINE_AFTER_FAST handoffs each took under INLINE_HANDOFF_S runs its handoffs of an output up to
INLINE_HANDOFF_BYTES on the loop itself; one that takes longer sends the edge back to the worker thread until it
has been fast that many times in a row again. The cost of a wrong guess is bounded: one slow handoff on the loop
after a run of fast ones.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from omnipipe.config.deploy_config import DeployConfig
from omnipipe.config.pipeline_spec import EdgeSpec, PipelineSpec
from omnipipe.transport.messages import Payload
from omnipipe.transport.relay.base import Relay
from omnipipe.transport.relay_io import write_payload
from omnipipe.util.dotted import resolve

INLINE_HANDOFF_BYTES = 64 << 10
INLINE_HANDOFF_S = 0.001
INLINE_AFTER_FAST = 8


class EdgeHandoffs:
    """Every non-streaming edge of a pipeline: its input processor, and how fast its recent handoffs were."""

    def __init__(self, pipeline: PipelineSpec, deploy: DeployConfig) -> None:
        self.deploy = deploy
        self._input_processors = {e.name: resolve(e.input_processor) for e in pipeline.edges}
        self._fast_handoffs: dict[str, int] = {}  # edge -> its handoffs in a row that took under INLINE_HANDOFF_S

    def runs_inline(self, edge: EdgeSpec, output_bytes: int) -> bool:
        """Whether a handoff of an output of ``output_bytes`` over ``edge`` is cheaper on the loop than in a thread."""
        return (output_bytes <= INLINE_HANDOFF_BYTES
                and self._fast_handoffs.get(edge.name, 0) >= INLINE_AFTER_FAST)

    async def run(self, edge: EdgeSpec, outputs: list[dict[str, Any]], relay: Relay, request_id: str,
                  inline: bool) -> list[Payload]:
        """The downstream stage's input payloads, written to ``relay``; in a worker thread unless ``inline``.
        Raises what the input processor or the relay raises."""
        _, threshold = self.deploy.edge_relay(edge.source, edge.target)

        def handoff() -> list[Payload]:
            began = time.perf_counter()
            inputs = self._input_processors[edge.name](outputs)
            payloads = [write_payload(item, relay, request_id, threshold) for item in inputs]
            fast = time.perf_counter() - began < INLINE_HANDOFF_S
            self._fast_handoffs[edge.name] = self._fast_handoffs.get(edge.name, 0) + 1 if fast else 0
            return payloads

        return handoff() if inline else await asyncio.to_thread(handoff)
