"""The multimodal broadcaster across two real ranks (gloo over loopback TCP): every rank's inputs equal a local
decode in each mode, cancelling never desyncs the ranks or leaks, and rank 0's and rank 1's collectives are the
same messages in the same order whatever rank 0 does (the property that keeps gloo from hanging or aborting).

One pair of rank processes serves the whole module: each scenario is sent to both, builds its own broadcaster
group, and rank 0 drives rank 1 through the default group as a scheduler would (a "take" command only after rank
0's own ``take`` returned).
"""

from __future__ import annotations

import contextlib
import functools
import io
import multiprocessing as mp
import time
import traceback
from concurrent.futures import CancelledError
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from omnipipe.stage.broadcast import MODES, Broadcaster
from omnipipe.util.net import free_port

RESULT_TIMEOUT_S = 180

# ----- inputs -------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def encoded_image(kind: str, width: int, height: int, seed: int) -> bytes:
    """Noise (which compresses badly, like a photo's detail) as PNG or JPEG bytes; ``garbage`` is not an image."""
    rng = np.random.default_rng(seed)
    if kind == "garbage":
        return rng.integers(0, 256, width * height, dtype=np.uint8).tobytes()
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(
        out, format=kind.upper(), **({"quality": 95} if kind == "jpeg" else {}))
    return out.getvalue()


def raw_inputs(spec: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = {"image": encoded_image(spec["kind"], spec["w"], spec["h"], spec.get("seed", 0))}
    if spec.get("sleep_s"):
        raw["sleep_s"] = spec["sleep_s"]
    return raw


def decode_image(raw: dict[str, Any]) -> dict[str, Any]:
    """The tests' materialise: encoded image bytes to a float32 [3, H, W] tensor (``sleep_s`` keeps it busy)."""
    if raw.get("sleep_s"):
        time.sleep(raw["sleep_s"])
    with Image.open(io.BytesIO(raw["image"])) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    return {"pixels": torch.from_numpy(pixels).permute(2, 0, 1).contiguous(), "size": list(pixels.shape[:2])}


def same_inputs(got: dict[str, Any], raw: dict[str, Any]) -> bool:
    expected = decode_image({"image": raw["image"]})
    return torch.equal(got["pixels"], expected["pixels"]) and got["size"] == expected["size"]


SMALL = {"kind": "png", "w": 16, "h": 16}  # ~1 KB: under the raw threshold
MEDIUM = {"kind": "jpeg", "w": 640, "h": 360, "seed": 1}  # ~0.5 MB
LARGE = {"kind": "png", "w": 1280, "h": 720, "seed": 2}  # ~2.7 MB
BAD_SMALL = {"kind": "garbage", "w": 10, "h": 10}
BAD_LARGE = {"kind": "garbage", "w": 600, "h": 600}  # 360 KB: over the threshold, fails on every rank

# ----- the two ranks ------------------------------------------------------------------------------------------


def command(cmd: Any = None) -> Any:
    """Rank 0 tells rank 1 what to do next, on the default group (the main threads' own)."""
    box = [cmd]
    dist.broadcast_object_list(box, group_src=0)
    return box[0]


def run_script(rank: int, mode: str, ops: list[tuple], raw_threshold_bytes: int = 256 * 1024) -> dict[str, Any]:
    """Rank 0 plays ``ops`` (submit / cancel / take / wait / sleep), then cancels whatever it still holds and
    closes; rank 1 takes what it is told to. Both report their trace, leftovers and checks."""
    trace: list = []
    group = dist.new_group(backend="gloo")
    broadcaster = Broadcaster(mode, rank, 2, group, decode_image, raw_threshold_bytes=raw_threshold_bytes,
                              trace=trace)
    raws: dict[str, dict[str, Any]] = {}
    report: dict[str, Any] = {"trace": trace, "equal": True, "outcomes": {}, "cancels": {}}
    if rank == 0:
        futures = {}
        for op in ops:
            if op[0] == "submit":
                raws[op[1]] = raw_inputs(op[2])
                futures[op[1]] = broadcaster.submit(op[1], raws[op[1]])
            elif op[0] == "cancel":
                returned = broadcaster.cancel(op[1])
                report["cancels"][op[1]] = (returned, futures[op[1]].cancelled())
            elif op[0] == "wait":
                with contextlib.suppress(CancelledError):
                    futures[op[1]].exception(timeout=60)
            elif op[0] == "sleep":
                time.sleep(op[1])
            else:  # take
                try:
                    got = broadcaster.take(op[1], timeout_s=60)
                except CancelledError:
                    report["outcomes"].setdefault(op[1], "cancelled")
                    continue
                except Exception as exc:  # the materialise's own error, or KeyError once taken or cancelled
                    report["outcomes"].setdefault(op[1], type(exc).__name__)
                    continue
                report["outcomes"][op[1]] = "ok"
                report["equal"] &= same_inputs(got, raws[op[1]])
                command(("take", op[1], raws[op[1]]))
        for request_id in broadcaster.pending():
            broadcaster.cancel(request_id)
        report["pending"] = broadcaster.pending()
        report["leftover"] = broadcaster.close()
        command(("end",))
    else:
        while (cmd := command())[0] == "take":
            report["outcomes"][cmd[1]] = "ok"
            report["equal"] &= same_inputs(broadcaster.take(cmd[1], timeout_s=60), cmd[2])
        report["leftover"] = broadcaster.close()  # after rank 0's STOP: what it still holds is a leak
        report["pending"] = broadcaster.pending()
    report["stats"] = {request_id: broadcaster.stats(request_id) for request_id in report["outcomes"]}
    dist.destroy_process_group(group)
    return report


def serve(rank: int, port: int, inbox: Any, outbox: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    while (job := inbox.get()) is not None:
        try:
            outbox.put(("ok", run_script(rank, **job)))
        except BaseException:
            outbox.put(("error", traceback.format_exc()))
            return
    dist.destroy_process_group()


class RankPair:
    def __init__(self) -> None:
        port = free_port()
        ctx = mp.get_context("spawn")
        self.inboxes = [ctx.Queue(), ctx.Queue()]
        self.outboxes = [ctx.Queue(), ctx.Queue()]
        self.processes = [ctx.Process(target=serve, args=(rank, port, self.inboxes[rank], self.outboxes[rank]),
                                      daemon=True) for rank in range(2)]
        for process in self.processes:
            process.start()

    def run(self, mode: str, ops: list[tuple], **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        for inbox in self.inboxes:
            inbox.put({"mode": mode, "ops": ops, **kwargs})
        results = []
        for rank, outbox in enumerate(self.outboxes):
            status, value = outbox.get(timeout=RESULT_TIMEOUT_S)
            assert status == "ok", f"rank {rank} failed:\n{value}"
            results.append(value)
        return results[0], results[1]

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


@pytest.fixture(scope="module")
def ranks() -> Any:
    pair = RankPair()
    yield pair
    pair.close()


def assert_in_step(rank0: dict[str, Any], rank1: dict[str, Any]) -> None:
    assert rank0["trace"] == rank1["trace"]
    assert rank0["trace"][-1] == ("stop", None)
    assert rank0["pending"] == rank0["leftover"] == [] == rank1["pending"] == rank1["leftover"]
    assert rank0["equal"] and rank1["equal"]


# ----- tests --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_every_rank_takes_what_a_local_decode_gives(ranks: RankPair, mode: str) -> None:
    specs = {"small": SMALL, "medium": MEDIUM, "large": LARGE, "bad-small": BAD_SMALL, "bad-large": BAD_LARGE,
             "after-bad": {**MEDIUM, "seed": 3}}
    ops = [("submit", rid, spec) for rid, spec in specs.items()] + [("take", rid) for rid in specs]
    rank0, rank1 = ranks.run(mode, ops)
    assert_in_step(rank0, rank1)
    good = ["small", "medium", "large", "after-bad"]
    assert rank0["outcomes"] == {**dict.fromkeys(good, "ok"), "bad-small": "UnidentifiedImageError",
                                 "bad-large": "UnidentifiedImageError"}
    assert set(rank1["outcomes"]) == set(good)
    sent = [(kind, rid) for kind, rid in rank0["trace"] if kind in ("object", "raw")]
    if mode == "async_raw":  # the small one is materialised on rank 0; the rest go raw, bad-large included
        assert sent == [("object", "small"), ("raw", "medium"), ("raw", "large"), ("raw", "bad-large"),
                        ("raw", "after-bad")]
        assert ("drop", "bad-large") in rank0["trace"]
        assert rank1["stats"]["large"]["materialize_s"] > 0
    else:  # a failed materialise puts nothing on the wire
        assert sent == [("object", rid) for rid in good]
        assert rank1["stats"]["large"]["materialize_s"] == 0.0
    for report in (rank0, rank1):
        assert report["stats"]["large"]["broadcast_s"] > 0


@pytest.mark.parametrize("mode", ["async", "async_raw"])
def test_cancelling_queued_requests_keeps_them_off_the_wire(ranks: RankPair, mode: str) -> None:
    busy = {**SMALL, "sleep_s": 0.5}  # small: materialised on the worker's own thread in both modes
    queued = {"q1": MEDIUM, "q2": LARGE, "q3": {**LARGE, "seed": 5}, "q4": SMALL, "q5": {**MEDIUM, "seed": 6}}
    ops = [("submit", "busy", busy)] + [("submit", rid, spec) for rid, spec in queued.items()]
    ops += [("cancel", "q1"), ("cancel", "q3"), ("cancel", "q4"), ("cancel", "q1")]
    ops += [("take", "busy"), ("take", "q2"), ("take", "q1")]
    ops += [("submit", "late", MEDIUM), ("wait", "late"), ("cancel", "late")]  # sent, then dropped
    rank0, rank1 = ranks.run(mode, ops)
    assert_in_step(rank0, rank1)
    assert rank0["cancels"] == {"q1": (False, True), "q3": (True, True), "q4": (True, True), "late": (True, False)}
    assert rank0["outcomes"] == {"busy": "ok", "q2": "ok", "q1": "KeyError"}
    on_wire = {rid for _, rid in rank1["trace"]}
    assert not on_wire & {"q1", "q3", "q4"}
    assert ("drop", "late") in rank1["trace"] and ("drop", "q5") in rank1["trace"]  # q5 cancelled at the end


OP = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(["small", "raw", "bad-small", "bad-raw"])),
    st.tuples(st.just("cancel"), st.integers(0, 20)),
    st.tuples(st.just("take"), st.integers(0, 20)),
    st.tuples(st.just("sleep"), st.sampled_from([0.0, 0.01, 0.05])),
)
PROPERTY_SPECS = {"small": {"kind": "png", "w": 8, "h": 8}, "raw": {"kind": "png", "w": 96, "h": 96},
                  "bad-small": {"kind": "garbage", "w": 10, "h": 10}, "bad-raw": {"kind": "garbage", "w": 200,
                                                                                   "h": 200}}


def concrete_ops(draws: list[tuple]) -> list[tuple]:
    """Hypothesis draws to a valid script: ids are fresh on submit; cancel and take pick among those submitted
    (already taken or cancelled ones included: cancel is then a no-op, take a KeyError)."""
    ops: list[tuple] = []
    submitted: list[str] = []
    for name, arg in draws:
        if name == "submit":
            submitted.append(f"r{len(submitted)}")
            spec = {**PROPERTY_SPECS[arg], "seed": len(submitted)}
            ops.append(("submit", submitted[-1], spec))
        elif name == "sleep":
            ops.append(("sleep", arg))
        elif submitted:
            ops.append((name, submitted[arg % len(submitted)]))
    return ops


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(MODES), draws=st.lists(OP, min_size=1, max_size=25))
def test_ranks_see_the_same_collectives_in_the_same_order(ranks: RankPair, mode: str, draws: list[tuple]) -> None:
    rank0, rank1 = ranks.run(mode, concrete_ops(draws), raw_threshold_bytes=16 * 1024)
    assert_in_step(rank0, rank1)
    taken = {rid for rid, outcome in rank0["outcomes"].items() if outcome == "ok"}
    assert set(rank1["outcomes"]) == taken


# ----- one rank -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_one_rank_materialises_without_a_group(mode: str) -> None:
    broadcaster = Broadcaster(mode, 0, 1, None, decode_image)
    large, bad = raw_inputs(LARGE), raw_inputs(BAD_SMALL)
    broadcaster.submit("large", large)
    broadcaster.submit("bad", bad)
    assert same_inputs(broadcaster.take("large", timeout_s=30), large)
    with pytest.raises(Exception, match="cannot identify image"):
        broadcaster.take("bad", timeout_s=30)
    assert broadcaster.stats("large")["materialize_s"] > 0
    if mode != "blocking":  # a request queued behind a busy worker is cancelled before it is materialised
        busy = broadcaster.submit("busy", raw_inputs({**SMALL, "sleep_s": 0.3}))
        queued = broadcaster.submit("queued", large)
        assert broadcaster.cancel("queued") and queued.cancelled()
        assert busy.result(timeout=30)["size"] == [16, 16]
        broadcaster.take("busy")
    assert broadcaster.pending() == []
    assert broadcaster.close() == []
    assert broadcaster.close() == []
    with pytest.raises(RuntimeError, match="closed"):
        broadcaster.submit("late", large)


def test_close_reports_what_was_never_taken() -> None:
    broadcaster = Broadcaster("async", 0, 1, None, decode_image)
    broadcaster.submit("kept", raw_inputs(SMALL)).result(timeout=30)
    assert broadcaster.close() == ["kept"]


def test_an_unknown_mode_names_the_choices() -> None:
    with pytest.raises(ValueError, match="blocking, async, async_raw"):
        Broadcaster("eager", 0, 1, None, decode_image)
    with pytest.raises(ValueError, match="process group"):
        Broadcaster("async", 0, 2, None, decode_image)
