"""The Qwen3-Omni thinker steps every decoding request in one forward (tiny random checkpoint, in-process with the
stage's own scheduler and step): the same text and talker handoff as each request stepped alone, forwards per
decode step constant in the batch size, seeded sampling independent of batch-mates, a long prompt prefilled in
pieces between the others' decode steps, admission under a tiny KV budget, and one failing request failing alone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnipipe.models.qwen3_omni.runners.thinker import Qwen3ThinkerRunner
from omnipipe.models.qwen3_omni.weights.tiny import write_tiny_checkpoint
from omnipipe.stage.kv_cache import KVBudgetError
from omnipipe.stage.runner import RunnerContext
from omnipipe.stage.runner_driver import Arrival, ForwardCounter, drive
from omnipipe.util.media import load_audio, load_image
from tests.models import media_files

GREEDY = {"temperature": 0.0, "max_tokens": 10}
HANDOFF_BOUND = 1e-5  # of the values' absmax: float32 rounding of a different batch shape


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen3-omni") / "ckpt", seed=0)


def runner(checkpoint: Path, **options: Any) -> Qwen3ThinkerRunner:
    loaded = Qwen3ThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {"model": str(checkpoint), **options}))
    loaded.load()
    return loaded


@pytest.fixture(scope="module")
def thinker(checkpoint: Path) -> Qwen3ThinkerRunner:
    return runner(checkpoint)


def prompts() -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    image = np.asarray(load_image(media_files.png(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)), "image"))
    audio = load_audio(media_files.wav((0.2 * np.sin(np.arange(16000) / 50)).astype(np.float32)), "audio")
    texts = [{"text": f"question {i}: " + "tell me more " * i} for i in range(7)]
    return [*texts, {"text": "what do you see and hear", "images": [image], "audios": [audio]}]


def first_data(outputs: list[Any]) -> dict[str, Any]:
    """The talker's prompt the thinker sent with its first token (``Qwen3TalkerPrompt.to_dict``)."""
    return next(o.data["prompt"] for o in outputs if o.data)


def test_eight_requests_joining_at_different_steps_equal_each_stepped_alone(thinker: Qwen3ThinkerRunner) -> None:
    params = {"temperature": 0.0, "max_tokens": 16}
    arrivals = [Arrival(f"r{i}", params, [item], step=i) for i, item in enumerate(prompts())]
    alone = drive(thinker, arrivals, per_request=True)
    batched = drive(thinker, arrivals)
    assert not alone.errors and not batched.errors
    assert max(len(ids) for prefill, ids, _ in batched.steps if not prefill) == 8  # they did share steps
    for arrival in arrivals:
        rid = arrival.request_id
        assert batched.text(rid) == alone.text(rid) and batched.finished(rid)
        want, got = first_data(alone.outputs[rid]), first_data(batched.outputs[rid])
        assert torch.equal(want["ids"], got["ids"])
        for key in ("embeds", "mm_hidden"):
            scale = max(1.0, float(want[key].abs().max())) if want[key].numel() else 1.0
            assert want[key].shape == got[key].shape
            if want[key].numel():
                assert float((want[key] - got[key]).abs().max()) <= HANDOFF_BOUND * scale
        tokens = [o.data["token"] for o in batched.outputs[rid] if o.data]
        assert tokens == [o.data["token"] for o in alone.outputs[rid] if o.data]


@pytest.mark.parametrize("n", [1, 4, 8])
def test_one_decoder_forward_per_decode_step_whatever_the_batch(thinker: Qwen3ThinkerRunner, n: int) -> None:
    counter = ForwardCounter(thinker.decoder)
    try:
        result = drive(thinker, [Arrival(f"r{i}", GREEDY, [{"text": f"hi {i}"}]) for i in range(n)])
    finally:
        counter.close()
    assert not result.errors
    decode_steps = [ids for prefill, ids, _ in result.steps if not prefill]
    assert len(decode_steps) == GREEDY["max_tokens"] - 1  # every request decoded in the same steps
    assert counter.calls == n + len(decode_steps)  # one forward per prompt, then one per decode step


def test_a_seeded_sampled_request_is_the_same_alone_and_in_a_batch(thinker: Qwen3ThinkerRunner) -> None:
    seeded = {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "seed": 1234, "max_tokens": 12}
    alone = drive(thinker, [Arrival("seeded", seeded, [{"text": "sing"}])])
    others = [Arrival(f"o{i}", {"temperature": 1.0, "max_tokens": 12 + i}, [{"text": f"other {i}"}], step=i)
              for i in range(7)]
    batched = drive(thinker, [*others, Arrival("seeded", seeded, [{"text": "sing"}], step=2)])
    tokens = [[o.data["token"] for o in result.outputs["seeded"] if o.data] for result in (alone, batched)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 12


def test_a_long_prompt_is_prefilled_in_pieces_while_four_streams_decode(checkpoint: Path) -> None:
    chunked = runner(checkpoint, prefill_chunk_tokens=16)
    streams = [Arrival(f"s{i}", {"temperature": 0.0, "max_tokens": 40}, [{"text": f"s{i}"}]) for i in range(4)]
    long_prompt = Arrival("long", GREEDY, [{"text": "a long story " * 60}], step=3)
    result = drive(chunked, [*streams, long_prompt])
    assert not result.errors
    prompt_tokens = len(first_data(result.outputs["long"])["ids"])
    pieces = [i for i, (prefill, ids, _) in enumerate(result.steps) if prefill and i > 0]
    assert len(pieces) >= prompt_tokens // 16  # prefilled in pieces of at most 16 tokens
    for earlier, later in zip(pieces, pieces[1:], strict=False):  # a decode step between any two pieces
        assert any(not result.steps[i][0] for i in range(earlier + 1, later))
    # every stream got a token at every step it decoded in: none waited for the whole prompt
    decode_steps_while_prefilling = sum(1 for i in range(pieces[0], pieces[-1]) if not result.steps[i][0])
    assert decode_steps_while_prefilling >= len(pieces) - 1
    for stream in streams:
        assert result.text(stream.request_id) == drive(chunked, [stream]).text(stream.request_id)
    assert result.text("long") == drive(chunked, [long_prompt]).text("long")


def test_admission_under_a_tiny_kv_budget_queues_and_serves_every_request(checkpoint: Path,
                                                                          thinker: Qwen3ThinkerRunner) -> None:
    per_token = thinker.kv.keys[0][0].numel() * 2 * len(thinker.kv.keys) * 4
    small = runner(checkpoint, kv_cache_bytes=per_token * 16 * 6, kv_block_tokens=16)  # ~2 requests' worth
    arrivals = [Arrival(f"r{i}", GREEDY, [{"text": f"question {i}"}]) for i in range(8)]
    result = drive(small, arrivals)
    assert not result.errors and all(result.finished(a.request_id) for a in arrivals)
    assert max(len(ids) for prefill, ids, _ in result.steps if not prefill) < 8  # it could not run them all at once
    want = drive(thinker, arrivals)
    assert all(result.text(a.request_id) == want.text(a.request_id) for a in arrivals)
    assert small.kv.free_blocks == small.kv.num_blocks  # every block came back
    never = drive(small, [Arrival("huge", {"temperature": 0.0, "max_tokens": 10_000}, [{"text": "hi"}])])
    assert "sampling_params.max_tokens" in never.errors["huge"] and "raise kv_cache_bytes" in never.errors["huge"]


def test_a_request_that_breaks_the_step_fails_alone(thinker: Qwen3ThinkerRunner,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    arrivals = [Arrival(f"r{i}", GREEDY, [{"text": f"question {i}"}]) for i in range(4)]
    want = drive(thinker, arrivals)
    emit = thinker._emit

    def broken(request: Any, token: int, *rest: Any) -> Any:
        if request.request_id == "r2" and len(request.runner_state.generated) == 4:
            raise RuntimeError("boom")
        return emit(request, token, *rest)

    monkeypatch.setattr(thinker, "_emit", broken)
    result = drive(thinker, arrivals)
    assert set(result.errors) == {"r2"} and "boom" in result.errors["r2"]
    for rid in ("r0", "r1", "r3"):
        assert result.text(rid) == want.text(rid) and result.finished(rid)
    assert thinker.kv.free_blocks == thinker.kv.num_blocks


def test_batched_decoding_is_faster_than_stepping_each_request(thinker: Qwen3ThinkerRunner) -> None:
    """Not a speed bound (timers do not fail tests): the figures, printed for the record."""
    arrivals = [Arrival(f"r{i}", {"temperature": 0.0, "max_tokens": 30}, [{"text": f"q{i}"}]) for i in range(8)]
    figures = {}
    for per_request in (True, False):
        start = time.perf_counter()
        result = drive(thinker, arrivals, per_request=per_request)
        figures[per_request] = sum(len(result.outputs[a.request_id]) for a in arrivals) / (time.perf_counter() - start)
    print(f"tiny qwen3 thinker, 8 requests: {figures[False]:.0f} tok/s batched, {figures[True]:.0f} tok/s per "
          f"request ({figures[False] / figures[True]:.1f}x)")


@pytest.mark.slow  # stage processes through the engine
def test_through_the_engine_a_tiny_kv_budget_queues_requests_and_the_state_shows_the_cache(checkpoint: Path) -> None:
    """Real stage processes: six requests at once on a thinker whose KV budget holds about two; every one is
    answered as it is alone, and /debug/state reports the thinker's cache (every block back once they are done)."""
    import asyncio

    from omnipipe import AsyncOmni, SamplingParams
    from omnipipe.models.qwen3_omni.weights.load import load_config
    from omnipipe.stage.kv_cache import token_bytes

    text_config = load_config(checkpoint).thinker_config.text_config
    budget = token_bytes(text_config, torch.float32) * 16 * 5  # five blocks of 16 tokens: two prompts + replies
    deploy = {"stages": {s: {"threads": 1, "max_num_seqs": 8,
                             "options": {"model": str(checkpoint),
                                         **({"kv_cache_bytes": budget} if s == "thinker" else {})}}
                         for s in ("thinker", "talker", "code2wav")}}
    chat = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"

    async def run() -> tuple[list[str], list[str], dict[str, Any]]:
        async with AsyncOmni("qwen3_omni", deploy) as engine:
            async def ask(i: int) -> str:
                text = ""
                async for out in engine.generate(chat.format(f"question {i}"), output_modalities=["text"],
                                                 sampling_params={"thinker": SamplingParams(temperature=0,
                                                                                            max_tokens=10)}):
                    text += out.text_delta or ""
                return text

            together = await asyncio.gather(*(ask(i) for i in range(6)))
            alone = [await ask(i) for i in range(6)]
            return together, alone, await engine.debug_state()

    together, alone, state = asyncio.run(run())
    assert together == alone and all(together)
    kv = state["stages"]["thinker"]["kv_cache"]
    assert kv["blocks"] == 5 and kv["blocks_reserved"] == 0 and kv["tokens_used"] == 0


def test_the_default_kv_budget_is_what_max_num_seqs_whole_contexts_fill(thinker: Qwen3ThinkerRunner) -> None:
    """Without kv_cache_bytes a small model does not take the CPU default's gigabyte: its budget is max_num_seqs
    requests of its whole context and the stage's default reply cap."""
    context = thinker.model.config.text_config.max_position_embeddings
    assert thinker.kv.capacity_tokens == 8 * (context + thinker.options.max_new_tokens)


def test_a_budget_that_holds_no_block_stops_the_stage_naming_its_figures(checkpoint: Path) -> None:
    with pytest.raises(KVBudgetError, match=r"^stages\.thinker: no room for its KV cache: kv_cache_bytes 64 leaves "
                       r"64 bytes \(a KV budget of 64 bytes holds no block of 16 tokens .*\); raise "
                       r"gpu_memory_fraction, lower max_num_seqs or prefill_chunk_tokens, or set kv_cache_bytes$"):
        runner(checkpoint, kv_cache_bytes=64)


def test_a_media_prompt_prefilled_in_pieces_equals_it_whole(checkpoint: Path, thinker: Qwen3ThinkerRunner) -> None:
    """Each piece carries its slice of the visual positions and their DeepStack rows: 8-token pieces cut through
    the image's positions and give the same tokens and talker hand-off as one piece."""
    rng = np.random.default_rng(5)
    image = np.asarray(load_image(media_files.png(rng.integers(0, 255, (112, 140, 3), dtype=np.uint8)), "image"))
    media = {"text": "what do you see", "images": [image]}
    chunked = runner(checkpoint, prefill_chunk_tokens=8, prefix_caching=False)
    whole = runner(checkpoint, prefix_caching=False)
    want = drive(whole, [Arrival("m", GREEDY, [media])])
    got = drive(chunked, [Arrival("m", GREEDY, [media])])
    assert sum(1 for prefill, _, _ in got.steps if prefill) > 3  # it went in pieces
    image_token = int(chunked.config.thinker_config.image_token_id)
    assert int((first_data(got.outputs["m"])["ids"] == image_token).sum()) > 8  # pieces cut the image
    assert [o.data["token"] for o in got.outputs["m"] if o.data] == \
        [o.data["token"] for o in want.outputs["m"] if o.data]
    for key in ("embeds", "mm_hidden"):
        a, b = first_data(want.outputs["m"])[key], first_data(got.outputs["m"])[key]
        assert a.shape == b.shape and a.numel()
        assert float((a - b).abs().max()) <= HANDOFF_BOUND * max(1.0, float(a.abs().max()))
