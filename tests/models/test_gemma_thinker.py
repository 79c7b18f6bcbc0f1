"""Tests of the Gemma thinker: batched decoding over the paged KV cache (sliding-window layers masked to their
window by position), sampling, the prefix cache and the Q/A prompt format."""

from __future__ import annotations

import os
import random

import pytest
import torch

from omnipipe.models.default.modeling.decoder import DEFAULT_KV_CACHE_TOKENS
from omnipipe.models.default.prompting import build_prompt, prompt_parts, stop_strings
from omnipipe.stage.sampling import TokenSamplingParams, sample_next_token
from omnipipe.stage.text_stream import TextStream

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village near the mountains, there lived a",
    "def fibonacci(n):",
)
DECODE_STEPS = 12


@pytest.fixture(scope="module")
def thinker():
    from omnipipe.models.default.modeling.gemma import GemmaThinker
    from omnipipe.models.default.weights.thinker import prepare_thinker

    return GemmaThinker(prepare_thinker("gemma3-270m", progress=False), num_threads=2)


def _encode(thinker, text: str) -> list[int]:
    return thinker.tokenizer(text).input_ids


def _greedy_alone(thinker, request_id: str, ids: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    logits = [thinker.prefill(request_id, ids)]
    tokens: list[int] = []
    for _ in range(steps):
        tokens.append(int(logits[-1].argmax()))
        logits.append(thinker.decode([request_id], [tokens[-1]])[0])
    thinker.free(request_id)
    return tokens, logits


def _greedy_together(thinker, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    ids = [f"together-{i}" for i in range(len(prompts))]
    logits = [[thinker.prefill(rid, p)] for rid, p in zip(ids, prompts, strict=True)]
    tokens: list[list[int]] = [[] for _ in prompts]
    for _ in range(steps):
        step = [int(per_request[-1].argmax()) for per_request in logits]
        for i, token in enumerate(step):
            tokens[i].append(token)
        out = thinker.decode(ids, step)
        for i in range(len(prompts)):
            logits[i].append(out[i])
    for rid in ids:
        thinker.free(rid)
    return tokens, logits


# --- model ------------------------------------------------------------------


@pytest.mark.models
def test_batched_decode_matches_individual_decode(thinker) -> None:
    prompts = [_encode(thinker, p) for p in PROMPTS]
    assert len({len(p) for p in prompts}) == len(prompts)  # different positions in one batch
    alone = [_greedy_alone(thinker, f"alone-{i}", p, DECODE_STEPS) for i, p in enumerate(prompts)]
    together_tokens, together_logits = _greedy_together(thinker, prompts, DECODE_STEPS)
    for i, (tokens, logits) in enumerate(alone):
        assert together_tokens[i] == tokens
        for a, b in zip(logits, together_logits[i], strict=True):
            torch.testing.assert_close(a, b, atol=1e-3, rtol=0)


@pytest.mark.models
def test_sliding_window_batch_with_long_and_short_prompts(thinker) -> None:
    """A prompt longer than the 512-token window decoded next to one that crosses it and a short one."""
    rng = random.Random(0)
    words = ("the", "cat", "sat", "on", "a", "mat", "while", "rain", "fell", "over", "quiet", "hills", "and", "rivers")
    window = thinker.config.sliding_window
    long_ids = _encode(thinker, " ".join(rng.choice(words) for _ in range(window + 20)))
    crossing_ids = long_ids[: window - 3]
    short_ids = _encode(thinker, PROMPTS[0])
    assert len(long_ids) > window
    prompts = [long_ids, crossing_ids, short_ids]
    alone = [_greedy_alone(thinker, f"alone-{i}", p, 6) for i, p in enumerate(prompts)]
    together_tokens, _ = _greedy_together(thinker, prompts, 6)
    assert together_tokens == [tokens for tokens, _ in alone]


@pytest.mark.models
def test_matches_transformers_reference(thinker) -> None:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(thinker.model_dir), dtype=torch.float32).eval()
    ids = _encode(thinker, PROMPTS[1])
    tokens, logits = _greedy_alone(thinker, "reference", ids, 6)
    with torch.inference_mode():
        expected = reference(torch.tensor([ids + tokens])).logits[0, len(ids) - 1 :]
    assert expected.argmax(-1)[:-1].tolist() == tokens
    torch.testing.assert_close(torch.stack(logits), expected, atol=2e-3, rtol=0)


@pytest.mark.models
def test_free_releases_the_cache(thinker) -> None:
    thinker.prefill("a", _encode(thinker, PROMPTS[0]))
    thinker.prefill("b", _encode(thinker, PROMPTS[1]))
    thinker.decode(["a", "b"], [5, 6])
    assert sorted(thinker.active_requests()) == ["a", "b"]
    assert thinker.kv_cache_bytes() > 0
    assert thinker.free("a") is True
    assert thinker.active_requests() == ["b"]
    assert thinker.free("a") is False
    with pytest.raises(KeyError, match="a"):
        thinker.decode(["a"], [5])
    thinker.free("b")
    assert thinker.active_requests() == []
    assert thinker.kv_cache_bytes() == 0


@pytest.mark.models
def test_request_bookkeeping_errors(thinker) -> None:
    thinker.prefill("dup", [2, 818])
    try:
        with pytest.raises(ValueError, match="holds all 2 of these tokens already"):
            thinker.prefill("dup", [2, 818])
        with pytest.raises(ValueError, match="unique"):
            thinker.decode(["dup", "dup"], [5, 5])
        assert thinker.num_cached_tokens("dup") == 2
    finally:
        thinker.free("dup")
    with pytest.raises(ValueError, match="empty"):
        thinker.prefill("empty", [])


@pytest.mark.models
def test_prompt_format_answers_briefly_and_stops(thinker) -> None:
    greedy = TokenSamplingParams()
    request_id = "qa"
    logits = thinker.prefill(request_id, _encode(thinker, build_prompt("What is the capital of France?")))
    stream = TextStream(lambda ids: thinker.tokenizer.decode(ids, skip_special_tokens=True), stop_strings(),
                        strip=True)
    try:
        for _ in range(40):
            token = sample_next_token(logits, greedy, stream.ids)
            if token in thinker.eos_token_ids:
                break
            stream.push(token)
            if stream.stopped:
                break
            logits = thinker.decode([request_id], [token])[0]
    finally:
        thinker.free(request_id)
    stream.finish()
    answer = stream.reply
    assert stream.stopped, f"no stop string within 40 tokens: {answer!r}"
    assert answer and "\n" not in answer and answer == answer.strip()
    assert "Paris" in answer


@pytest.mark.models
def test_seeded_sampling_with_the_model_is_reproducible(thinker) -> None:
    params = TokenSamplingParams(temperature=1.0, top_p=0.95, top_k=50, seed=1234)

    def run() -> list[int]:
        logits = thinker.prefill("seeded", _encode(thinker, PROMPTS[1]))
        generator, tokens = params.make_generator(), []
        for _ in range(6):
            tokens.append(sample_next_token(logits, params, tokens, generator))
            logits = thinker.decode(["seeded"], [tokens[-1]])[0]
        thinker.free("seeded")
        return tokens

    assert run() == run()


# --- prompt format (no model needed) -------------------------------------------


def test_prompt_ends_with_the_question_slot() -> None:
    prompt = build_prompt("  What is\nwater made of? ")
    assert prompt.endswith("Q: What is water made of?\nA:")
    with pytest.raises(ValueError, match="question"):
        build_prompt(" \n ")


def test_a_conversation_goes_between_the_preamble_and_the_question() -> None:
    history = [{"role": "system", "content": "Be  kind."}, {"role": "user", "content": "My name is Zorblat."},
               {"role": "assistant", "content": "Nice to meet you!"}, {"role": "user", "content": "Also,"}]
    preamble, turns = prompt_parts("what is my\nname?", history)
    assert preamble == prompt_parts("x")[0]  # still the shared (cached) prefix
    assert turns == "Note: Be kind.\n\nQ: My name is Zorblat.\nA: Nice to meet you!\n\nQ: Also, what is my name?\nA:"
    assert build_prompt("Hi?", []) == build_prompt("Hi?")


@pytest.mark.models
def test_shared_prefix_cache_gives_the_same_tokens_as_a_full_prefill(thinker) -> None:
    from omnipipe.models.default.prompting import prompt_parts

    preamble = thinker.tokenizer.encode(prompt_parts("x")[0])
    prompts = [preamble + thinker.tokenizer.encode(prompt_parts(q)[1], add_special_tokens=False)
               for q in ("What is the capital of France?", "Tell me about owls and their eyes.")]
    full, full_logits = _greedy_together(thinker, prompts, 6)
    thinker.use_kv_cache(DEFAULT_KV_CACHE_TOKENS, prefix_caching=True)
    try:
        thinker.prefill("preamble", preamble, logits=False)
        thinker.free("preamble")  # its full blocks stay for the prompts that begin with it
        cached, cached_logits = _greedy_together(thinker, prompts, 6)
        assert thinker.kv.prefix_hits >= 2 * (len(preamble) // thinker.kv.block_tokens) * thinker.kv.block_tokens > 0
    finally:
        thinker.use_kv_cache(DEFAULT_KV_CACHE_TOKENS)
    assert cached == full
    for a, b in zip(full_logits, cached_logits, strict=False):
        for x, y in zip(a, b, strict=False):
            assert (x - y).abs().max().item() < 1e-3


@pytest.mark.models
def test_rewind_undoes_decode_steps(thinker) -> None:
    """A checkpoint taken before a (failed) batched step brings the cache back: the retry alone gives the same
    logits as a step that never went wrong."""
    thinker.prefill("r", _encode(thinker, PROMPTS[1]))
    thinker.prefill("s", _encode(thinker, PROMPTS[0]))
    try:
        thinker.decode(["r", "s"], [5, 6])
        mark = thinker.kv.length("r")
        expected = thinker.decode(["r"], [7])[0]
        thinker.kv.set_length("r", mark)
        for _ in range(3):  # steps that "failed" half-way, writing K/V that must not count
            thinker.decode(["r", "s"], [9, 9])
        thinker.kv.set_length("r", mark)
        torch.testing.assert_close(thinker.decode(["r"], [7])[0], expected)
    finally:
        thinker.free("r")
        thinker.free("s")


@pytest.mark.models
def test_a_rewind_across_the_sliding_window_gives_the_steps_logits_again(thinker) -> None:
    """A request decoding past the window's edge, rewound to before it (a failed step undone), decodes what it
    decoded then: its sliding-window layers see the same window again."""
    window = thinker.config.sliding_window
    words = ("the", "cat", "sat", "on", "a", "mat", "while", "rain", "fell")
    ids = _encode(thinker, " ".join(words[i % len(words)] for i in range(window)))[: window - 2]
    thinker.prefill("edge", ids)
    try:
        mark = thinker.kv.length("edge")
        expected = [thinker.decode(["edge"], [token])[0] for token in (5, 6, 7, 8)]  # crosses the window
        thinker.kv.set_length("edge", mark)
        for got, want in zip((thinker.decode(["edge"], [token])[0] for token in (5, 6, 7, 8)), expected, strict=True):
            torch.testing.assert_close(got, want)
    finally:
        thinker.free("edge")


@pytest.mark.models
def test_the_sliding_window_mask_comes_from_the_positions(thinker) -> None:
    """A sliding-window layer's query at position p sees the keys p - window + 1 .. p, a full layer's 0 .. p."""
    window = thinker.config.sliding_window
    thinker.prefill("masked", [2] + [818] * (window + 3))
    try:
        thinker.kv.reserve("masked", window + 5)
        thinker.kv.bind(["masked"], 1)
        local, causal = thinker.step_masks(thinker.kv.positions())
        position = int(thinker.kv.positions()[0, 0])
        assert position == window + 4
        assert local[0, 0, 0].nonzero().flatten().tolist() == list(range(position - window + 1, position + 1))
        assert causal[0, 0, 0].nonzero().flatten().tolist() == list(range(position + 1))
    finally:
        thinker.free("masked", written=False)
