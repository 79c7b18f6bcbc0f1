"""gloo / nccl relays between two real processes: byte-exact payloads in any order, the abort rule, clean close."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

from omnipipe.config.deploy_config import DeployConfigError, load_deploy
from omnipipe.models.registry import get_pipeline
from omnipipe.transport.relay import torch_dist
from omnipipe.transport.relay.base import RelayError
from omnipipe.transport.relay.registry import create_relay
from omnipipe.transport.relay.torch_dist import TorchDistRelay
from omnipipe.transport.relay_io import write_payload

_SPAWN = multiprocessing.get_context("spawn")


def _describe(value: Any) -> Any:
    """What a reader saw, as plain picklable data: kind, device, dtype, shape and the exact bytes."""
    if isinstance(value, torch.Tensor):
        raw = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return ("torch", value.device.type, str(value.dtype), tuple(value.shape), raw)
    if isinstance(value, np.ndarray):
        return ("numpy", "cpu", value.dtype.str, value.shape, np.ascontiguousarray(value).tobytes())
    if isinstance(value, dict):
        return {key: _describe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_describe(item) for item in value]
    return value


def _reader(conn: Any, device: str | None, default_group: bool) -> None:
    """The reading process: reads the payloads it is sent, in the order given, and answers what it saw."""
    import torch.distributed as dist

    from omnipipe.transport.relay import torch_dist
    from omnipipe.transport.relay.registry import create_receivers
    from omnipipe.transport.relay_io import read_payload

    if default_group:  # like a tensor-parallel stage: the relay's groups must not touch or need this one
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    if device is not None:
        torch_dist.set_process_device(device)
    receivers = create_receivers("td", "rx")
    while True:
        command, argument = conn.recv()
        if command == "read":
            answers = []
            for request_id, payload in argument:
                try:
                    answers.append(("ok", _describe(read_payload(payload, receivers, request_id))))
                except RelayError as exc:
                    answers.append(("error", str(exc)))
            conn.send(answers)
        elif command == "close":
            for receiver in receivers.values():
                receiver.close()
            conn.send([t.name for t in threading.enumerate() if t is not threading.main_thread()])
            return


class Reader:
    def __init__(self, device: str | None = None, default_group: bool = False) -> None:
        self.conn, child = _SPAWN.Pipe()
        self.process = _SPAWN.Process(target=_reader, args=(child, device, default_group), daemon=True)
        self.process.start()

    def read(self, items: list[tuple[str, Any]], timeout_s: float = 30) -> list[tuple[str, Any]]:
        self.conn.send(("read", items))
        assert self.conn.poll(timeout_s), "the reader did not answer"
        return self.conn.recv()

    def close(self) -> list[str]:
        self.conn.send(("close", None))
        assert self.conn.poll(30), "the reader did not close"
        threads = self.conn.recv()
        self.process.join(10)
        return threads


@pytest.fixture(scope="module")
def reader() -> Any:
    r = Reader(default_group=True)
    yield r
    if r.process.is_alive():
        r.close()


def _gloo(**options: Any) -> TorchDistRelay:
    relay = create_relay("gloo", run_id="td", owner="tx", options={"gloo": {"timeout_s": 5, **options}})
    assert isinstance(relay, TorchDistRelay)
    return relay


def _body(i: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(i)
    return {
        "hidden": torch.randn(3, 5, 7, generator=generator),
        "half": torch.randn(33, generator=generator).to(torch.bfloat16),
        "fp16": torch.randn(2, 9, generator=generator).half(),
        "ids": torch.randint(-(2**40), 2**40, (11,), generator=generator),
        "mask": torch.rand(13, generator=generator) > 0.5,
        "scalar": torch.tensor(i, dtype=torch.int32),
        "empty": torch.empty(0, 4),
        "transposed": torch.arange(24, dtype=torch.float64).reshape(4, 6).t(),  # not contiguous
        "complex": torch.randn(3, dtype=torch.complex64, generator=generator),
        "audio": np.arange(1000 + i, dtype=np.int16),
        "codes": [np.full((2, 3), i, np.uint8), {"n": i, "text": "x" * i}],
    }


def test_payloads_of_many_dtypes_and_shapes_arrive_byte_exact(reader: Reader) -> None:
    sender = _gloo()
    try:
        bodies = [_body(i) for i in range(3)]
        payloads = [write_payload(body, sender, f"r{i}", 0) for i, body in enumerate(bodies)]
        assert all(p.backend == "gloo" and p.nbytes == 0 for p in payloads)
        answers = reader.read([(f"r{i}", p) for i, p in enumerate(payloads)])
        for body, (status, seen) in zip(bodies, answers, strict=True):
            assert status == "ok", seen
            expected = _describe(body)
            expected["codes"][0] = _describe(body["codes"][0])
            assert seen == expected
        assert sender.slots_in_use() == 0
    finally:
        sender.close()


def test_reads_in_any_order_and_many_transfers(reader: Reader) -> None:
    sender = _gloo()
    try:
        payloads = [(f"r{i}", write_payload({"x": torch.full((64,), i, dtype=torch.int64)}, sender, f"r{i}", 0))
                    for i in range(200)]
        assert sender.slots_in_use() == 200
        order = list(reversed(payloads[:10])) + payloads[10:][::2] + payloads[10:][1::2]
        answers = reader.read(order)
        for (request_id, _), (status, seen) in zip(order, answers, strict=True):
            assert status == "ok", seen
            assert np.frombuffer(seen["x"][4], np.int64).tolist() == [int(request_id[1:])] * 64
        assert sender.slots_in_use() == 0
    finally:
        sender.close()


def test_byte_payloads_use_put_and_get(reader: Reader) -> None:
    sender = _gloo()
    try:
        metadata = sender.put([(0, memoryview(b"hello ")), (6, memoryview(b"world"))], 11, "r1")
        receiver = TorchDistRelay("gloo")
        try:
            assert bytes(receiver.get(metadata, 11, "r1")) == b"hello world"  # same process, other thread
            with pytest.raises(RelayError, match="does not hold 12 bytes"):
                receiver.get(metadata, 12, "r1")
        finally:
            receiver.close()
    finally:
        sender.close()


def test_abort_rule_sender_cleanup_drops_unread_transfers(reader: Reader) -> None:
    sender = _gloo()
    try:
        aborted = write_payload({"x": torch.ones(1000)}, sender, "aborted", 0)
        kept = write_payload({"x": torch.zeros(10)}, sender, "kept", 0)
        assert sender.slots_in_use() == 2
        sender.cleanup("aborted")  # what the engine does on abort: the unread transfer is released, nothing hangs
        assert sender.slots_in_use() == 1
        (status, message), (kept_status, _) = reader.read([("aborted", aborted), ("kept", kept)])
        assert status == "error" and "gone from its sender" in message and kept_status == "ok"
        (status, message), = reader.read([("kept", kept)])  # taken once only
        assert status == "error" and "gone" in message
        assert sender.slots_in_use() == 0
    finally:
        sender.close()


def test_unread_transfers_are_bounded_and_a_put_past_the_bound_fails_after_the_timeout() -> None:
    sender = _gloo(timeout_s=0.3, max_pending=2)
    try:
        write_payload({"x": torch.ones(4)}, sender, "a", 0)
        write_payload({"x": torch.ones(4)}, sender, "b", 0)
        start = time.monotonic()
        with pytest.raises(RelayError, match="2 transfers held unread.*max_pending"):
            write_payload({"x": torch.ones(4)}, sender, "c", 0)
        assert 0.25 < time.monotonic() - start < 5
        sender.cleanup("a")
        write_payload({"x": torch.ones(4)}, sender, "c", 0)
        assert sender.slots_in_use() == 2
    finally:
        sender.close()
    assert sender.slots_in_use() == 0


def test_a_reader_whose_sender_is_gone_fails_within_the_timeout(reader: Reader) -> None:
    sender = _gloo(timeout_s=2)
    first = write_payload({"x": torch.ones(4)}, sender, "r1", 0)
    second = write_payload({"x": torch.ones(4)}, sender, "r2", 0)
    (status, _), = reader.read([("r1", first)])  # the reader has joined this sender's group
    assert status == "ok"
    sender.close()
    start = time.monotonic()
    (status, message), = reader.read([("r2", second)])
    assert status == "error" and "gloo relay" in message, message
    assert time.monotonic() - start < 10


def test_a_reader_of_a_sender_that_exited_before_it_joined_fails_fast(reader: Reader) -> None:
    sender = _gloo(timeout_s=30)
    payload = write_payload({"x": torch.ones(4), "y": np.ones(3, np.int8)[::-1]}, sender, "r1", 0)  # y: a view
    sender.close()
    start = time.monotonic()
    (status, message), = reader.read([("r1", payload)])
    assert status == "error" and "cannot join the sender" in message, message
    assert time.monotonic() - start < 10  # the connect gives up after 2 s, not the 30 s transfer timeout


def test_a_read_only_array_is_sent_without_a_warning(reader: Reader) -> None:
    sender = _gloo()
    array = np.arange(10, dtype=np.float32)
    array.flags.writeable = False
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            payload = write_payload({"a": array}, sender, "r1", 0)
        (status, seen), = reader.read([("r1", payload)])
        assert status == "ok" and seen["a"][4] == array.tobytes()
    finally:
        sender.close()


def test_a_restarted_reader_joins_afresh_and_the_sender_still_closes_promptly() -> None:
    sender = _gloo()
    first = Reader()
    try:
        (status, _), = first.read([("r1", write_payload({"x": torch.ones(8)}, sender, "r1", 0))])
        assert status == "ok"
        first.process.kill()  # a stage killed mid-run: its group with the sender is dead
        first.process.join(10)
        second = Reader()
        payload = write_payload({"x": torch.arange(8)}, sender, "r2", 0)
        (status, seen), = second.read([("r2", payload)])
        assert status == "ok" and seen["x"][4] == torch.arange(8).numpy().tobytes()
        assert second.close() == []
    finally:
        start = time.monotonic()
        sender.close()  # wakes the thread still waiting for the killed reader's next get
        assert time.monotonic() - start < 5
    assert not [t for t in threading.enumerate() if t.name.startswith("gloo-relay")]


def test_close_leaves_no_thread_or_process() -> None:
    before = set(threading.enumerate())
    native_before = len(os.listdir("/proc/self/task"))
    r = Reader()
    sender = _gloo()
    payloads = [(f"r{i}", write_payload({"x": torch.arange(10) + i}, sender, f"r{i}", 0)) for i in range(3)]
    assert all(status == "ok" for status, _ in r.read(payloads))
    assert any(t.name.startswith("gloo-relay") for t in threading.enumerate())
    sender.close()
    assert r.close() == []  # no Python thread is left in the reader after closing its receivers
    assert not r.process.is_alive() and r.process.exitcode == 0
    assert set(threading.enumerate()) <= before
    deadline = time.monotonic() + 5
    while len(os.listdir("/proc/self/task")) > native_before and time.monotonic() < deadline:
        time.sleep(0.05)  # the store's server and gloo's threads end as their objects go
    assert len(os.listdir("/proc/self/task")) <= native_before
    with pytest.raises(RelayError, match="closed"):
        write_payload({"x": torch.ones(1)}, sender, "late", 0)


def test_the_nccl_reader_device_is_a_cuda_device_named_without_importing_anything() -> None:
    try:
        torch_dist.set_process_device("cuda:1")
        assert torch_dist._process_device == "cuda:1"
        with pytest.raises(ValueError, match="must be cuda"):
            torch_dist.set_process_device("cpu")
    finally:
        torch_dist.set_process_device(None)


def test_a_reader_builds_nothing_until_its_first_get() -> None:
    relay = TorchDistRelay("gloo")
    relay.cleanup("r1")
    relay.close()
    assert relay._store is None and not relay._threads and not relay._peers


def test_deploy_options_reach_both_backends_and_are_validated() -> None:
    toy = get_pipeline("toy")
    config = load_deploy({"relay": {"backend": "gloo", "torch_dist_timeout_s": 5, "torch_dist_max_pending": 3}}, toy)
    assert config.relay_options()["gloo"] == {"host": "127.0.0.1", "timeout_s": 5.0, "max_pending": 3}
    assert config.relay_options()["nccl"] == config.relay_options()["gloo"]
    with pytest.raises(DeployConfigError, match="relay.torch_dist_max_pending: must be an integer >= 1"):
        load_deploy({"relay": {"torch_dist_max_pending": 0}}, toy)
    with pytest.raises(DeployConfigError, match="relay.torch_dist_host: must be a non-empty string"):
        load_deploy({"relay": {"torch_dist_host": ""}}, toy)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_nccl_is_refused_without_cuda_and_the_error_suggests_gloo() -> None:
    with pytest.raises(RelayError, match="'nccl' needs a CUDA device.*'gloo'"):
        create_relay("nccl", run_id="td", owner="tx")


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason="nccl needs a CUDA device per end: NCCL refuses two ranks on one GPU, so 2 GPUs")
def test_nccl_moves_cuda_tensors_gpu_to_gpu() -> None:
    torch.cuda.set_device(0)
    r = Reader(device="cuda:1")
    sender = create_relay("nccl", run_id="td", owner="tx", options={"nccl": {"timeout_s": 30}})
    try:
        body = {"hidden": torch.randn(4, 1024, device="cuda:0"), "ids": torch.arange(5), "audio": np.ones(3, np.int16),
                "half": torch.randn(7, device="cuda:0").to(torch.bfloat16)}
        (status, seen), = r.read([("r1", write_payload(body, sender, "r1", 0))], timeout_s=120)
        assert status == "ok", seen
        expected = _describe(body)
        assert seen["hidden"][1] == "cuda" and seen["half"][1] == "cuda"  # landed on the reader's GPU
        assert seen["ids"] == expected["ids"] and seen["audio"] == expected["audio"]  # host data stays host data
        for name in ("hidden", "half"):
            assert seen[name][2:] == expected[name][2:]  # dtype, shape and bytes
        assert sender.slots_in_use() == 0
    finally:
        sender.close()
        r.close()


def test_the_toy_pipeline_runs_end_to_end_over_gloo_and_an_abort_leaves_nothing_held() -> None:
    from tests.conftest import EngineHarness, collect, state_is_idle, wait_until_idle
    from tests.engine.expected import expected_audio

    slow = {"relay": {"backend": "gloo", "torch_dist_timeout_s": 20},
            "stages": {"talker": {"options": {"call_delay_ms": 10}}, "code2wav": {"options": {"call_delay_ms": 10}}}}
    harness = EngineHarness("toy", slow)
    try:
        engine = harness.engine
        outputs = harness.run(collect(engine, "over gloo"))
        assert outputs[-1].text == "OVER GLOO"
        np.testing.assert_allclose(outputs[-1].audio, expected_audio("OVER GLOO"), atol=1e-5)

        async def abort_at_first_audio() -> dict[str, Any]:
            async for out in engine.generate("a prompt long enough to abort in the middle " * 2, request_id="ab"):
                if out.modality == "audio":
                    await engine.abort("ab")
            return await wait_until_idle(engine)

        state = harness.run(abort_at_first_audio())
        assert state_is_idle(state), state
        assert harness.run(collect(engine, "still works"))[-1].text == "STILL WORKS"
    finally:
        harness.close()
