"""A tensor-parallel stage's process groups, and the step channel rank 0 drives the other ranks with.

A stage with ``tensor_parallel_size: N`` is N rank processes. Rank 0 runs the control loop and the scheduler;
ranks 1..N-1 run no loop of their own: they wait on the step channel for what rank 0 sends (a model call with its
batch: which requests, which tokens) and run their shard of it, so every rank issues the model's collectives in
the same order. Three groups, created in the same order on every rank:

- ``model``: the model's own collectives (all-reduce of row-parallel outputs); gloo on CPU, nccl on CUDA.
- ``steps``: the step channel (gloo: its messages are host bytes).
- ``inputs``: the multimodal input broadcaster's (``stage/broadcast.py``), which runs on a background thread.
  Two gloo collectives in flight on one group abort the process, so each group is used by one thread per process.

Step messages are msgpack (never pickle): one broadcast of a fixed-size frame carries a message that fits, a
second one the rest of a longer one.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import msgspec

logger = logging.getLogger(__name__)

FRAME_BYTES = 4096  # one broadcast carries a step message up to this size (length prefix included)
_LENGTH_BYTES = 8
INIT_TIMEOUT_S = 120.0  # every rank must have joined by then (they load nothing before joining)


def free_tcp_address(host: str) -> str:
    """``tcp://host:port`` with a port free right now (for the ranks of one stage start to meet at)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return f"tcp://{host}:{probe.getsockname()[1]}"


def rank_device(device: str, rank: int) -> str:
    """The device rank ``rank`` computes on: ``cuda`` (or ``cuda:K``) spreads ranks over GPUs K, K+1, ...; a CPU
    stage's ranks all use the CPU."""
    if not device.startswith("cuda"):
        return device
    first = int(device.split(":", 1)[1]) if ":" in device else 0
    return f"cuda:{first + rank}"


@dataclass
class TensorParallelGroup:
    """What a rank of a tensor-parallel stage knows of its group."""

    rank: int
    world_size: int
    model: Any  # torch.distributed ProcessGroup for the model's collectives
    steps: Any  # gloo group of the step channel
    inputs: Any  # gloo group of the input broadcaster

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    @classmethod
    def join(cls, rank: int, world_size: int, address: str, device: str) -> TensorParallelGroup:
        """Meet the other ranks at ``address`` (``tcp://host:port``; rank 0 listens there) and create the groups;
        ``device``: this rank's (``stage/device.py`` made it current: nccl binds the group to it)."""
        import torch.distributed as dist

        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend, init_method=address, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=INIT_TIMEOUT_S))
        model = dist.group.WORLD
        steps = dist.new_group(backend="gloo") if backend != "gloo" else model
        inputs = dist.new_group(backend="gloo")
        logger.info("rank %d of %d joined at %s (%s)", rank, world_size, address, backend)
        return cls(rank, world_size, model, steps, inputs)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class StepChannel:
    """Rank 0 sends each step's message to every other rank, in order; the others receive them one by one."""

    def __init__(self, group: TensorParallelGroup, trace: list[Any] | None = None) -> None:
        import torch

        self._group = group
        self._frame = torch.empty(FRAME_BYTES, dtype=torch.uint8)
        self._encoder = msgspec.msgpack.Encoder()
        self.trace = trace  # when a list: every message sent or received, in order (the ordering tests read it)

    def send(self, message: dict[str, Any]) -> None:
        """Rank 0: broadcast ``message`` (msgpack-encodable) to the other ranks."""
        import torch
        import torch.distributed as dist

        assert self._group.is_driver, "only rank 0 sends steps"
        body = self._encoder.encode(message)
        frame = self._frame.numpy()
        frame[:_LENGTH_BYTES] = memoryview(len(body).to_bytes(_LENGTH_BYTES, "little"))
        head = min(len(body), FRAME_BYTES - _LENGTH_BYTES)
        frame[_LENGTH_BYTES : _LENGTH_BYTES + head] = memoryview(body[:head])
        dist.broadcast(self._frame, src=0, group=self._group.steps)
        if head < len(body):
            rest = torch.frombuffer(bytearray(body[head:]), dtype=torch.uint8)
            dist.broadcast(rest, src=0, group=self._group.steps)
        if self.trace is not None:
            self.trace.append(message)

    def recv(self) -> dict[str, Any]:
        """Ranks 1..N-1: the next message rank 0 sent."""
        import torch
        import torch.distributed as dist

        dist.broadcast(self._frame, src=0, group=self._group.steps)
        frame = self._frame.numpy()
        length = int.from_bytes(frame[:_LENGTH_BYTES].tobytes(), "little")
        head = min(length, FRAME_BYTES - _LENGTH_BYTES)
        body = frame[_LENGTH_BYTES : _LENGTH_BYTES + head].tobytes()
        if head < length:
            rest = torch.empty(length - head, dtype=torch.uint8)
            dist.broadcast(rest, src=0, group=self._group.steps)
            body += rest.numpy().tobytes()
        message = msgspec.msgpack.decode(body)
        if self.trace is not None:
            self.trace.append(message)
        return message
