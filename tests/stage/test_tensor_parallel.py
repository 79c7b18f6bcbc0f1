"""The step channel between two real rank processes (gloo over loopback, the stage's own group setup): every
message rank 0 sends reaches rank 1 whole and in order, short ones in one frame, long ones in two."""

from __future__ import annotations

import multiprocessing as mp
import random
import traceback
from typing import Any

from omnipipe.stage.tensor_parallel import FRAME_BYTES, StepChannel, TensorParallelGroup, free_tcp_address, rank_device


def _messages() -> list[dict[str, Any]]:
    rng = random.Random(7)
    out: list[dict[str, Any]] = [{"op": "empty"}]
    for i in range(60):
        size = rng.choice([0, 10, FRAME_BYTES - 64, FRAME_BYTES, FRAME_BYTES * 3 + 5, 50_000])
        out.append({"op": "step", "i": i, "text": "é" * (size // 2), "ids": [rng.randrange(1 << 40) for _ in range(5)],
                    "nested": {"history": [{"role": "user", "content": "x" * (size % 97)}]}})
    out.append({"op": "stop"})
    return out


def _rank(rank: int, address: str, results: Any) -> None:
    try:
        group = TensorParallelGroup.join(rank, 2, address, "cpu")
        trace: list[Any] = []
        channel = StepChannel(group, trace=trace)
        if rank == 0:
            for message in _messages():
                channel.send(message)
        else:
            while channel.recv()["op"] != "stop":
                pass
        group.close()
        results.put((rank, trace))
    except BaseException:  # noqa: BLE001 - report it to the test
        results.put((rank, traceback.format_exc()))


def test_every_step_reaches_the_other_rank_whole_and_in_order() -> None:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    address = free_tcp_address("127.0.0.1")
    ranks = [ctx.Process(target=_rank, args=(r, address, results)) for r in (0, 1)]
    for process in ranks:
        process.start()
    got = dict(results.get(timeout=120) for _ in ranks)
    for process in ranks:
        process.join(30)
    assert all(isinstance(trace, list) for trace in got.values()), got
    assert got[0] == got[1] == _messages()


def test_ranks_spread_over_gpus_and_share_the_cpu() -> None:
    assert [rank_device("cuda", r) for r in range(2)] == ["cuda:0", "cuda:1"]
    assert rank_device("cuda:2", 1) == "cuda:3"
    assert rank_device("cpu", 1) == "cpu"


def test_a_runner_that_cannot_shard_refuses_two_ranks_at_start() -> None:
    import asyncio

    import pytest

    from omnipipe import AsyncOmni
    from omnipipe.engine.startup import EngineStartError

    async def start() -> None:
        async with AsyncOmni("toy", {"stages": {"talker": {"tensor_parallel_size": 2}}}):
            pass

    with pytest.raises(EngineStartError, match="ToyTalkerRunner does not support tensor_parallel_size > 1"):
        asyncio.run(start())
