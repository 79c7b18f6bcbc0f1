"""The diffusion scheduler's three batching policies, driven step by step as the stage loop drives it."""

from __future__ import annotations

import pytest

from omnipipe.stage.request import RequestStatus
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.schedulers.diffusion import DiffusionScheduler
from tests.stage.test_schedulers import request


def run(s: DiffusionScheduler, steps: dict[str, int], arrivals: dict[int, list[str]]) -> list[list[str]]:
    """Drive ``s``: requests named in ``arrivals[k]`` arrive before call k; each needs ``steps[id]`` calls.
    Return the ids of every call's batch."""
    done: dict[str, int] = {}
    calls: list[list[str]] = []
    k = 0
    while True:
        for rid in arrivals.get(k, []):
            s.add(request(rid))
        if not s.has_work():
            if any(a > k for a in arrivals):
                k += 1
                continue
            return calls
        batch, is_prefill = s.schedule()
        assert not is_prefill
        calls.append([r.request_id for r in batch])
        for r in batch:
            done[r.request_id] = done.get(r.request_id, 0) + 1
            status = RequestStatus.FINISHED if done[r.request_id] == steps[r.request_id] else RequestStatus.RUNNING
            s.postprocess(r, RunnerOutput(r.request_id, num_units=1, status=status))
        k += 1


def test_step_level_newcomers_join_between_steps_and_finished_ones_leave_at_once() -> None:
    calls = run(DiffusionScheduler(4), {"a": 3, "b": 2, "c": 2}, {0: ["a"], 1: ["b"], 2: ["c"]})
    assert calls == [["a"], ["a", "b"], ["a", "b", "c"], ["c"]]


def test_step_level_holds_at_most_max_num_seqs() -> None:
    calls = run(DiffusionScheduler(2), {"a": 2, "b": 2, "c": 1}, {0: ["a", "b", "c"]})
    assert calls == [["a", "b"], ["a", "b"], ["c"]]


def test_request_level_newcomers_wait_for_the_whole_batch() -> None:
    s = DiffusionScheduler(4, {"batching": "request"})
    calls = run(s, {"a": 3, "b": 1, "c": 2}, {0: ["a", "b"], 1: ["c"]})
    assert calls == [["a", "b"], ["a"], ["a"], ["c"], ["c"]]


def test_no_batching_runs_one_request_to_its_end_at_a_time() -> None:
    s = DiffusionScheduler(4, {"batching": "none"})
    assert run(s, {"a": 2, "b": 1}, {0: ["a", "b"]}) == [["a"], ["a"], ["b"]]


def test_a_request_waits_for_its_whole_conditioning_outside_the_batch() -> None:
    s = DiffusionScheduler(4)
    r = request("late", inputs=0, finished=False)
    s.add(r)
    assert r.status is RequestStatus.WAITING_FOR_CHUNK and not s.has_work()
    r.inputs.append({"class_label": 3})
    s.on_input(r)
    assert not s.has_work()  # a part of its input is not a whole conditioning
    r.input_finished = True
    s.on_input(r)
    assert s.schedule()[0] == [r] and r.status is RequestStatus.RUNNING


def test_an_aborted_request_leaves_the_batch_at_the_next_step() -> None:
    s = DiffusionScheduler(4)
    for rid in "ab":
        s.add(request(rid))
    assert [r.request_id for r in s.schedule()[0]] == ["a", "b"]
    assert s.remove("a") is not None
    assert [r.request_id for r in s.schedule()[0]] == ["b"]
    assert s.remove("b") is not None and s.counts() == (0, 0, 0) and not s.has_work()


def test_an_unknown_batching_policy_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"options\.batching: must be one of step, request, none, got 'sometimes'"):
        DiffusionScheduler(4, {"batching": "sometimes"})
