"""Stage kinds: schedulers registered by kind, each owning its postprocess; unserved kinds refused at start."""

from __future__ import annotations

import pytest

from omnipipe import AsyncOmni
from omnipipe.config.pipeline_spec import PipelineSpec, StageSpec
from omnipipe.engine.startup import EngineStartError
from omnipipe.models.registry import get_pipeline
from omnipipe.stage.request import RequestStatus
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.schedulers import SCHEDULERS, UnsupportedStageKindError, has_scheduler, scheduler_for
from omnipipe.stage.schedulers.ar import ARScheduler
from omnipipe.stage.schedulers.diffusion import DiffusionScheduler
from omnipipe.stage.schedulers.generation import GenerationScheduler
from tests.conftest import child_processes
from tests.stage.test_schedulers import request


def test_every_served_kind_has_its_scheduler() -> None:
    assert scheduler_for("ar") is ARScheduler
    assert scheduler_for("generation") is GenerationScheduler
    assert scheduler_for("encoder") is GenerationScheduler
    assert scheduler_for("diffusion") is DiffusionScheduler
    assert not has_scheduler("painting")
    with pytest.raises(UnsupportedStageKindError, match="'painting'"):
        scheduler_for("painting")


def test_ar_postprocess_finishes_only_when_the_runner_says_so() -> None:
    s = ARScheduler(max_num_seqs=2)
    r = request("a", inputs=1, finished=True)
    s.add(r)
    batch, _ = s.schedule()
    r.take_all_inputs()
    assert s.postprocess(r, RunnerOutput("a")) is False and r.status is RequestStatus.RUNNING
    assert s.postprocess(r, RunnerOutput("a", status=RequestStatus.WAITING_FOR_CHUNK)) is False
    assert r.status is RequestStatus.WAITING_FOR_CHUNK
    assert s.postprocess(r, RunnerOutput("a", status=RequestStatus.FINISHED)) is True
    assert r.status is RequestStatus.FINISHED and s.counts() == (0, 0, 0)


def test_generation_postprocess_finishes_on_exhausted_input_and_parks_otherwise() -> None:
    s = GenerationScheduler(max_num_seqs=2)
    r = request("g", inputs=2, finished=False)
    s.add(r)
    r.take_input()
    assert s.postprocess(r, RunnerOutput("g")) is False and r.status is RequestStatus.WAITING
    r.take_input()
    assert s.postprocess(r, RunnerOutput("g")) is False and r.status is RequestStatus.WAITING_FOR_CHUNK
    r.input_finished = True
    assert s.postprocess(r, RunnerOutput("g")) is True and r.status is RequestStatus.FINISHED
    empty = request("e", inputs=0, finished=True)
    s.add(empty)
    assert s.finish_exhausted() == [empty] and empty.status is RequestStatus.FINISHED
    assert s.counts() == (0, 0, 0)


def test_a_stage_kind_without_a_scheduler_is_refused_before_any_process_starts(monkeypatch) -> None:
    monkeypatch.delitem(SCHEDULERS, "diffusion")  # a kind the topology may name that nothing serves
    toy = get_pipeline("toy")
    painter = StageSpec("painter", "diffusion", "omnipipe.models.toy.runners.vocoder:ToyVocoderRunner")
    pipeline = PipelineSpec(name="with_diffusion", description="", stages=(*toy.stages, painter), edges=toy.edges,
                            prompt_processor=toy.prompt_processor, input_modalities=("text",))
    before = {p.pid for p in child_processes()}
    with pytest.raises(EngineStartError, match=r"stage 'painter' has kind 'diffusion'"):
        AsyncOmni(pipeline)
    assert {p.pid for p in child_processes()} <= before
