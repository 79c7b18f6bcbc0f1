"""The image pipeline through the real engine (a diffusion stage process, the trained digits model): step-level
batching gives each request the image it gets alone, previews and progress, abort at a step boundary, a killed
diffusion stage, and what the model draws, checked by a classifier."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import numpy as np
import pytest

from omnipipe import SamplingParams
from omnipipe.api.async_omni import RequestFailedError
from omnipipe.models.image.judge import recognise
from omnipipe.models.image.processors import NUMBER_WORDS
from omnipipe.util.field_error import FieldError
from tests.conftest import EngineHarness, collect, state_is_idle, wait_until_idle

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def image() -> Any:
    harness = EngineHarness("image", {"stages": {"diffusion": {"max_num_seqs": 16}}})
    yield harness
    harness.close()


def params(seed: int, **extra: Any) -> SamplingParams:
    return SamplingParams(seed=seed, extra=extra)


async def draw(engine: Any, digit: int, seed: int, **extra: Any) -> Any:
    outputs = await collect(engine, f"draw a {NUMBER_WORDS[digit]}", sampling_params=params(seed, **extra))
    return outputs[-1]


def test_concurrent_requests_at_different_steps_get_the_images_they_get_alone(image) -> None:
    steps = [6, 9, 12, 15, 18, 21, 24, 27]

    async def together() -> list[Any]:
        async def late(i: int) -> Any:
            await asyncio.sleep(0.02 * i)  # stays: arrivals spread over the loop, so newcomers join between steps
            return await draw(image.engine, i, 100 + i, steps=steps[i])

        return await asyncio.gather(*(late(i) for i in range(8)))

    batched = image.run(together())
    alone = [image.run(draw(image.engine, i, 100 + i, steps=steps[i])) for i in range(8)]
    assert max(f.metrics.stages["diffusion"]["max_batch_size"] for f in batched) > 1, "nothing was batched"
    for i, (b, a) in enumerate(zip(batched, alone, strict=True)):
        assert b.image.shape == a.image.shape == (8, 8, 1)
        diff = np.abs(b.image.astype(int) - a.image.astype(int)).max()
        assert diff <= 1, f"request {i} ({steps[i]} steps) differs by {diff} batched vs alone"
    assert state_is_idle(image.run(wait_until_idle(image.engine)))


def test_previews_and_progress_come_as_the_loop_goes(image) -> None:
    outputs = image.run(collect(image.engine, "draw a three",
                                sampling_params=params(7, steps=12, preview_every=4, progress=True)))
    progress = [o.details["step"] for o in outputs if o.modality == "progress"]
    previews = [o for o in outputs if o.modality == "image" and o.is_preview]
    finished = [o for o in outputs if o.modality == "image" and not o.is_preview]
    assert [p.details["step"] for p in previews] == [4, 8]
    assert all(p.details["steps"] == 12 for p in previews)
    assert sorted(progress + [p.details["step"] for p in previews]) == list(range(1, 12))
    assert len(finished) == 1 and outputs[-1].finished
    np.testing.assert_array_equal(outputs[-1].image, finished[0].image)


def test_an_abort_mid_loop_takes_effect_at_the_next_step_and_frees_the_stage(image) -> None:
    async def run() -> tuple[Any, Any]:
        outputs = []
        async for out in image.engine.generate("draw a five", request_id="long-loop",
                                               sampling_params=params(3, steps=1000, progress=True)):
            outputs.append(out)
            if out.modality == "progress" and out.details["step"] == 3:
                await image.engine.abort("long-loop")
        return outputs, await wait_until_idle(image.engine)

    outputs, state = image.run(run())
    assert outputs[-1].finished and outputs[-1].finish_reason == "abort" and outputs[-1].image is None
    assert state_is_idle(state), state["stages"]
    after = image.run(draw(image.engine, 5, 3, steps=4))
    assert after.image is not None


def test_a_prompt_naming_no_digit_is_refused_naming_the_prompt(image) -> None:
    with pytest.raises(FieldError) as caught:
        image.run(collect(image.engine, "draw a cat"))
    assert caught.value.field == "prompt" and "the digits 0-9" in caught.value.rule
    with pytest.raises(FieldError, match="several"):
        image.run(collect(image.engine, "draw a three and a four"))


def test_the_digits_model_draws_the_digit_asked_for(image) -> None:
    async def fifty() -> list[Any]:
        return await asyncio.gather(*(draw(image.engine, i % 10, 1000 + i) for i in range(50)))

    finals = image.run(fifty(), timeout_s=600)
    asked = np.array([i % 10 for i in range(50)])
    seen = recognise(np.stack([f.image for f in finals]))
    right = float((seen == asked).mean())
    assert right >= 0.9, \
        f"the judge recognised {right:.0%} of 50 drawn digits as asked ({list(zip(asked, seen, strict=False))})"


def test_a_killed_diffusion_stage_fails_its_requests_and_comes_back(image) -> None:
    async def run() -> tuple[BaseException | None, int]:
        pid = (await image.engine.debug_state())["pids"]["diffusion"]
        error = None
        try:
            async for out in image.engine.generate("draw a two", sampling_params=params(1, steps=1000, progress=True)):
                if out.modality == "progress" and out.details["step"] == 2:
                    os.kill(pid, signal.SIGKILL)
        except RequestFailedError as exc:
            error = exc
        for _ in range(600):
            state = await image.engine.debug_state()
            if state["pids"].get("diffusion") not in (None, pid) and "diffusion" in state["stages"]:
                break
            await asyncio.sleep(0.05)
        return error, pid

    error, pid = image.run(run(), timeout_s=300)
    assert error is not None and "stage 'diffusion' died" in str(error)
    after = image.run(draw(image.engine, 2, 1, steps=4))
    assert after.image is not None
    assert image.run(image.engine.debug_state())["pids"]["diffusion"] != pid
