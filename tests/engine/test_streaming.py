"""Requests through real stage processes: ordering, completeness, batching, async chunk on vs off."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omnipipe import Omni, SamplingParams
from tests.conftest import collect, wait_until_idle
from tests.engine.expected import expected_audio, expected_text

PROMPTS = [f"request number {i} says hello to stage {i % 3}" for i in range(16)]


def assemble(outputs: list) -> tuple[str, np.ndarray]:
    text = "".join(o.text_delta for o in outputs if o.modality == "text")
    chunks = [o.audio for o in outputs if o.modality == "audio"]
    return text, np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


def test_sixteen_concurrent_requests_stream_in_order_and_complete(toy) -> None:
    async def run() -> list[list]:
        return await asyncio.gather(*(collect(toy.engine, p, request_id=f"r{i}") for i, p in enumerate(PROMPTS)))

    results = toy.run(run())
    for prompt, outputs in zip(PROMPTS, results, strict=True):
        text, audio = assemble(outputs)
        assert text == expected_text(prompt)
        # cumulative text grows one delta at a time, in order
        cumulative = [o.text for o in outputs if o.modality == "text"]
        assert cumulative == [text[: i + 1] for i in range(len(text))]
        np.testing.assert_allclose(audio, expected_audio(text), atol=1e-5)
        final = outputs[-1]
        assert final.finished and final.modality == "final"
        assert sum(1 for o in outputs if o.finished) == 1
        np.testing.assert_array_equal(final.audio, audio)
        assert final.sample_rate_hz == 8000
        m = final.metrics
        assert m.ttft_s is not None and m.ttfp_s is not None and m.e2e_s >= m.ttfp_s
        assert m.num_output_tokens == len(text)
        assert set(m.stages) == {"thinker", "talker", "code2wav"}
        assert m.edges["talker->code2wav"]["chunks"] >= 2
    # the generation stages batched work from several requests into one call
    assert max(out[-1].metrics.stages["code2wav"]["max_batch_size"] for out in results) > 1
    assert max(out[-1].metrics.stages["thinker"]["max_batch_size"] for out in results) > 1
    state = toy.run(wait_until_idle(toy.engine))
    assert not state["orchestrator_requests"]


def test_text_only_request_runs_only_the_thinker(toy) -> None:
    outputs = toy.run(collect(toy.engine, "just text", output_modalities=["text"]))
    text, audio = assemble(outputs)
    assert text == "JUST TEXT" and audio.size == 0
    assert set(outputs[-1].metrics.stages) == {"thinker"}


def test_max_tokens_limits_the_thinker(toy) -> None:
    outputs = toy.run(collect(toy.engine, "abcdefghij", sampling_params=SamplingParams(max_tokens=4)))
    text, audio = assemble(outputs)
    assert text == "ABCD"
    assert outputs[-1].finish_reason == "length"
    np.testing.assert_allclose(audio, expected_audio("ABCD"), atol=1e-5)


@pytest.mark.parametrize("async_chunk", [True, False])
def test_async_chunk_on_and_off_give_identical_outputs(harness_factory, async_chunk: bool) -> None:
    harness = harness_factory("toy", {"async_chunk": async_chunk})

    async def run() -> list[list]:
        return await asyncio.gather(*(collect(harness.engine, p) for p in PROMPTS[:6]))

    for prompt, outputs in zip(PROMPTS[:6], harness.run(run()), strict=True):
        text, audio = assemble(outputs)
        assert text == expected_text(prompt)
        np.testing.assert_allclose(audio, expected_audio(text), atol=1e-5)
        chunks = outputs[-1].metrics.edges["talker->code2wav"]["chunks"]
        assert (chunks > 1) if async_chunk else (chunks == 1)


def test_waiting_for_chunk_does_not_stall_other_requests(harness_factory) -> None:
    """A long request waiting for its next chunk in talker/code2wav must not hold up a short one behind it."""
    harness = harness_factory("toy", {"stages": {"thinker": {"options": {"step_delay_ms": 15}}}})
    long_prompt = "a long answer " * 12
    order: list[str] = []

    async def one(name: str, prompt: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)  # stays: the short request arrives while the long one runs
        async for out in harness.engine.generate(prompt):
            if out.finished:
                order.append(name)

    async def run() -> None:
        await asyncio.gather(one("long", long_prompt, 0), one("short", "hi", 0.3))

    harness.run(run())
    assert order == ["short", "long"]


def test_initial_chunk_override_sets_the_first_chunk_size(toy) -> None:
    outputs = toy.run(collect(toy.engine, "override the first chunk",
                             edge_options={"talker->code2wav": {"initial_codec_chunk_frames": 5}}))
    assert outputs[-1].metrics.stages["talker"]["initial_chunk_frames"] == 5


def test_omni_offline_batch_returns_full_results_in_order(capsys) -> None:
    prompts = ["first prompt", "second one", "third"]
    with Omni("toy") as omni:
        results = omni.generate(prompts)
    assert [r.text for r in results] == [p.upper() for p in prompts]
    # the progress bar counted tokens and audio as they came, then the finished requests
    bar = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert f"Generating: {sum(len(p) for p in prompts)}tok" in bar, bar  # the toy thinker: a token per character
    assert "3/3 requests done" in bar and " s audio" in bar and "0.0 s audio" not in bar
    for result in results:
        assert result.finished
        np.testing.assert_allclose(result.audio, expected_audio(result.text), atol=1e-5)


def test_tts_pipeline_runs_talker_and_vocoder_only(harness_factory) -> None:
    harness = harness_factory("toy_tts")
    outputs = harness.run(collect(harness.engine, "speak this"))
    text, audio = assemble(outputs)
    assert text == ""
    np.testing.assert_allclose(audio, expected_audio("speak this"), atol=1e-5)


def test_tcp_transport_carries_the_same_results(harness_factory) -> None:
    harness = harness_factory("toy", {"transport": "tcp", "host": "127.0.0.1"})
    launch = harness.engine.engine.orchestrator.clients["talker"].launch
    assert launch.ctrl_address.startswith("tcp://127.0.0.1:") and launch.chunk_listen_address == "tcp://127.0.0.1:*"
    announced = harness.engine.engine.orchestrator.chunk_addresses["talker"]  # the port the stage's bind chose
    assert announced.startswith("tcp://127.0.0.1:") and int(announced.rsplit(":", 1)[1]) > 0
    outputs = harness.run(collect(harness.engine, "over tcp"))
    text, audio = assemble(outputs)
    assert text == "OVER TCP"
    np.testing.assert_allclose(audio, expected_audio(text), atol=1e-5)


def test_a_sequential_request_reports_each_hop(harness_factory) -> None:
    """Async chunk off: each stage starts when the one before has finished, so E2E splits into hops whose stamps
    come from the caller, every stage and the caller again; together they are part of the E2E."""
    harness = harness_factory("toy", {"async_chunk": False})
    outputs = harness.run(collect(harness.engine, "hi"))
    metrics = outputs[-1].metrics
    assert list(metrics.hops_s) == ["caller->thinker", "thinker->talker", "talker->code2wav", "code2wav->caller"]
    assert all(seconds > 0 for seconds in metrics.hops_s.values())
    assert sum(metrics.hops_s.values()) < metrics.e2e_s
    for stage in ("thinker", "talker", "code2wav"):
        assert metrics.stages[stage]["arrived_at_s"] < metrics.stages[stage]["sent_at_s"]
