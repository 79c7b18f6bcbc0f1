"""Schedulers: continuous batching, max_num_seqs, and WAITING_FOR_CHUNK never blocking the batch."""

from __future__ import annotations

from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.schedulers.ar import ARScheduler
from omnipipe.stage.schedulers.generation import GenerationScheduler


def request(rid: str, inputs: int = 1, finished: bool = True) -> StageRequest:
    r = StageRequest(rid, {}, True, False, [])
    for i in range(inputs):
        r.inputs.append({"i": i})
    r.input_finished = finished
    return r


def test_ar_new_requests_join_a_running_batch_up_to_max_num_seqs() -> None:
    s = ARScheduler(max_num_seqs=3)
    for rid in "ab":
        s.add(request(rid))
    batch, prefill = s.schedule()
    assert prefill and [r.request_id for r in batch] == ["a", "b"]
    for r in batch:
        r.prefilled = True
    batch, prefill = s.schedule()
    assert not prefill and len(batch) == 2
    for rid in "cd":
        s.add(request(rid))
    batch, prefill = s.schedule()  # only one slot left: c joins, d waits
    assert prefill and [r.request_id for r in batch] == ["c"]
    s.finish(s.running[0])  # a leaves
    batch, prefill = s.schedule()  # the running requests decode between two prefill steps
    assert not prefill and [r.request_id for r in batch] == ["b", "c"]
    batch, prefill = s.schedule()
    assert prefill and [r.request_id for r in batch] == ["d"]


def test_ar_a_prefill_in_pieces_alternates_with_the_running_decodes() -> None:
    s = ARScheduler(max_num_seqs=4)
    s.add(request("a"))
    batch, prefill = s.schedule()
    s.postprocess(batch[0], RunnerOutput("a"))  # prefilled at once
    s.add(request("long"))
    phases, pieces = [], 0
    for _ in range(7):
        batch, prefill = s.schedule()
        phases.append((prefill, [r.request_id for r in batch]))
        if prefill:
            pieces += 1
            status = RequestStatus.PREFILLING if pieces < 3 else RequestStatus.RUNNING
            s.postprocess(batch[0], RunnerOutput("long", status=status))
    assert phases == [(False, ["a"]), (True, ["long"]), (False, ["a"]), (True, ["long"]), (False, ["a"]),
                      (True, ["long"]), (False, ["a", "long"])]


def test_ar_a_request_without_kv_memory_waits_at_the_head_until_one_leaves() -> None:
    s = ARScheduler(max_num_seqs=4)
    for rid in "abc":
        s.add(request(rid))
    batch, prefill = s.schedule()
    assert prefill and len(batch) == 3
    s.postprocess(batch[0], RunnerOutput("a"))
    s.postprocess(batch[1], RunnerOutput("b", status=RequestStatus.WAITING_FOR_MEMORY))
    s.postprocess(batch[2], RunnerOutput("c", status=RequestStatus.WAITING_FOR_MEMORY))
    s.add(request("d"))
    assert [r.request_id for r in s.waiting] == ["c", "b", "d"]
    assert s.counts() == (1, 3, 0)
    for _ in range(3):  # nothing is admitted while memory is short: a decodes alone
        batch, prefill = s.schedule()
        assert not prefill and [r.request_id for r in batch] == ["a"]
    s.finish(s.running[0])
    batch, prefill = s.schedule()
    assert prefill and {r.request_id for r in batch} == {"b", "c", "d"}


def test_ar_request_waiting_for_chunk_leaves_the_batch_and_comes_back() -> None:
    s = ARScheduler(max_num_seqs=4)
    streaming = request("s", inputs=0, finished=False)
    s.add(streaming)
    assert streaming.status is RequestStatus.WAITING_FOR_CHUNK and not s.has_work()
    s.add(request("x"))
    batch, _ = s.schedule()
    assert [r.request_id for r in batch] == ["x"]
    streaming.inputs.append({"chunk": 0})
    s.on_input(streaming)
    batch, prefill = s.schedule()  # x decodes between two prefill steps
    assert not prefill and [r.request_id for r in batch] == ["x"]
    batch, prefill = s.schedule()
    assert prefill and [r.request_id for r in batch] == ["s"]
    streaming.prefilled = True
    streaming.take_all_inputs()
    s.park(streaming)  # consumed its input, wants more
    assert streaming.status is RequestStatus.WAITING_FOR_CHUNK
    batch, _ = s.schedule()
    assert [r.request_id for r in batch] == ["x"]


def test_generation_batches_only_requests_with_a_chunk_ready() -> None:
    s = GenerationScheduler(max_num_seqs=2)
    waiting = request("w", inputs=0, finished=False)
    s.add(waiting)
    for rid in "abc":
        s.add(request(rid))
    batch, _ = s.schedule()
    assert [r.request_id for r in batch] == ["a", "b"]  # oldest first, max_num_seqs
    assert waiting.status is RequestStatus.WAITING_FOR_CHUNK
    for r in batch:
        r.take_input()
        s.finish(r)
    batch, _ = s.schedule()
    assert [r.request_id for r in batch] == ["c"]


def test_generation_request_with_exhausted_input_finishes_without_running() -> None:
    s = GenerationScheduler(max_num_seqs=2)
    r = request("done", inputs=0, finished=True)
    s.add(r)
    assert s.exhausted() == [r]
    assert s.schedule()[0] == []
