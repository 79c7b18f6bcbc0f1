"""One request that makes a runner raise fails alone: its batch-mates come out exactly as if it had not been there.

The toy runners' ``extra["fail"]`` knob (a test-only fault injection, on where the deploy sets the stages'
``fault_injection`` option) makes the thinker or talker raise for one request in the middle of a batched call,
after its batch-mates' inputs were taken and (thinker) their state advanced, so a correct retry must restore them.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omnipipe import RequestFailedError, SamplingParams
from omnipipe.util.field_error import FieldError
from tests.conftest import EngineHarness, collect, state_is_idle, wait_until_idle
from tests.engine.expected import expected_audio, expected_text

DEPLOY = {
    "stages": {
        # requests pile up between steps and run batched
        "thinker": {"options": {"step_delay_ms": 15, "fault_injection": True}},
        "talker": {"options": {"call_delay_ms": 80, "fault_injection": True}},  # chunks of several pile up meanwhile
        "code2wav": {"options": {"call_delay_ms": 5}},
    }
}
INNOCENT = ["the first innocent bystander", "a second innocent one, longer than the first", "third"]


@pytest.fixture(scope="module")
def engine():
    harness = EngineHarness("toy", DEPLOY)
    yield harness
    harness.close()


def assemble(outputs: list) -> tuple[str, np.ndarray]:
    text = "".join(o.text_delta for o in outputs if o.modality == "text")
    chunks = [o.audio for o in outputs if o.modality == "audio"]
    return text, np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


async def _culprit(engine, params: dict, request_id: str) -> BaseException | None:
    try:
        await collect(engine, "the culprit of this batch " * 2, request_id=request_id, sampling_params=params)
    except RequestFailedError as exc:
        return exc
    return None


def _run_with_culprit(harness: EngineHarness, params: dict, name: str, blocker: bool = False):
    """Three innocent requests and a culprit submitted together (culprit in the middle of the batch)."""

    async def run():
        engine = harness.engine
        if blocker:  # keep the thinker busy so that the next four arrive together and are prefilled as one batch
            agen = engine.generate("a blocker that keeps the thinker stepping " * 2, request_id=f"{name}-blocker",
                                   output_modalities=["text"])
            await agen.__anext__()
        tasks = [collect(engine, INNOCENT[0], request_id=f"{name}-0"), _culprit(engine, params, f"{name}-culprit"),
                 *(collect(engine, p, request_id=f"{name}-{i}") for i, p in enumerate(INNOCENT[1:], 1))]
        results = await asyncio.gather(*tasks)
        if blocker:
            async for _ in agen:
                pass
        return results[1], [results[0], *results[2:]], await wait_until_idle(engine)

    return harness.run(run())


def _check_innocents(results: list) -> None:
    for prompt, outputs in zip(INNOCENT, results, strict=False):
        text, audio = assemble(outputs)
        assert text == expected_text(prompt)
        np.testing.assert_allclose(audio, expected_audio(text), atol=1e-5)
        assert outputs[-1].finished and outputs[-1].text == text


@pytest.mark.parametrize("fail, blocker", [(True, True), (3, False)], ids=["prefill", "decode-step-3"])
def test_thinker_fault_fails_only_its_request(engine, fail, blocker) -> None:
    error, innocents, state = _run_with_culprit(engine, {"thinker": SamplingParams(extra={"fail": fail})},
                                                f"thinker-{fail}", blocker)
    assert error is not None, "the culprit must fail"
    assert "stage 'thinker'" in str(error) and "injected fault" in str(error)
    _check_innocents(innocents)
    # the decode fault hit a running batch of all four: the innocents were batched with the culprit
    assert all(out[-1].metrics.stages["thinker"]["max_batch_size"] > 1 for out in innocents)
    assert state_is_idle(state), state


def test_talker_fault_fails_only_its_request(engine) -> None:
    error, innocents, state = _run_with_culprit(engine, {"talker": SamplingParams(extra={"fail": True})}, "talker")
    assert error is not None, "the culprit must fail"
    assert "stage 'talker'" in str(error) and "injected fault" in str(error)
    _check_innocents(innocents)
    assert state_is_idle(state), state


def test_bad_speed_is_refused_at_the_api() -> None:
    """The talker's knobs are checked against its schema (``ToyTalkerParams``) before the request starts."""
    from omnipipe.models.registry import get_pipeline

    schema = get_pipeline("toy").stage_extra_schema("talker")
    with pytest.raises(FieldError, match=r"sampling_params\.extra\.speed: must be a number"):
        SamplingParams(extra={"speed": "fast"}).check_extra(schema)


def test_bad_speed_that_slips_past_the_api_fails_only_its_request_on_arrival(engine, monkeypatch) -> None:
    """The stage checks the same schema when a request arrives, and fails that request alone."""
    monkeypatch.setattr(engine.engine, "_params_by_stage", lambda params: {
        stage: p.to_dict() for stage, p in (params or {}).items()})
    error, innocents, state = _run_with_culprit(engine, {"talker": SamplingParams(extra={"speed": "fast"})}, "speed")
    assert error is not None and "stage 'talker'" in str(error) and "extra.speed" in str(error)
    _check_innocents(innocents)
    assert state_is_idle(state), state


def test_engine_keeps_serving_after_faults(engine) -> None:
    text, audio = assemble(engine.run(collect(engine.engine, "all good")))
    assert text == "ALL GOOD"
    np.testing.assert_allclose(audio, expected_audio(text), atol=1e-5)


@pytest.mark.parametrize("seed", [-7, 2**64, 1.5, True])
def test_seed_torch_cannot_use_is_a_field_error(seed) -> None:
    with pytest.raises(FieldError, match=r"sampling_params\.seed"):
        SamplingParams(seed=seed)


@pytest.mark.parametrize("seed", [0, 2**64 - 1])
def test_seed_bounds_accepted(seed) -> None:
    assert SamplingParams(seed=seed).seed == seed


@pytest.mark.parametrize("field, value", [("top_k", 10**7), ("max_tokens", 10**6)])
def test_unbounded_values_are_field_errors(field, value) -> None:
    with pytest.raises(FieldError, match=rf"sampling_params\.{field}"):
        SamplingParams(**{field: value})
