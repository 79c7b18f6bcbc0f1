"""A stage process's device: which one a rank uses (Ray's own-GPU remapping), refused when absent, made current with
TF32; a sticky CUDA error ends the process; a warm-up runs before the stage reports ready."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from omnipipe.stage import step as step_module
from omnipipe.stage.device import enter_device, is_sticky_cuda_error, stage_device
from omnipipe.stage.launch import StageLaunch
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerContext, RunnerOutput, StageRunner
from omnipipe.stage.schedulers.ar import ARScheduler
from omnipipe.stage.stage_core_proc import runner_context
from omnipipe.stage.step import CUDA_ERROR_EXIT, StageStep
from omnipipe.stage.warmup import warm_up
from omnipipe.util.field_error import FieldError


def launch(device: str, **fields: Any) -> StageLaunch:
    return StageLaunch(run_id="r", stage="thinker", kind="ar", runner="x:Y", device=device, threads=1,
                       max_num_seqs=2, options={}, ctrl_address="a", out_address="b", abort_address="c",
                       chunk_listen_address=None, chunk_links={}, out_relay="inline", out_inline_threshold_bytes=0,
                       relay_options={}, **fields)


# ------------------------------------------------------------------------------------------- which device
def test_local_ranks_spread_over_the_hosts_gpus_and_ray_ranks_use_their_own_first_gpu() -> None:
    assert [stage_device("cuda:1", rank, placed_gpus=False) for rank in range(2)] == ["cuda:1", "cuda:2"]
    # Ray: each rank's actor sees only the GPU it was given, as cuda:0, whatever index the deploy file named
    assert [stage_device("cuda:1", rank, placed_gpus=True) for rank in range(2)] == ["cuda:0", "cuda:0"]
    assert stage_device("cpu", 1, placed_gpus=True) == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_stage_on_cuda_without_cuda_refuses_to_load_naming_the_field() -> None:
    with pytest.raises(FieldError, match=r"^stages\.thinker\.device: 'cuda:0' needs a CUDA GPU") as info:
        runner_context(launch("cuda:0"))
    assert info.value.field == "stages.thinker.device"


def test_a_cuda_stage_makes_its_device_current_with_tf32(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "a GPU")
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda value: calls.append(("precision", value)))
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    enter_device("thinker", "cuda:1")
    assert calls == [("set_device", "cuda:1"), ("precision", "high")]
    assert torch.backends.cudnn.allow_tf32 is True
    calls.clear()
    enter_device("thinker", "cpu")
    assert calls == []  # a CPU stage touches no CUDA setting
    with pytest.raises(FieldError, match="'cuda:2' needs cuda:2"):
        enter_device("thinker", "cuda:2")


def test_the_rank_context_carries_the_mapped_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("omnipipe.stage.stage_core_proc.enter_device", lambda stage, device: None)
    assert runner_context(launch("cuda:1")).device == "cuda:1"
    assert runner_context(launch("cuda:1", placed_gpus=True)).device == "cuda:0"


# ------------------------------------------------------------------------------------------- sticky CUDA errors
@pytest.mark.parametrize("error, sticky", [
    (RuntimeError("CUDA error: device-side assert triggered\nCUDA kernel errors might be ..."), True),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), True),
    (torch.AcceleratorError("an accelerator error") if hasattr(torch, "AcceleratorError") else RuntimeError(
        "CUDA error: x"), True),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),
    (ValueError("prompt too long"), False),
])
def test_which_errors_leave_the_cuda_context_broken(error: BaseException, sticky: bool) -> None:
    assert is_sticky_cuda_error(error) is sticky
    try:  # raised from inside another error, as a runner's wrapper might
        raise RuntimeError("the batch failed") from error
    except RuntimeError as wrapped:
        assert is_sticky_cuda_error(wrapped) is sticky


class _Exited(Exception):
    pass


class _FailingRunner(StageRunner):
    def __init__(self, error: Exception) -> None:
        super().__init__(RunnerContext("thinker", "cpu", 1, 2, {}))
        self.error = error

    def load(self) -> None:
        """Nothing to load."""

    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        raise self.error


def _step_once(error: Exception, monkeypatch: pytest.MonkeyPatch, batch: int) -> tuple[list[int], list[str]]:
    exits: list[int] = []
    failed: list[str] = []

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise _Exited

    monkeypatch.setattr(step_module.os, "_exit", fake_exit)
    scheduler = ARScheduler(batch)
    for index in range(batch):
        request = StageRequest(f"r{index}", {}, True, False, [])
        request.inputs.append({"text": "hi"})
        request.input_finished = True
        scheduler.add(request)
    step = StageStep(scheduler, _FailingRunner(error), lambda *a: None, lambda rid, msg, field: failed.append(rid),
                     lambda rid: True)
    with contextlib.suppress(_Exited):
        step.run()
    return exits, failed


@pytest.mark.parametrize("batch", [1, 2])
def test_a_device_side_assert_ends_the_stage_process_so_it_restarts(monkeypatch: pytest.MonkeyPatch,
                                                                     batch: int) -> None:
    exits, failed = _step_once(RuntimeError("CUDA error: device-side assert triggered"), monkeypatch, batch)
    assert exits == [CUDA_ERROR_EXIT] and failed == []


def test_an_ordinary_model_error_fails_its_request_and_the_stage_lives_on(monkeypatch: pytest.MonkeyPatch) -> None:
    exits, failed = _step_once(ValueError("bad prompt"), monkeypatch, 1)
    assert exits == [] and failed == ["r0"]


# ------------------------------------------------------------------------------------------- warm-up
class _CountingRunner(StageRunner):
    """An AR runner that finishes each request after ``max_tokens`` decode steps, counting its calls."""

    def __init__(self) -> None:
        super().__init__(RunnerContext("thinker", "cpu", 1, 4, {}))
        self.calls: list[tuple[bool, int]] = []
        self.freed: list[str] = []

    def load(self) -> None:
        """Nothing to load."""

    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        self.calls.append((not all(request.prefilled for request in batch), len(batch)))
        outputs = []
        for request in batch:
            if not request.prefilled:
                assert request.take_all_inputs() == [{"text": "warm"}]
                request.runner_state, request.prefilled = 0, True
            request.runner_state += 1
            done = request.runner_state > request.params["max_tokens"]
            outputs.append(RunnerOutput.decoded(request.request_id, "length" if done else None, num_units=1))
        return outputs

    def free(self, request: StageRequest) -> None:
        self.freed.append(request.request_id)
        request.runner_state = None


def test_warm_up_runs_prefills_and_a_batched_decode_then_frees_its_requests() -> None:
    runner = _CountingRunner()
    warm_up(runner, [{"text": "warm"}], {"max_tokens": 2}, copies=2)
    assert (True, 1) in runner.calls or (True, 2) in runner.calls
    assert (False, 2) in runner.calls  # a decode step of two rows: the batched shapes get compiled too
    assert sorted(set(runner.freed)) == ["warmup-0", "warmup-1"]


def test_a_warm_up_whose_request_fails_fails_the_stage_start() -> None:
    with pytest.raises(RuntimeError, match="warm-up failed: ValueError: no"):
        warm_up(_FailingRunner(ValueError("no")), [{"text": "warm"}], {}, copies=1)
