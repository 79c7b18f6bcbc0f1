"""Every registered pipeline names real code: each dotted path of its spec (runners, processors, option classes,
weights functions, voices) and each tiny checkpoint writer resolves with omnipipe's own resolver to the kind of thing
its field promises, taking the arguments the engine passes. Importing is all this does: no model is loaded."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from omnipipe.config.pipeline_spec import PipelineSpec
from omnipipe.models.registry import PIPELINES, TINY_CHECKPOINTS, get_pipeline
from omnipipe.stage.runner import StageRunner
from omnipipe.util.dotted import DottedPathError, resolve

# a stand-in for each argument the engine passes
ARG = object()


def runner_class(found: Any) -> None:
    assert inspect.isclass(found) and issubclass(found, StageRunner), f"{found!r} is not a StageRunner subclass"
    assert found is not StageRunner, "the interface itself, not a family's runner"
    inspect.signature(found).bind(ARG)  # built with its RunnerContext


def options_class(found: Any) -> None:
    assert inspect.isclass(found) and dataclasses.is_dataclass(found), f"{found!r} is not a dataclass"
    found()  # every option has a default: a request or deploy file that sets none is valid


def function_of(*args: Any, **kwargs: Any) -> Any:
    """A check that the found object is a plain function (not a class) callable with ``args`` and ``kwargs``."""

    def check(found: Any) -> None:
        assert callable(found) and not inspect.isclass(found), f"{found!r} is not a function"
        inspect.signature(found).bind(*args, **kwargs)

    return check


PROMPT_PROCESSOR = function_of(ARG)  # (prompt) -> EntryInput
INPUT_PROCESSOR = function_of(ARG)  # (outputs) -> chunks
CHUNK_PROCESSOR = function_of(ARG, ARG, ARG, ARG)  # (state, output, is_last, ctx) -> chunks
PREPARE_WEIGHTS = function_of(progress=True)
WEIGHTS_STATUS = function_of()
VOICES = function_of(ARG)  # (options of the voice stage) -> voices
TINY_CHECKPOINT = function_of(Path("checkpoint"), seed=0)


def dotted_paths(spec: PipelineSpec) -> Iterator[tuple[str, str, Any]]:
    """(where in the spec, dotted path, the check of what it must name) for every dotted path ``spec`` names."""
    for stage in spec.stages:
        yield f"stages.{stage.name}.runner", stage.runner, runner_class
        if stage.extra_params is not None:
            yield f"stages.{stage.name}.extra_params", stage.extra_params, options_class
    for edge in spec.edges:
        yield f"edges.{edge.name}.input_processor", edge.input_processor, INPUT_PROCESSOR
        if edge.chunk_processor is not None:
            yield f"edges.{edge.name}.chunk_processor", edge.chunk_processor, CHUNK_PROCESSOR
        if edge.options is not None:
            yield f"edges.{edge.name}.options", edge.options, options_class
    yield "prompt_processor", spec.prompt_processor, PROMPT_PROCESSOR
    if spec.prepare_weights is not None:
        yield "prepare_weights", spec.prepare_weights, PREPARE_WEIGHTS
    if spec.weights_status is not None:
        yield "weights_status", spec.weights_status, WEIGHTS_STATUS
    if spec.serving.voices is not None:
        yield "serving.voices", spec.serving.voices, VOICES


def check_spec(spec: PipelineSpec) -> None:
    for where, dotted, check in dotted_paths(spec):
        try:
            found = resolve(dotted)
        except DottedPathError as exc:
            raise AssertionError(f"pipeline {spec.name}: {where}: {exc}") from exc
        try:
            check(found)
        except (AssertionError, TypeError) as exc:  # TypeError: the signature does not take the engine's arguments
            raise AssertionError(f"pipeline {spec.name}: {where} = {dotted!r}: {exc}") from exc


def strings(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """Every string inside a spec (fields, stage options, deploy defaults), with where it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from strings(getattr(value, f.name), f"{where}.{f.name}".lstrip("."))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from strings(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from strings(item, f"{where}[{index}]")
    elif isinstance(value, str):
        yield where, value


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_dotted_path_of_a_pipeline_names_what_its_field_promises(name: str) -> None:
    spec = get_pipeline(name)
    assert spec.name == name
    check_spec(spec)


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_no_dotted_path_of_a_pipeline_goes_unchecked(name: str) -> None:
    """A dotted path anywhere in the spec (a field added later, a stage option, a deploy default) is one of those
    checked above, or at least resolves."""
    spec = get_pipeline(name)
    checked = {dotted for _, dotted, _ in dotted_paths(spec)}
    for where, text in strings(spec):
        if text.startswith("omnipipe.") and text not in checked:
            try:
                resolve(text)
            except DottedPathError as exc:
                raise AssertionError(f"pipeline {name}: {where}: {exc}") from exc


@pytest.mark.parametrize("family", sorted(TINY_CHECKPOINTS))
def test_every_tiny_checkpoint_writer_resolves_for_a_registered_pipeline(family: str) -> None:
    assert family in PIPELINES, f"tiny checkpoint for {family!r}, which is no registered pipeline"
    TINY_CHECKPOINT(resolve(TINY_CHECKPOINTS[family]))


def test_a_misspelled_or_wrong_kind_of_path_fails_the_check() -> None:
    toy = get_pipeline("toy")
    first, *rest = toy.stages
    misspelled = replace(toy, stages=(replace(first, runner=first.runner + "x"), *rest))
    with pytest.raises(AssertionError, match=r"pipeline toy: stages\.thinker\.runner: .* has no attribute"):
        check_spec(misspelled)
    not_a_runner = replace(toy, stages=(replace(first, runner=toy.prompt_processor), *rest))
    with pytest.raises(AssertionError, match="is not a StageRunner subclass"):
        check_spec(not_a_runner)
    wrong_arity = replace(toy, prompt_processor=toy.edges[0].chunk_processor)
    with pytest.raises(AssertionError, match="prompt_processor"):
        check_spec(wrong_arity)
