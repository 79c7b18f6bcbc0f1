"""The default thinker's automatic prefix cache: a request goes on from the longest token prefix it shares with what
an ended request ran (a conversation's next turn, another conversation with the same system prompt), with the same
greedy tokens as a full prefill and only the rest prefilled; bounded by a byte budget (least recently used dropped
first); a session's entries dropped by ``end_session``; through AsyncOmni, 50 sessions opened and ended leave none."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest
import torch

from omnipipe.models.default.modeling.decoder import LayerCache
from omnipipe.models.default.modeling.prefix_cache import PrefixCache, common_prefix_length
from omnipipe.models.default.runners.thinker import ThinkerRunner, _prefix_cache
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerContext

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "qwen2.5-coder-0.5b-instruct"
QUESTIONS = ("What is the capital of France?", "And what river runs through it?", "How long is that river?")
MAX_TOKENS = 12


# --- the cache alone ----------------------------------------------------------------------------------------------


def _caches(num_tokens: int) -> list[LayerCache]:
    """Two layers' caches holding ``num_tokens`` entries (each entry's values: its position)."""
    caches = [LayerCache(1, 4, torch.float32, None) for _ in range(2)]
    for cache in caches:
        entries = torch.arange(num_tokens, dtype=torch.float32).view(1, num_tokens, 1).expand(1, num_tokens, 4)
        cache.append(entries, entries)
    return caches


def test_lookup_copies_the_longest_shared_prefix_and_keeps_the_entry() -> None:
    cache = PrefixCache(1 << 20)
    cache.keep([1, 2, 3, 4, 5], _caches(5))
    cache.keep([1, 2, 7, 7], _caches(4))
    caches, common = cache.lookup([1, 2, 3, 9, 9, 9])
    assert common == 3
    assert [c.view()[0].shape[1] for c in caches] == [3, 3]
    assert caches[0].view()[0][0, :, 0].tolist() == [0.0, 1.0, 2.0]
    caches[0].append(torch.full((1, 1, 4), -1.0), torch.full((1, 1, 4), -1.0))  # the copy grows; the entry not
    assert cache.lookup([1, 2, 3, 4, 5, 6])[1] == 5
    assert cache.entries() == [(1, 2, 7, 7), (1, 2, 3, 4, 5)]  # the one used last is the most recent
    assert cache.lookup([8, 1, 2]) is None  # nothing in common


def test_lookup_leaves_at_least_one_token_to_prefill() -> None:
    cache = PrefixCache(1 << 20)
    cache.keep([1, 2, 3], _caches(3))
    assert cache.lookup([1, 2, 3])[1] == 2


def test_an_entry_a_newer_one_extends_is_dropped_and_a_covered_one_not_kept_again() -> None:
    cache = PrefixCache(1 << 20)
    cache.keep([1, 2, 3], _caches(3), "s")
    cache.keep([1, 2, 3, 4, 5], _caches(5), "s")  # the conversation's next turn serves every prompt the first did
    assert cache.entries() == [(1, 2, 3, 4, 5)]
    cache.keep([1, 2], _caches(2))  # held already (and more)
    assert cache.entries() == [(1, 2, 3, 4, 5)]
    assert cache.nbytes == sum(c.nbytes for c in _caches(5))


def test_the_byte_budget_drops_the_least_recently_used_first_and_end_drops_a_sessions() -> None:
    one = sum(c.nbytes for c in _caches(4))
    cache = PrefixCache(3 * one)
    for first in (1, 2, 3):
        cache.keep([first, 0, 0, 0], _caches(4), f"s{first}")
    cache.lookup([1, 0, 0, 0, 9])  # used: now the most recent
    cache.keep([4, 0, 0, 0], _caches(4))
    assert [tokens[0] for tokens in cache.entries()] == [3, 1, 4]
    assert cache.nbytes == 3 * one
    cache.keep(list(range(400)), _caches(400))  # larger than the whole budget: not kept, nothing dropped
    assert [tokens[0] for tokens in cache.entries()] == [3, 1, 4]
    assert cache.end("s1") and not cache.end("s1")
    assert cache.stats() == {"prefixes": 2, "sessions": 1, "prefix_cache_bytes": 2 * one}


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([1, 2], [1, 2]) == 2


@pytest.mark.parametrize(("options", "message"), [
    ({"prefix_cache_bytes": -1}, "stages.thinker.options.prefix_cache_bytes: must be an integer >= 0"),
    ({"prefix_cache_bytes": "big"}, "stages.thinker.options.prefix_cache_bytes: must be an integer >= 0"),
    ({"session_cache_bytes": 1.5}, "stages.thinker.options.session_cache_bytes: must be an integer >= 0"),
    ({"prefix_cache_bytes": True}, "stages.thinker.options.prefix_cache_bytes: must be an integer >= 0"),
    ({"prefix_cache_bytes": 1, "session_cache_bytes": 1}, "give prefix_cache_bytes or its older name"),
    ({"prefix_cache": "yes"}, "stages.thinker.options.prefix_cache: must be true or false"),
])
def test_a_bad_prefix_cache_option_is_refused_naming_it(options: dict[str, Any], message: str) -> None:
    runner = ThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {"model": MODEL, **options}))
    with pytest.raises(ValueError, match=message):
        runner.load()


def test_no_prefix_cache_at_a_budget_of_0_or_turned_off() -> None:
    assert _prefix_cache({"prefix_cache_bytes": 0}) is None
    assert _prefix_cache({"prefix_cache": False}) is None
    assert _prefix_cache({"session_cache_bytes": 1 << 20}).budget_bytes == 1 << 20


# --- the runner on the real model --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner() -> ThinkerRunner:
    loaded = ThinkerRunner(RunnerContext("thinker", "cpu", 2, 8, {"model": MODEL, "weights": "int8"}))
    loaded.load()
    return loaded


def _turn(runner: ThinkerRunner, rid: str, question: str, history: list[dict[str, str]],
          session_id: str | None) -> tuple[str, list[int], StageRequest]:
    """One request run to its end as the stage runs it (prefill, decode steps, free): its text and tokens."""
    request = StageRequest(rid, {"max_tokens": MAX_TOKENS}, True, False, [], session_id=session_id)
    request.inputs.append({"text": question, "history": history})
    request.input_finished = True
    output = runner.execute([request], True)[0]
    text = output.text_delta
    while not output.finished:
        output = runner.execute([request], False)[0]
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


@pytest.fixture
def fresh(runner: ThinkerRunner) -> ThinkerRunner:
    """The module's runner with an empty prefix cache of the default budget (put back afterwards)."""
    kept = runner.prefixes
    runner.prefixes = _prefix_cache({})
    yield runner
    runner.prefixes = kept


def _cached(request: StageRequest) -> int:
    return request.num_cached_tokens


@pytest.mark.models
def test_a_conversation_gives_the_same_tokens_and_prefills_only_each_turns_new_tokens(fresh) -> None:
    runner = fresh
    kept, runner.prefixes = runner.prefixes, None
    without = _conversation(runner, None)
    runner.prefixes = kept
    with_cache = _conversation(runner, "talk")
    assert [tokens for tokens, _ in with_cache] == [tokens for tokens, _ in without]
    preamble = len(runner.preamble_ids)
    for index, (_, request) in enumerate(with_cache):
        cached = _cached(request)
        new = request.num_prompt_tokens - cached
        if index == 0:
            assert cached == preamble  # only the shared preamble
            continue
        # the earlier turns (questions and answers) come from the cache: what is left is the end of the last
        # answer's turn, the new question's turn and the assistant slot
        assert cached > preamble + 10
        assert new <= len(runner.tokenizer.encode(QUESTIONS[index])) + 12
    for _, request in without:
        assert _cached(request) == preamble
    assert runner.memory_stats()["prefixes"] == 1  # each turn's entry extends the one before: only the last stays
    assert runner.memory_stats()["sessions"] == 1
    runner.end_session("talk")
    assert runner.memory_stats() == {"prefixes": 0, "sessions": 0, "prefix_cache_bytes": 0}


SYSTEM = ("You are the booking assistant of the Grand Hotel in Lisbon. Guests ask about rooms, prices, breakfast, "
          "parking and the spa. Rooms cost 120 euros a night, breakfast is included, parking is 15 euros a day and "
          "the spa opens at nine. Answer in one short sentence.")


@pytest.mark.models
def test_another_conversation_with_the_same_system_prompt_prefills_only_what_follows_it(fresh) -> None:
    runner = fresh
    system = [{"role": "system", "content": SYSTEM}]
    first_text, _, first = _turn(runner, "hotel-1", "How much is a room?", system, None)
    _, tokens, second = _turn(runner, "hotel-2", "When does the spa open?", system, None)
    shared = common_prefix(runner, system, "How much is a room?", "When does the spa open?")
    assert shared > len(runner.preamble_ids) + 40  # the system prompt is most of it
    assert _cached(first) == len(runner.preamble_ids)
    assert _cached(second) == shared
    kept, runner.prefixes = runner.prefixes, None
    try:
        _, alone, _ = _turn(runner, "hotel-2-alone", "When does the spa open?", system, None)
    finally:
        runner.prefixes = kept
    assert tokens == alone  # the same greedy answer as a whole prefill
    assert runner.memory_stats()["prefixes"] == 2 and runner.memory_stats()["sessions"] == 0


def common_prefix(runner: ThinkerRunner, history: list[dict[str, str]], *questions: str) -> int:
    prompts = [runner.encode_prompt(question, history) for question in questions]
    return common_prefix_length(prompts[0], prompts[1])


@pytest.mark.models
def test_an_aborted_turn_keeps_what_it_ran_for_the_next(fresh) -> None:
    runner = fresh
    request = StageRequest("cut", {"max_tokens": MAX_TOKENS}, True, False, [], session_id="cut")
    request.inputs.append({"text": QUESTIONS[0], "history": []})
    request.input_finished = True
    runner.execute([request], True)
    runner.execute([request], False)  # one answer token through the model, then the caller aborts
    runner.free(request)
    stats = runner.memory_stats()
    assert stats["sessions"] == 1 and stats["prefix_cache_bytes"] > 0
    _, _, again = _turn(runner, "cut-again", QUESTIONS[0], [], "cut")  # the same question asked again
    assert _cached(again) == again.num_prompt_tokens - 1
    runner.end_session("cut")
    assert runner.memory_stats()["sessions"] == 0


@pytest.mark.models
def test_the_byte_budget_keeps_the_most_recently_used(fresh) -> None:
    runner = fresh
    _turn(runner, "probe", QUESTIONS[0], [], "probe")
    one = runner.memory_stats()["prefix_cache_bytes"]
    runner.prefixes = _prefix_cache({"prefix_cache_bytes": int(1.5 * one)})
    for index in range(3):
        _turn(runner, f"q{index}", QUESTIONS[index], [], None)
    assert runner.memory_stats()["prefixes"] == 1
    assert runner.memory_stats()["prefix_cache_bytes"] <= int(1.5 * one)
    _, _, request = _turn(runner, "q2-again", QUESTIONS[2], [], None)  # kept
    assert _cached(request) == request.num_prompt_tokens - 1
    _, _, request = _turn(runner, "q0-again", QUESTIONS[0], [], None)  # dropped: only what it shares with q2
    assert _cached(request) == common_prefix(runner, [], QUESTIONS[0], QUESTIONS[2])
    assert _cached(request) < request.num_prompt_tokens - 5


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
            if held["sessions"] == 0 or time.monotonic() > deadline:
                return cached, held

    cached, held = harness.run(kept_after(50), timeout_s=600)
    assert all(second > first for first, second in cached)  # each second turn went on from its first
    assert held == {"prefixes": 0, "sessions": 0, "prefix_cache_bytes": 0}
