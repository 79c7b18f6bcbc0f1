"""The default thinker's automatic prefix caching over its paged KV pool: a request's prompt shares the leading
blocks an earlier request computed (a conversation's next turn: the last turn's prompt and answer; another
conversation with the same system prompt: that prompt), with the same greedy tokens as a full prefill (float32)
and only the rest prefilled; the blocks kept for later requests bounded by ``prefix_cache_bytes`` (least recently
used forgotten first); through AsyncOmni, 50 sessions opened and ended leave no block held."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from omnipipe.models.default.runners.thinker import (
    DEFAULT_PREFIX_CACHE_BYTES,
    KV_BLOCK_TOKENS,
    ThinkerRunner,
    _kv_options,
)
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerContext

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "qwen2.5-coder-0.5b-instruct"
QUESTIONS = ("What is the capital of France?", "And what river runs through it?", "How long is that river?")
MAX_TOKENS = 12


def _blocks(tokens: int) -> int:
    """The tokens of the whole blocks among ``tokens``: what a prefix shares."""
    return tokens // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS


def common_prefix_length(a: list[int], b: list[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


# --- the options ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    ({"prefix_cache_bytes": -1}, "stages.thinker.options.prefix_cache_bytes: must be an integer >= 0"),
    ({"prefix_cache_bytes": "big"}, "stages.thinker.options.prefix_cache_bytes: must be an integer >= 0"),
    ({"session_cache_bytes": 1.5}, "stages.thinker.options.session_cache_bytes: must be an integer >= 0"),
    ({"prefix_cache_bytes": True}, "stages.thinker.options.prefix_cache_bytes: must be an integer >= 0"),
    ({"prefix_cache_bytes": 1, "session_cache_bytes": 1}, "give prefix_cache_bytes or its older name"),
    ({"prefix_cache": "yes"}, "stages.thinker.options.prefix_cache: must be true or false"),
    ({"kv_cache_bytes": 0}, "stages.thinker.options.kv_cache_bytes: must be an integer >= 1"),
])
def test_a_bad_kv_option_is_refused_naming_it(options: dict[str, Any], message: str) -> None:
    runner = ThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {"model": MODEL, **options}))
    with pytest.raises(ValueError, match=message):
        runner.load()


def test_prefix_cache_bytes_is_the_room_for_kept_blocks_and_prefix_cache_false_shares_nothing() -> None:
    assert _kv_options({}).prefix_cache_bytes == DEFAULT_PREFIX_CACHE_BYTES
    assert _kv_options({"prefix_cache_bytes": 0}).prefix_caching  # the preamble's blocks are still shared
    off = _kv_options({"prefix_cache": False, "prefix_cache_bytes": 1 << 20})
    assert not off.prefix_caching and off.prefix_cache_bytes == 0
    assert _kv_options({"session_cache_bytes": 1 << 20}).prefix_cache_bytes == 1 << 20  # the older name
    assert _kv_options({"kv_cache_bytes": 1 << 30}).kv_cache_bytes == 1 << 30


# --- the runner on the real model --------------------------------------------------------------------------------


def _loaded(**options: Any) -> ThinkerRunner:
    runner = ThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {"model": MODEL, "weights": "float32", **options}))
    runner.load()
    return runner


@pytest.fixture(scope="module")
def runner() -> ThinkerRunner:
    return _loaded()


@pytest.fixture(scope="module")
def uncached() -> ThinkerRunner:
    """The same thinker with ``prefix_cache: false``: every prompt prefilled whole."""
    return _loaded(prefix_cache=False)


def _turn(runner: ThinkerRunner, rid: str, question: str, history: list[dict[str, str]],
          session_id: str | None) -> tuple[str, list[int], StageRequest]:
    """One request run to its end as the stage runs it (prefill, decode steps, free): its text and tokens."""
    request = StageRequest(rid, {"max_tokens": MAX_TOKENS}, True, False, [], session_id=session_id)
    request.inputs.append({"text": question, "history": history})
    request.input_finished = True
    output = runner.execute([request])[0]
    text = output.text_delta
    while not output.finished:
        output = runner.execute([request])[0]
        text += output.text_delta
    tokens = list(request.runner_state.stream.ids)
    runner.free(request)
    return text, tokens, request


def _conversation(runner: ThinkerRunner, session_id: str | None) -> list[tuple[list[int], StageRequest]]:
    history: list[dict[str, str]] = []
    turns = []
    for index, question in enumerate(QUESTIONS):
        text, tokens, request = _turn(runner, f"{session_id}-{index}", question, history, session_id)
        turns.append((tokens, request))
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": text}]
    return turns


def _cached(request: StageRequest) -> int:
    return request.num_cached_tokens


@pytest.mark.models
def test_a_conversation_gives_the_same_tokens_and_prefills_only_each_turns_new_tokens(runner, uncached) -> None:
    without = _conversation(uncached, None)
    with_cache = _conversation(runner, "talk")
    assert [tokens for tokens, _ in with_cache] == [tokens for tokens, _ in without]  # greedy, float32
    preamble = len(runner.preamble_ids)
    for index, (_, request) in enumerate(with_cache):
        cached = _cached(request)
        new = request.num_prompt_tokens - cached
        if index == 0:
            assert cached == _blocks(preamble) > 0  # only the preamble's blocks
            continue
        # the earlier turns (questions and answers) come from the cache: what is left is the end of the last
        # answer's turn, the new question's turn and the assistant slot, and the rest of their last block
        before = with_cache[index - 1][1]
        assert cached >= _blocks(before.num_prompt_tokens) and cached > _cached(before)
        assert new <= len(runner.tokenizer.encode(QUESTIONS[index])) + 12 + KV_BLOCK_TOKENS
    for _, request in without:
        assert _cached(request) == 0
    stats = runner.memory_stats()
    assert stats["blocks_reserved"] == runner.kv.blocks_for(preamble)  # only the preamble's stay held
    assert 0 < stats["prefix_cache_bytes"] <= DEFAULT_PREFIX_CACHE_BYTES


SYSTEM = ("You are the booking assistant of the Grand Hotel in Lisbon. Guests ask about rooms, prices, breakfast, "
          "parking and the spa. Rooms cost 120 euros a night, breakfast is included, parking is 15 euros a day and "
          "the spa opens at nine. Answer in one short sentence.")


@pytest.mark.models
def test_another_conversation_with_the_same_system_prompt_reports_it_cached(runner, uncached) -> None:
    system = [{"role": "system", "content": SYSTEM}]
    _, _, first = _turn(runner, "hotel-1", "How much is a room?", system, None)
    _, tokens, second = _turn(runner, "hotel-2", "When does the spa open?", system, None)
    shared = common_prefix(runner, system, "How much is a room?", "When does the spa open?")
    assert shared > len(runner.preamble_ids) + 40  # the system prompt is most of it
    assert _cached(first) < _cached(second) == _blocks(shared)
    _, alone, whole = _turn(uncached, "hotel-2-alone", "When does the spa open?", system, None)
    assert _cached(whole) == 0
    assert tokens == alone  # the same greedy answer as a whole prefill


def common_prefix(runner: ThinkerRunner, history: list[dict[str, str]], *questions: str) -> int:
    prompts = [runner.encode_prompt(question, history) for question in questions]
    return common_prefix_length(prompts[0], prompts[1])


@pytest.mark.models
def test_an_aborted_turn_keeps_what_it_ran_for_the_next(runner) -> None:
    question = "Name three rivers of Spain."
    request = StageRequest("cut", {"max_tokens": MAX_TOKENS}, True, False, [], session_id="cut")
    request.inputs.append({"text": question, "history": []})
    request.input_finished = True
    runner.execute([request])
    runner.execute([request])  # one answer token through the model, then the caller aborts
    runner.free(request)
    _, _, again = _turn(runner, "cut-again", question, [], "cut")  # the same question asked again
    assert _cached(again) == _blocks(again.num_prompt_tokens - 1)  # all but its last token, in whole blocks


@pytest.mark.models
def test_prefix_cache_bytes_bounds_the_blocks_kept_for_later_requests(runner) -> None:
    kept = runner.kv.max_cached_blocks
    assert kept == DEFAULT_PREFIX_CACHE_BYTES // (runner.model.token_bytes() * KV_BLOCK_TOKENS)
    runner.kv.max_cached_blocks = 2  # as prefix_cache_bytes of two blocks makes it
    try:
        for index in range(3):
            _turn(runner, f"q{index}", QUESTIONS[index] + " Answer in French, please, and briefly.", [], None)
            assert runner.kv.cached_blocks() <= 2
        _, _, request = _turn(runner, "q2-again", QUESTIONS[2] + " Answer in French, please, and briefly.", [],
                              None)
        assert _cached(request) <= _blocks(len(runner.preamble_ids)) + 2 * KV_BLOCK_TOKENS
    finally:
        runner.kv.max_cached_blocks = kept


# --- through AsyncOmni -------------------------------------------------------------------------------------------


def _thinker_pipeline() -> Any:
    from omnipipe.config.pipeline_spec import PipelineSpec
    from omnipipe.models.default.pipeline import THINKER

    return PipelineSpec(name="thinker_only", description="the default thinker alone", stages=(THINKER,), edges=(),
                        prompt_processor="omnipipe.models.default.processors.default_prompt",
                        input_modalities=("text",), comprehension_stage="thinker", takes_history=True,
                        default_deploy={"stages": {"thinker": {"threads": 1, "max_num_seqs": 8}}})


@pytest.mark.models
def test_fifty_sessions_opened_and_ended_leave_no_cache_behind(harness_factory) -> None:
    harness = harness_factory(_thinker_pipeline())
    engine = harness.engine
    params = {"thinker": {"max_tokens": 2}}

    async def session(index: int) -> tuple[int, int]:
        sid = f"session-{index}"
        first = [o async for o in engine.generate("Say hi.", session_id=sid, sampling_params=params)][-1]
        history = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": first.text}]
        second = [o async for o in engine.generate({"prompt": "Again.", "history": history}, session_id=sid,
                                                    sampling_params=params)][-1]
        await engine.end_session(sid)
        return first.metrics.num_cached_tokens, second.metrics.num_cached_tokens

    async def kept_after(sessions: int) -> tuple[list[tuple[int, int]], dict[str, int]]:
        cached = list(await asyncio.gather(*(session(i) for i in range(sessions))))
        deadline = time.monotonic() + 10  # a state query may overtake the last session ends (another socket)
        while True:
            held = (await engine.debug_state())["stages"]["thinker"]["kv_cache"]
            if held["tokens_used"] < 64 or time.monotonic() > deadline:  # the preamble's (38 tokens) alone
                return cached, held

    cached, held = harness.run(kept_after(50), timeout_s=600)
    preamble = min(first for first, _ in cached)  # a first turn shares the preamble's blocks at least
    # each second turn went on from its first (whose blocks other sessions asking the same may share already)
    assert all(second >= first and second > preamble for first, second in cached)
    assert held["tokens_used"] < 64  # the preamble's blocks only: no request holds any
    assert held["blocks_reserved"] == -(-held["tokens_used"] // KV_BLOCK_TOKENS)
    assert held["prefix_cache_bytes"] <= DEFAULT_PREFIX_CACHE_BYTES
