"""The Qwen2.5-Omni thinker steps every decoding request in one forward (tiny random checkpoint, in-process with the
stage's own scheduler and step): the same text, last-position logits and talker handoff as each request run alone,
forwards per decode step constant in the batch size, seeded sampling independent of batch-mates, a long prompt
prefilled in pieces between the others' decode steps, prompt processing off the step, admission under a tiny KV
budget, and one failing request failing alone."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnipipe.models.qwen2_5_omni.runners.thinker import Qwen25ThinkerRunner
from omnipipe.models.qwen2_5_omni.weights.tiny import write_tiny_checkpoint
from omnipipe.stage.kv_cache import token_bytes
from omnipipe.stage.request import RequestStatus
from omnipipe.stage.runner import RunnerContext
from omnipipe.stage.runner_driver import Arrival, DriveResult, ForwardCounter, drive
from omnipipe.util.media import load_audio, load_image
from tests.models import media_files

GREEDY = {"temperature": 0.0, "max_tokens": 10}
# batched against alone, of the values' absmax (at least 1): float32 rounding of a different batch shape and
# attention width (measured: 5e-7 on hidden states of absmax ~4 on the tiny checkpoint)
FLOAT_BOUND = 1e-5


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen2_5-omni") / "ckpt", seed=0)


def runner(checkpoint: Path, **options: Any) -> Qwen25ThinkerRunner:
    loaded = Qwen25ThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {"model": str(checkpoint), **options}))
    loaded.load()
    return loaded


@pytest.fixture(scope="module")
def thinker(checkpoint: Path) -> Qwen25ThinkerRunner:
    return runner(checkpoint)


def prompts() -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    image = np.asarray(load_image(media_files.png(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)), "image"))
    audio = load_audio(media_files.wav((0.2 * np.sin(np.arange(16000) / 50)).astype(np.float32)), "audio", 16000)
    texts = [{"text": f"question {i}: " + "tell me more " * 3 * i} for i in range(7)]
    return [{"text": "what do you see and hear", "images": [image], "audios": [audio]}, *texts]


def prompt_part(result: DriveResult, request_id: str) -> dict[str, Any]:
    return next(o.data["prompt"] for o in result.outputs[request_id] if o.data and "prompt" in o.data)


def tokens(result: DriveResult, request_id: str) -> list[int]:
    part = prompt_part(result, request_id)
    return [part["first_token"]] + [o.data["token"] for o in result.outputs[request_id]
                                    if o.data and "token" in o.data and "prompt" not in o.data]


def last_position_logits(thinker: Qwen25ThinkerRunner, result: DriveResult, request_id: str) -> torch.Tensor:
    """The logits each token was chosen from: the prompt's last position's, then each reply token's."""
    hidden = [prompt_part(result, request_id)["hidden"][-1]]
    hidden += [o.data["hidden"] for o in result.outputs[request_id] if o.data and "hidden" in o.data]
    with torch.no_grad():
        return thinker.model.lm_head(torch.stack(hidden))


def within(want: Any, got: Any) -> bool:
    want, got = (torch.as_tensor(np.asarray(value), dtype=torch.float64) for value in (want, got))
    if want.shape != got.shape:
        return False
    return not want.numel() or float((want - got).abs().max()) <= FLOAT_BOUND * max(1.0, float(want.abs().max()))


def test_eight_requests_joining_at_different_steps_equal_each_run_alone(thinker: Qwen25ThinkerRunner) -> None:
    params = {"temperature": 0.0, "max_tokens": 32}
    # the image and audio prompt first: its processing (the slowest) is waited for, as nothing decodes yet
    arrivals = [Arrival(f"r{i}", params, [item], step=2 * i) for i, item in enumerate(prompts())]
    batched = drive(thinker, arrivals)
    assert not batched.errors
    assert max(len(ids) for prefill, ids, _ in batched.steps if not prefill) == 8  # they did share steps
    for arrival in arrivals:
        rid = arrival.request_id
        alone = drive(thinker, [Arrival(rid, params, arrival.inputs)])
        assert batched.text(rid) == alone.text(rid) and batched.finished(rid)
        assert tokens(batched, rid) == tokens(alone, rid)
        assert within(last_position_logits(thinker, alone, rid), last_position_logits(thinker, batched, rid))
        want, got = prompt_part(alone, rid), prompt_part(batched, rid)
        assert sorted(want) == sorted(got)
        assert torch.equal(want["input_ids"], got["input_ids"])
        assert torch.equal(want["attention_mask"], got["attention_mask"])
        assert want["grids"].keys() == got["grids"].keys()
        assert all(torch.equal(want["grids"][key], got["grids"][key]) for key in want["grids"])
        assert within(want["embeds"], got["embeds"]) and within(want["hidden"], got["hidden"])
        replies = [[o.data["embed"] for o in result.outputs[rid] if o.data and "embed" in o.data]
                   for result in (alone, batched)]
        assert len(replies[0]) == len(replies[1]) and all(map(within, *replies))
    shapes = next(o.details for o in batched.outputs["r0"] if o.details)["inputs"]  # with the first token
    assert shapes["image_grid_thw"] == [1, 3] and shapes["feature_attention_mask"][0] == 1
    assert thinker.kv.free_blocks == thinker.kv.num_blocks


@pytest.mark.parametrize("n", [1, 4, 8])
def test_one_decoder_forward_per_decode_step_whatever_the_batch(thinker: Qwen25ThinkerRunner, n: int) -> None:
    counter = ForwardCounter(thinker.decoder)
    try:
        result = drive(thinker, [Arrival(f"r{i}", GREEDY, [{"text": f"hi {i}"}]) for i in range(n)])
    finally:
        counter.close()
    assert not result.errors
    decode_steps = [ids for prefill, ids, _ in result.steps if not prefill]
    assert len(decode_steps) == GREEDY["max_tokens"] - 1  # every request decoded in the same steps
    assert counter.calls == n + len(decode_steps)  # one forward per prompt, then one per decode step


def test_a_seeded_sampled_request_is_the_same_alone_and_in_a_batch(thinker: Qwen25ThinkerRunner) -> None:
    seeded = {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.1, "seed": 1234,
              "max_tokens": 12}
    alone = drive(thinker, [Arrival("seeded", seeded, [{"text": "sing"}])])
    others = [Arrival(f"o{i}", {"temperature": 1.0, "max_tokens": 12 + i}, [{"text": f"other {i}"}], step=i)
              for i in range(7)]
    batched = drive(thinker, [*others, Arrival("seeded", seeded, [{"text": "sing"}], step=2)])
    assert tokens(alone, "seeded") == tokens(batched, "seeded") and len(tokens(alone, "seeded")) == 12
    assert alone.text("seeded") == batched.text("seeded")


def test_a_long_prompt_is_prefilled_in_pieces_while_four_streams_decode(checkpoint: Path) -> None:
    chunked = runner(checkpoint, prefill_chunk_tokens=32)
    streams = [Arrival(f"s{i}", {"temperature": 0.0, "max_tokens": 60}, [{"text": f"s{i}"}]) for i in range(4)]
    long_prompt = Arrival("long", GREEDY, [{"text": "a long story " * 40}], step=30)  # the streams decode
    result = drive(chunked, [*streams, long_prompt])
    assert not result.errors
    prompt_tokens = len(prompt_part(result, "long")["input_ids"])
    pieces = [i for i, (prefill, ids, _) in enumerate(result.steps) if prefill and "long" in ids]
    assert prompt_tokens > 300 and len(pieces) >= prompt_tokens // 32  # in pieces of at most 32 tokens
    for stream in streams:
        rid = stream.request_id
        steps = [i for i, (prefill, ids, _) in enumerate(result.steps) if not prefill and rid in ids]
        assert len(tokens(result, rid)) == len(steps) + 1  # a token at every decode step (+ the prefill's)
        # while the long prompt went in, the stream was in every decode step, and no two of its tokens were
        # further apart than one piece and one decode step
        during = [i for i in steps if pieces[0] <= i <= pieces[-1] + 1]
        assert len(during) >= len(pieces) - 1
        assert all(later - earlier <= 2 for earlier, later in zip(during, during[1:], strict=False))
        assert all(not result.steps[i][0] or i in pieces for i in range(during[0], during[-1]))
        assert result.text(rid) == drive(chunked, [stream]).text(rid)
    assert result.text("long") == drive(chunked, [long_prompt]).text("long")
    piece_ms = max(result.steps[i][2] for i in pieces) * 1e3
    decode_ms = max(s for prefill, _, s in result.steps[pieces[0]:pieces[-1]] if not prefill) * 1e3
    gaps = [sum(s for _, _, s in result.steps[i + 1:j + 1]) * 1e3 for i, j in zip(pieces, pieces[1:], strict=False)]
    print(f"tiny qwen2.5 thinker, {prompt_tokens}-token prompt in {len(pieces)} pieces of 32 beside 4 streams: "
          f"largest gap between a stream's tokens {max(gaps):.1f} ms (slowest piece {piece_ms:.1f} ms, slowest "
          f"decode step {decode_ms:.1f} ms)")


def test_prompt_processing_does_not_hold_up_the_decodes(thinker: Qwen25ThinkerRunner,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt whose processing is held until the loop reaches step 12 (a step would wait for it for 10 s, then
    give up) joins at step 2: the running requests decode meanwhile, and it goes in once processed."""
    release, released = threading.Event(), []
    process = thinker.inputs

    def slow(data: dict[str, Any]) -> dict[str, torch.Tensor]:
        if data["text"] == "slow":
            released.append(release.wait(10))
        return process(data)

    monkeypatch.setattr(thinker, "inputs", slow)
    streams = [Arrival(f"s{i}", {"temperature": 0.0, "max_tokens": 30}, [{"text": f"s{i}"}]) for i in range(3)]
    result = drive(thinker, [*streams, Arrival("slow", GREEDY, [{"text": "slow"}], step=2)],
                   on_step=lambda step: release.set() if step == 12 else None)
    assert not result.errors and result.finished("slow") and released == [True]
    # it waited while the others decoded
    assert sum(1 for o in result.outputs["slow"] if o.status is RequestStatus.PREFILLING) >= 4
    assert result.text("slow") == drive(thinker, [Arrival("slow", GREEDY, [{"text": "slow"}])]).text("slow")


def test_a_prompt_that_cannot_be_processed_fails_alone_naming_its_field(thinker: Qwen25ThinkerRunner) -> None:
    arrivals = [Arrival(f"r{i}", GREEDY, [{"text": f"question {i}"}]) for i in range(3)]
    broken = Arrival("bad", GREEDY, [{"text": "watch", "videos": [b"not a video"],
                                      "video_fields": ["prompt.multi_modal_data.video"]}], step=1)
    result = drive(thinker, [*arrivals, broken])
    assert set(result.errors) == {"bad"} and result.errors["bad"].startswith("prompt.multi_modal_data.video")
    assert all(result.finished(a.request_id) for a in arrivals)


def test_admission_under_a_tiny_kv_budget_queues_and_serves_every_request(checkpoint: Path,
                                                                          thinker: Qwen25ThinkerRunner) -> None:
    per_token = token_bytes(thinker.model.config.text_config, torch.float32)
    prompt_tokens = len(prompt_part(drive(thinker, [Arrival("p", GREEDY, [{"text": "question 0"}])]), "p")["input_ids"])
    blocks = -(-(prompt_tokens + GREEDY["max_tokens"]) // 16)
    small = runner(checkpoint, kv_cache_bytes=per_token * 16 * (2 * blocks + 1), kv_block_tokens=16,
                   prefix_caching=False)  # 2 requests (with their shared prefix in common blocks, more would fit)
    arrivals = [Arrival(f"r{i}", GREEDY, [{"text": f"question {i}"}]) for i in range(8)]
    result = drive(small, arrivals)
    assert not result.errors and all(result.finished(a.request_id) for a in arrivals)
    assert max(len(ids) for prefill, ids, _ in result.steps if not prefill) == 2  # it could not run them all at once
    want = drive(thinker, arrivals)
    assert all(result.text(a.request_id) == want.text(a.request_id) for a in arrivals)
    assert small.kv.free_blocks == small.kv.num_blocks  # every block came back
    never = drive(small, [Arrival("huge", {"temperature": 0.0, "max_tokens": 10_000}, [{"text": "hi"}])])
    assert never.errors["huge"].startswith("sampling_params.max_tokens")
    assert "raise kv_cache_bytes" in never.errors["huge"]


def test_a_request_that_breaks_the_step_fails_alone(thinker: Qwen25ThinkerRunner,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    arrivals = [Arrival(f"r{i}", GREEDY, [{"text": f"question {i}"}]) for i in range(4)]
    want = drive(thinker, arrivals)
    emit = thinker.emit

    def broken(request: Any, token: int, *rest: Any) -> Any:
        if request.request_id == "r2" and len(request.runner_state.generated) == 4:
            raise RuntimeError("boom")
        return emit(request, token, *rest)

    monkeypatch.setattr(thinker, "emit", broken)
    result = drive(thinker, arrivals)
    assert set(result.errors) == {"r2"} and "boom" in result.errors["r2"]
    for rid in ("r0", "r1", "r3"):
        assert result.text(rid) == want.text(rid) and result.finished(rid)
        assert tokens(result, rid) == tokens(want, rid)
    assert thinker.kv.free_blocks == thinker.kv.num_blocks


def test_batched_decoding_is_faster_than_stepping_each_request(thinker: Qwen25ThinkerRunner) -> None:
    """Not a speed bound (timers do not fail tests): the figures, printed for the record."""
    arrivals = [Arrival(f"r{i}", {"temperature": 0.0, "max_tokens": 30}, [{"text": f"q{i}"}]) for i in range(8)]
    figures = {}
    for per_request in (True, False):
        start = time.perf_counter()
        result = drive(thinker, arrivals, per_request=per_request)
        figures[per_request] = sum(len(tokens(result, a.request_id)) for a in arrivals) / (
            time.perf_counter() - start)
    print(f"tiny qwen2.5 thinker, 8 requests: {figures[False]:.0f} tok/s batched, {figures[True]:.0f} tok/s per "
          f"request ({figures[False] / figures[True]:.1f}x)")
