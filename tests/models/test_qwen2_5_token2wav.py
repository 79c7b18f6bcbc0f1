"""The Qwen2.5-Omni token2wav stage batched over requests, on the tiny checkpoint's token2wav: windows of several
requests (different lengths, different starts, different voices and seeds) decoded together equal each request
decoded alone; a step makes the same number of DiT forwards whatever its batch size, and encodes a voice once per
request; the bfloat16 path runs and stays near float32; a request whose codes fall outside the codebook fails
alone, refused before any embedding."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
import torch

from omnipipe.models.qwen2_5_omni.modeling.token2wav_dit import NUM_STEPS
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerContext, RunnerOutput
from omnipipe.stage.schedulers.generation import GenerationScheduler
from omnipipe.stage.step import StageStep

# (request id, speaker, seed, codes, the step it joins at); windows of 12 new codes (6 for a first window), 12 left
# context codes (one DiT block) and 4 right: every step mixes windows of different lengths and starts
REQUESTS = (("a", "Chelsie", 1, 40, 0), ("b", "Ethan", 2, 29, 0), ("c", "Chelsie", 3, 17, 1),
            ("d", "Ethan", 4, 52, 2), ("e", "Chelsie", 5, 9, 2))
FIRST_CHUNK, CHUNK, LEFT, RIGHT = 6, 12, 12, 4
# batched against alone, float32: a padded window's attention and matmuls add in another order, so rounding
# differs; measured max |diff| 1.1e-8 with audio absmax 1.7e-2 (6.7e-7 of absmax)
BATCH_BOUND = 1e-5
# the DiT's mels, batched over padded windows against each alone: measured 6e-8 of absmax
MEL_BOUND = 1e-6
# bfloat16 against float32 (the same windows, the ODE in float32 both): measured 1.6e-2 of absmax
BF16_BOUND = 5e-2
pytestmark = pytest.mark.slow  # a tiny Qwen2.5-Omni checkpoint written and decoded

EVALUATIONS_PER_STEP = (NUM_STEPS - 1) * 4  # RK4: four DiT evaluations per interval of the 10-point schedule


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from omnipipe.models.qwen2_5_omni.weights.tiny import write_tiny_checkpoint

    torch.set_num_threads(1)
    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen2_5_token2wav"), seed=0)


def _runner(checkpoint, dtype: str = "float32"):
    from omnipipe.models.qwen2_5_omni.runners.token2wav import Qwen25Token2WavRunner

    runner = Qwen25Token2WavRunner(RunnerContext("token2wav", "cpu", 1, 8, {"model": str(checkpoint),
                                                                             "dtype": dtype}))
    runner.load()
    return runner


@pytest.fixture(scope="module")
def runner(checkpoint):
    return _runner(checkpoint)


def _chunks(name: str, speaker: str, count: int) -> list[dict]:
    """The request's windows as the talker -> token2wav edge cuts them."""
    codes = torch.randint(0, 96, (count,), generator=torch.Generator().manual_seed(sum(map(ord, name)))).numpy()
    chunks, start = [], 0
    while start < count:
        new = min(FIRST_CHUNK if start == 0 else CHUNK, count - start)
        context, lookahead = min(LEFT, start), min(RIGHT, count - start - new)
        frames = codes[start - context : start + new + lookahead].reshape(1, -1)
        chunks.append({"frames": frames, "start_frame": start, "context_frames": context,
                       "lookahead_frames": lookahead, "speaker": speaker})
        start += new
    return chunks


def _requests(names: tuple[str, ...] | None = None) -> dict[str, tuple[StageRequest, deque, int]]:
    return {name: (StageRequest(name, {"seed": seed}, True, False, []), deque(_chunks(name, speaker, count)), join)
            for name, speaker, seed, count, join in REQUESTS if names is None or name in names}


def _run(runner, requests, on_step=None) -> dict[str, list[np.ndarray]]:
    """Step the runner: every joined request with a window left gives one to the step; the audio per request."""
    audio: dict[str, list[np.ndarray]] = {name: [] for name in requests}
    step = 0
    while any(chunks for _, chunks, _ in requests.values()):
        batch = []
        for request, chunks, join in requests.values():
            if join <= step and chunks:
                request.inputs.append(chunks.popleft())
                batch.append(request)
        if batch:
            for request, output in zip(batch, runner.execute(batch), strict=True):
                audio[request.request_id].append(output.audio)
            if on_step is not None:
                on_step(len(batch))
        step += 1
    return audio


def _alone(runner) -> dict[str, list[np.ndarray]]:
    return {name: _run(runner, _requests((name,)))[name] for name, *_ in REQUESTS}


@pytest.fixture(scope="module")
def alone(runner):
    return _alone(runner)


def _relative_error(got: dict[str, list[np.ndarray]], want: dict[str, list[np.ndarray]]) -> float:
    error = 0.0
    for name, pieces in want.items():
        assert [len(p) for p in got[name]] == [len(p) for p in pieces]
        whole, other = np.concatenate(pieces), np.concatenate(got[name])
        error = max(error, float(np.abs(whole - other).max() / np.abs(whole).max()))
    return error


def test_the_dit_sampler_batched_over_padded_windows_equals_each_alone(runner) -> None:
    from omnipipe.models.qwen2_5_omni.modeling.token2wav_dit import dit_mels, speaker_conditioning

    voices = [speaker_conditioning(runner.model, *runner.speakers[name]) for name in ("Chelsie", "Ethan", "Chelsie")]
    generator = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, 96, (n,), generator=generator) for n in (2, 13, 28)]
    noises = [torch.randn(2 * n, 80, generator=generator) for n in (2, 13, 28)]
    batched = dit_mels(runner.model, codes, voices, noises)
    for i, mel in enumerate(batched):
        alone = dit_mels(runner.model, codes[i : i + 1], voices[i : i + 1], noises[i : i + 1])[0]
        assert mel.shape == alone.shape == (80, 2 * len(codes[i]))
        # without the padding mask the short windows are off by 1.5e-5 of absmax
        assert (mel - alone).abs().max() <= MEL_BOUND * alone.abs().max()


def test_batched_windows_equal_each_request_alone(runner, alone) -> None:
    batch_sizes = []
    batched = _run(runner, _requests(), on_step=batch_sizes.append)
    assert max(batch_sizes) == len(REQUESTS)  # every request in one step at least once
    assert _relative_error(batched, alone) <= BATCH_BOUND
    # the samples per window are what its new codes make (24 kHz: 2 mel frames of 240 samples per code)
    pieces = [len(p) for p in batched["a"]]
    assert pieces == [6 * 480] + [12 * 480] * 2 + [10 * 480]


def test_a_step_makes_the_same_dit_forwards_for_one_request_and_for_eight(runner) -> None:
    dit = runner.model.code2wav_dit_model
    forwards, voices = [], []
    hooks = [dit.proj_out.register_forward_hook(lambda *_: forwards.append(1)),
             dit.input_embed.spk_encoder.register_forward_hook(lambda *_: voices.append(1))]
    per_step = []

    def count(batch_size: int) -> None:
        per_step.append((batch_size, len(forwards)))
        forwards.clear()

    try:
        requests = {f"r{i}": (StageRequest(f"r{i}", {"seed": i}, True, False, []),
                              deque(_chunks(f"r{i}", "Chelsie", 30)), 0 if i < 7 else 1) for i in range(8)}
        _run(runner, requests, on_step=count)
    finally:
        for hook in hooks:
            hook.remove()
    assert {size for size, _ in per_step} >= {1, 7, 8}
    assert all(n == EVALUATIONS_PER_STEP for _, n in per_step), per_step
    assert len(voices) == 8  # each request's voice encoded once, at its first window


def test_bfloat16_runs_and_stays_near_float32(checkpoint, alone) -> None:
    runner = _runner(checkpoint, "bfloat16")
    assert next(runner.model.parameters()).dtype == torch.bfloat16
    names = ("a", "b", "d")
    batched = _run(runner, _requests(names))
    for pieces in batched.values():
        assert all(p.dtype == np.float32 and np.isfinite(p).all() for p in pieces)
    assert _relative_error(batched, {name: alone[name] for name in names}) <= BF16_BOUND


def test_a_request_with_a_code_past_the_codebook_fails_alone(runner, alone) -> None:
    scheduler = GenerationScheduler(8)
    delivered: dict[str, list[RunnerOutput]] = {}
    failed: dict[str, str] = {}
    requests = _requests(("a", "b", "d"))
    live = set(requests)

    def deliver(request: StageRequest, output: RunnerOutput, finished: bool) -> None:
        delivered.setdefault(request.request_id, []).append(output)

    def fail(request_id: str, message: str, field: str | None) -> None:
        failed[request_id] = message
        live.discard(request_id)
        scheduler.remove(request_id)

    step = StageStep(scheduler, runner, deliver, fail, live.__contains__)
    for request, _, _ in requests.values():
        scheduler.add(request)
    for index in range(3):  # the third window of "b" holds a code past the codebook
        for name, (request, chunks, _) in requests.items():
            if name not in live:
                continue
            chunk = dict(chunks.popleft())
            if name == "b" and index == 2:
                chunk["frames"] = np.full_like(chunk["frames"], 10_000)
            request.inputs.append(chunk)
            scheduler.on_input(request)
        step.run()
    # refused before any embedding (on a GPU an embedding past the table is a device assert that takes the whole
    # stage down), not caught after the batched step raised
    assert failed == {"b": "token2wav: code 10000 is outside the vocoder's codebook [0, "
                           f"{runner.num_codes})"}
    for name in ("a", "d"):
        got = np.concatenate([o.audio for o in delivered[name]])
        want = np.concatenate(alone[name][:3])
        assert np.abs(got - want).max() <= BATCH_BOUND * np.abs(want).max()
