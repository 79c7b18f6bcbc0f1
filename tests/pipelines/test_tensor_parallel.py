"""A tensor-parallel thinker (two rank processes, gloo over loopback) serving the default pipeline: the same greedy
answers as one process in every input-broadcast mode, attached images read on every rank, a killed rank handled as
the stage's death, and no rank process left behind."""

from __future__ import annotations

import asyncio
import io
import os
import signal

import numpy as np
import psutil
import pytest
from PIL import Image

from omnipipe import RequestFailedError, SamplingParams
from tests.conftest import EngineHarness, collect, wait_until_idle

pytestmark = pytest.mark.models

PARAMS = SamplingParams(max_tokens=24)
QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Name a fruit that is yellow.",
]
IMAGE_QUESTION = "What colour is the attached image mostly? Answer in one word."


def _image(colour: tuple[int, int, int], fmt: str, size: tuple[int, int] = (1280, 720)) -> bytes:
    rng = np.random.default_rng(0)
    pixels = np.clip(np.array(colour)[None, None, :] + rng.normal(0, 12, (size[1], size[0], 3)), 0, 255)
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format=fmt)
    return buffer.getvalue()


RED_PNG = _image((210, 30, 30), "PNG")
BLUE_JPEG = _image((30, 60, 210), "JPEG", (640, 480))


def _deploy(tp: int, mode: str = "async_raw") -> dict:
    # float32 weights: int8 scales each rank's slice of a row-parallel projection on its own, so two ranks' int8
    # answers are not one rank's; float32 ones are, up to summation order
    return {"stages": {"thinker": {"tensor_parallel_size": tp, "input_broadcast": mode,
                                   "options": {"weights": "float32"},
                                   # the PNG's raw bytes are above it, the JPEG's below: both paths of async_raw
                                   "input_broadcast_threshold_bytes": 256 * 1024}}}


def _prompts() -> list:
    return [*QUESTIONS,
            {"prompt": IMAGE_QUESTION, "multi_modal_data": {"image": RED_PNG}},
            {"prompt": IMAGE_QUESTION, "multi_modal_data": {"image": BLUE_JPEG}}]


def _answers(harness: EngineHarness) -> list[str]:
    """Every prompt at once (they share batches), greedy, text only."""
    async def run() -> list[str]:
        finals = await asyncio.gather(*(collect(harness.engine, p, sampling_params=PARAMS, output_modalities=["text"])
                                        for p in _prompts()))
        return [outputs[-1].text for outputs in finals]
    return harness.run(run(), timeout_s=600)


@pytest.fixture(scope="module")
def single_rank_answers() -> list[str]:
    harness = EngineHarness("default", _deploy(1))
    try:
        return _answers(harness)
    finally:
        harness.close()


def _rank_pids(harness: EngineHarness) -> list[int]:
    return harness.run(harness.engine.debug_state())["rank_pids"]["thinker"]


@pytest.mark.parametrize("mode", ["blocking", "async", "async_raw"])
def test_two_ranks_answer_like_one_in_every_broadcast_mode(mode: str, single_rank_answers: list[str]) -> None:
    harness = EngineHarness("default", _deploy(2, mode))
    try:
        pids = _rank_pids(harness)
        assert len(pids) == 2
        answers = _answers(harness)
        assert answers == single_rank_answers
        assert harness.run(wait_until_idle(harness.engine))["stages"]["thinker"]["requests"] == []
    finally:
        harness.close()
    # shutdown stopped every rank
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def test_the_thinker_reads_attached_images(single_rank_answers: list[str]) -> None:
    red, blue = single_rank_answers[-2:]
    assert "red" in red.lower(), red
    assert "blue" in blue.lower(), blue


@pytest.fixture(scope="module")
def tp2() -> EngineHarness:
    harness = EngineHarness("default", _deploy(2, "async"))
    yield harness
    harness.close()


def _conversation(harness: EngineHarness, session: str) -> list[tuple[str, int]]:
    """Three turns, each one's answer in the next one's history: (answer, prompt tokens from the prefix cache)."""
    async def run() -> list[tuple[str, int]]:
        history: list[dict[str, str]] = []
        turns = []
        for question in QUESTIONS:
            final = (await collect(harness.engine, {"prompt": question, "history": history}, session_id=session,
                                   sampling_params=PARAMS, output_modalities=["text"]))[-1]
            turns.append((final.text, final.metrics.num_cached_tokens))
            history += [{"role": "user", "content": question}, {"role": "assistant", "content": final.text}]
        await harness.engine.end_session(session)
        return turns
    return harness.run(run(), timeout_s=600)


def test_two_ranks_share_the_prefix_cache_alike_and_answer_like_one(tp2: EngineHarness) -> None:
    """Every rank's KV pool shares the same blocks: a conversation's later turns go on from the turn before on
    both ranks (a rank whose reservation shared another count would stop the stage), with one rank's answers."""
    ranks = _rank_pids(tp2)
    single = EngineHarness("default", _deploy(1))
    try:
        want = _conversation(single, "alone")
    finally:
        single.close()
    got = _conversation(tp2, "two-ranks")
    assert [text for text, _ in got] == [text for text, _ in want]
    assert [cached for _, cached in got] == [cached for _, cached in want]
    assert got[1][1] > got[0][1] + 10 and got[2][1] > got[1][1]  # each turn from the one before
    assert _rank_pids(tp2) == ranks  # no rank stopped the stage


def test_a_killed_rank_fails_its_requests_and_the_stage_comes_back(tp2: EngineHarness) -> None:
    before = _rank_pids(tp2)

    async def kill_mid_answer() -> Exception | None:
        stream = tp2.engine.generate("Count from one to one hundred, in words.",
                                     sampling_params=SamplingParams(max_tokens=200), output_modalities=["text"])
        try:
            async for output in stream:
                if output.text:
                    os.kill(before[1], signal.SIGKILL)
        except RequestFailedError as exc:
            return exc
        return None

    error = tp2.run(kill_mid_answer(), timeout_s=300)
    assert error is not None, "the request on the killed rank must fail"
    assert "stage 'thinker' rank 1 (of 2) died" in str(error)

    async def answer_after_restart() -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 240
        while (await tp2.engine.debug_state())["restarts"]["thinker"] < 1 or not tp2.engine.health().ok:
            assert loop.time() < deadline, "the thinker did not come back"
            await asyncio.sleep(0.2)
        outputs = await collect(tp2.engine, QUESTIONS[0], sampling_params=PARAMS, output_modalities=["text"])
        return outputs[-1].text

    assert "paris" in tp2.run(answer_after_restart(), timeout_s=300).lower()
    after = _rank_pids(tp2)
    assert len(after) == 2 and not set(after) & set(before)
    assert not psutil.pid_exists(before[0]) or psutil.Process(before[0]).status() == "zombie"


def test_aborts_while_images_are_on_their_way_leave_nothing(tp2: EngineHarness) -> None:
    async def abort_early(index: int) -> None:
        stream = tp2.engine.generate({"prompt": IMAGE_QUESTION, "multi_modal_data": {"image": RED_PNG}},
                                     request_id=f"early-{index}", sampling_params=PARAMS,
                                     output_modalities=["text"])
        task = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.002 * index)  # stays: each abort lands at another moment of the request's way
        await tp2.engine.abort(f"early-{index}")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def refused_after_decoding() -> str:
        """A question too long in tokens is refused once its image is decoded (the other rank drops its copy)."""
        try:
            await collect(tp2.engine, {"prompt": "why " * 2100, "multi_modal_data": {"image": BLUE_JPEG}},
                          sampling_params=PARAMS, output_modalities=["text"])
        except ValueError as exc:
            return str(exc)
        return ""

    async def run() -> tuple[dict, str]:
        assert "more than the limit of 2048" in await refused_after_decoding()
        await asyncio.gather(*(abort_early(i) for i in range(6)))
        state = await wait_until_idle(tp2.engine)
        outputs = await collect(tp2.engine, {"prompt": IMAGE_QUESTION, "multi_modal_data": {"image": BLUE_JPEG}},
                                sampling_params=PARAMS, output_modalities=["text"])
        return state, outputs[-1].text

    state, answer = tp2.run(run(), timeout_s=300)
    assert state["stages"]["thinker"]["requests"] == []
    assert "blue" in answer.lower()


def test_the_openai_client_asks_about_an_image_of_a_two_rank_server(tmp_path, single_rank_answers) -> None:
    """`omnipipe serve --deploy` with the thinker on two ranks, through the official client."""
    import base64

    import openai

    from tests.server.conftest import API_KEY, running_server

    with running_server("default", _deploy(2), tmp_path, 600) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)
        url = f"data:image/jpeg;base64,{base64.b64encode(BLUE_JPEG).decode()}"
        reply = client.chat.completions.create(
            model="default", max_tokens=PARAMS.max_tokens, temperature=0, modalities=["text"],
            messages=[{"role": "user", "content": [{"type": "text", "text": IMAGE_QUESTION},
                                                   {"type": "image_url", "image_url": {"url": url}}]}])
        assert reply.choices[0].message.content.strip() == single_rank_answers[4].strip()
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model="default", max_tokens=8, modalities=["text"],
                messages=[{"role": "user", "content": [
                    {"type": "text", "text": IMAGE_QUESTION},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])
        assert info.value.body["param"] == "messages[0].content[1].image_url.url"
