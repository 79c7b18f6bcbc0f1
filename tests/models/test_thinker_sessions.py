"""The default thinker's per-session KV cache: a conversation's next turn goes on from what its last request ran
(same greedy tokens as a full prefill, only the new tokens prefilled), bounded by a byte budget (least recently kept
session dropped first), dropped by ``end_session``; through AsyncOmni, 50 sessions opened and ended leave nothing."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest
import torch

from omnipipe.models.default.modeling.decoder import LayerCache
from omnipipe.models.default.modeling.session_cache import SessionCache, common_prefix_length
from omnipipe.models.default.runners.thinker import ThinkerRunner, _session_cache
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerContext

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "qwen2.5-0.5b-instruct"
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


def test_take_cuts_the_cache_to_the_common_prefix_and_leaves_the_session_empty() -> None:
    cache = SessionCache(1 << 20)
    cache.keep("s", [1, 2, 3, 4, 5], _caches(5))
    caches, common = cache.take("s", [1, 2, 3, 9, 9, 9])
    assert common == 3
    assert [c.view()[0].shape[1] for c in caches] == [3, 3]
    assert caches[0].view()[0][0, :, 0].tolist() == [0.0, 1.0, 2.0]
    assert cache.stats() == {"sessions": 0, "session_cache_bytes": 0}
    assert cache.take("s", [1, 2, 3]) is None


def test_take_leaves_at_least_one_token_to_prefill() -> None:
    cache = SessionCache(1 << 20)
    cache.keep("s", [1, 2, 3], _caches(3))
    assert cache.take("s", [1, 2, 3])[1] == 2
    cache.keep("s", [1, 2, 3], _caches(3))
    assert cache.take("s", [7, 2, 3]) is None  # nothing in common


def test_the_byte_budget_drops_the_least_recently_kept_session_first() -> None:
    one = sum(c.nbytes for c in _caches(4))
    cache = SessionCache(3 * one)
    for name in ("a", "b", "c"):
        cache.keep(name, [1, 2, 3, 4], _caches(4))
    cache.keep("a", [1, 2, 3, 4], _caches(4))  # kept again: now the most recent
    cache.keep("d", [1, 2, 3, 4], _caches(4))
    assert cache.sessions() == ["c", "a", "d"]
    assert cache.nbytes == 3 * one
    cache.keep("huge", list(range(400)), _caches(400))  # larger than the whole budget: not kept, nothing dropped
    assert cache.sessions() == ["c", "a", "d"]
    assert cache.end("a") and not cache.end("a")
    assert cache.stats() == {"sessions": 2, "session_cache_bytes": 2 * one}


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([1, 2], [1, 2]) == 2


@pytest.mark.parametrize("value", [-1, "big", 1.5, True])
def test_a_bad_session_cache_budget_is_refused_naming_the_option(value: Any) -> None:
    runner = ThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {"model": MODEL, "session_cache_bytes": value}))
    with pytest.raises(ValueError, match="stages.thinker.options.session_cache_bytes: must be an integer >= 0"):
        runner.load()


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


@pytest.mark.models
def test_a_session_gives_the_same_tokens_and_prefills_only_each_turns_new_tokens(runner) -> None:
    without = _conversation(runner, None)
    with_session = _conversation(runner, "talk")
    assert [tokens for tokens, _ in with_session] == [tokens for tokens, _ in without]
    preamble = len(runner.preamble_ids)
    for index, (_, request) in enumerate(with_session):
        cached = int(request.runner_metrics["prompt_tokens_cached"])
        new = request.num_prompt_tokens - cached
        if index == 0:
            assert cached == preamble  # only the shared preamble
            continue
        # the earlier turns (questions and answers) come from the session's cache: what is left is the end of the
        # last answer's turn, the new question's turn and the assistant slot
        assert cached > preamble + 10
        assert new <= len(runner.tokenizer.encode(QUESTIONS[index])) + 12
    for _, request in without:
        assert int(request.runner_metrics["prompt_tokens_cached"]) == preamble
    assert runner.memory_stats()["sessions"] == 1
    runner.end_session("talk")
    assert runner.memory_stats() == {"sessions": 0, "session_cache_bytes": 0}


@pytest.mark.models
def test_an_aborted_turn_keeps_what_it_ran_for_the_next(runner) -> None:
    request = StageRequest("cut", {"max_tokens": MAX_TOKENS}, True, False, [], session_id="cut")
    request.inputs.append({"text": QUESTIONS[0], "history": []})
    request.input_finished = True
    runner.execute([request], True)
    runner.execute([request], False)  # one answer token through the model, then the caller aborts
    runner.free(request)
    stats = runner.memory_stats()
    assert stats["sessions"] == 1 and stats["session_cache_bytes"] > 0
    _, _, again = _turn(runner, "cut-again", QUESTIONS[0], [], "cut")  # the same question asked again
    assert int(again.runner_metrics["prompt_tokens_cached"]) == again.num_prompt_tokens - 1
    runner.end_session("cut")
    assert runner.memory_stats()["sessions"] == 0


@pytest.mark.models
def test_the_byte_budget_keeps_the_most_recent_sessions(runner) -> None:
    _turn(runner, "probe", QUESTIONS[0], [], "probe")
    one = runner.memory_stats()["session_cache_bytes"]
    runner.end_session("probe")
    kept, runner.sessions = runner.sessions, _session_cache(int(2.5 * one), 1)
    try:
        for name in ("a", "b", "c"):
            _turn(runner, name, QUESTIONS[0], [], name)
        assert runner.sessions.sessions() == ["b", "c"]
        assert runner.memory_stats()["session_cache_bytes"] <= int(2.5 * one)
        _, _, request = _turn(runner, "a-again", QUESTIONS[1], [], "a")  # its cache was dropped: the preamble only
        assert int(request.runner_metrics["prompt_tokens_cached"]) == len(runner.preamble_ids)
    finally:
        runner.sessions = kept


def test_no_session_cache_at_a_budget_of_0_or_tensor_parallel() -> None:
    assert _session_cache(0, 1) is None
    assert _session_cache(1 << 20, 2) is None
    assert _session_cache(1 << 20, 1).budget_bytes == 1 << 20


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

    async def session(index: int) -> tuple[float, float]:
        sid = f"session-{index}"
        first = [o async for o in engine.generate("Say hi.", session_id=sid, sampling_params=params)][-1]
        history = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": first.text}]
        second = [o async for o in engine.generate({"prompt": "Again.", "history": history}, session_id=sid,
                                                    sampling_params=params)][-1]
        await engine.end_session(sid)
        return (first.metrics.stages["thinker"]["prompt_tokens_cached"],
                second.metrics.stages["thinker"]["prompt_tokens_cached"])

    async def kept_after(sessions: int) -> tuple[list[tuple[float, float]], dict[str, int]]:
        cached = list(await asyncio.gather(*(session(i) for i in range(sessions))))
        deadline = time.monotonic() + 10  # a state query may overtake the last session ends (another socket)
        while True:
            held = (await engine.debug_state())["stages"]["thinker"]["kv_cache"]
            if held["sessions"] == 0 or time.monotonic() > deadline:
                return cached, held

    cached, held = harness.run(kept_after(50), timeout_s=600)
    assert all(second > first for first, second in cached)  # each second turn went on from its first
    assert held == {"sessions": 0, "session_cache_bytes": 0}
