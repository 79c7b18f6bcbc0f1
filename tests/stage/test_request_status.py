"""One status per request: a runner names where a step left each request (``RunnerOutput.status``), and only the
scheduler moves the request there, or fails it for a status its stage kind has no use for."""

from __future__ import annotations

import pytest

from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerContext, RunnerOutput, StageRunner
from omnipipe.stage.schedulers.ar import ARScheduler
from omnipipe.stage.schedulers.diffusion import DiffusionScheduler
from omnipipe.stage.schedulers.generation import GenerationScheduler
from omnipipe.stage.step import StageStep

S = RequestStatus


def request(rid: str, inputs: int = 1, finished: bool = True) -> StageRequest:
    r = StageRequest(rid, {}, True, False, [])
    r.inputs.extend({"i": i} for i in range(inputs))
    r.input_finished = finished
    return r


def test_ar_a_request_walks_prefill_decode_wait_and_finish_as_its_outputs_say() -> None:
    s = ARScheduler(max_num_seqs=4)
    r = request("a", finished=False)
    s.add(r)
    assert r.status is S.WAITING
    batch, prefill = s.schedule()
    assert prefill and batch == [r] and r.status is S.PREFILLING
    r.take_all_inputs()
    s.postprocess(r, RunnerOutput("a", status=S.PREFILLING))  # a prompt in pieces: another prefill step
    assert r.status is S.PREFILLING and s.schedule() == ([r], True)
    r.prefilled = True
    s.postprocess(r, RunnerOutput("a"))  # prefilled: it decodes
    assert r.status is S.RUNNING and s.schedule() == ([r], False)
    s.postprocess(r, RunnerOutput("a", status=S.WAITING_FOR_CHUNK))
    assert r.status is S.WAITING_FOR_CHUNK and not s.has_work() and s.counts() == (0, 0, 1)
    r.inputs.append({"i": 1})
    s.on_input(r)  # prefilled already: back to decoding, no second prefill
    assert r.status is S.RUNNING and s.schedule() == ([r], False)
    assert s.postprocess(r, RunnerOutput.decoded("a", "stop")) is True
    assert r.status is S.FINISHED and s.counts() == (0, 0, 0)


def test_ar_a_request_short_of_memory_waits_first_in_line_and_prefills_again() -> None:
    s = ARScheduler(max_num_seqs=4)
    a, b = request("a"), request("b")
    s.add(a)
    s.add(b)
    s.schedule()
    s.postprocess(a, RunnerOutput("a"))
    s.postprocess(b, RunnerOutput("b", status=S.WAITING_FOR_MEMORY))
    assert b.status is S.WAITING_FOR_MEMORY and list(s.waiting) == [b]
    s.add(request("c"))
    assert s.schedule() == ([a], False)  # nothing admitted while memory is short
    s.finish(a)
    batch, prefill = s.schedule()
    assert prefill and [x.request_id for x in batch] == ["b", "c"] and b.status is S.PREFILLING


def test_a_scheduler_refuses_a_status_it_has_no_use_for() -> None:
    s = ARScheduler(max_num_seqs=1)
    r = request("a")
    s.add(r)
    s.schedule()
    with pytest.raises(ValueError, match="FAILED"):
        s.postprocess(r, RunnerOutput.failed("a", "boom"))
    assert GenerationScheduler.RUNNER_STATUSES == DiffusionScheduler.RUNNER_STATUSES == {S.RUNNING, S.FINISHED}
    assert S.WAITING not in ARScheduler.RUNNER_STATUSES and S.FAILED not in ARScheduler.RUNNER_STATUSES


@pytest.mark.parametrize(("fields", "message"), [
    ({"error": "boom"}, "exactly when its status is FAILED"),
    ({"status": S.FAILED}, "exactly when its status is FAILED"),
    ({"finish_reason": "stop"}, "without FINISHED"),
    ({"status": S.WAITING}, "the scheduler's"),
])
def test_an_output_whose_status_contradicts_its_fields_is_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunnerOutput("a", **fields)  # type: ignore[arg-type]


def test_decoded_finishes_only_with_a_reason() -> None:
    assert RunnerOutput.decoded("a", None).status is S.RUNNING
    done = RunnerOutput.decoded("a", "length", num_units=1)
    assert done.status is S.FINISHED and done.finished and done.finish_reason == "length" and done.num_units == 1


class _ScriptedRunner(StageRunner):
    """Answers each request with the status its params name (a failure for ``"fail"``)."""

    def __init__(self) -> None:
        super().__init__(RunnerContext("talker", "cpu", 1, 4, {}))

    def load(self) -> None:
        """Nothing to load."""

    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        outputs = []
        for r in batch:
            r.take_input()
            wanted = r.params["status"]
            outputs.append(RunnerOutput.failed(r.request_id, "bad input", "prompt") if wanted == "fail"
                           else RunnerOutput(r.request_id, status=S[wanted], num_units=1))
        return outputs


def _run_step(statuses: dict[str, str]) -> tuple[dict[str, StageRequest], list[str], list[tuple[str, str, str]]]:
    scheduler = GenerationScheduler(max_num_seqs=4)
    requests = {}
    for rid, status in statuses.items():
        r = StageRequest(rid, {"status": status}, True, False, [])
        r.inputs.extend([{"i": 0}, {"i": 1}])
        requests[rid] = r
        scheduler.add(r)
    delivered: list[str] = []
    failed: list[tuple[str, str, str]] = []
    step = StageStep(scheduler, _ScriptedRunner(), lambda r, o, finished: delivered.append(r.request_id),
                     lambda rid, message, field: failed.append((rid, message, str(field))), lambda rid: True)
    step.run()
    return requests, delivered, failed


def test_a_failed_output_fails_its_request_alone() -> None:
    requests, delivered, failed = _run_step({"ok": "RUNNING", "bad": "fail"})
    assert delivered == ["ok"] and failed == [("bad", "bad input", "prompt")]
    assert requests["bad"].status is S.FAILED and requests["ok"].status is S.WAITING  # its next chunk is there


def test_a_status_the_stage_kind_cannot_schedule_fails_the_request_naming_it() -> None:
    requests, delivered, failed = _run_step({"ok": "FINISHED", "odd": "PREFILLING"})
    assert delivered == ["ok"] and requests["ok"].status is S.FINISHED
    assert [(rid, "PREFILLING" in message) for rid, message, _ in failed] == [("odd", True)]
    assert requests["odd"].status is S.FAILED
