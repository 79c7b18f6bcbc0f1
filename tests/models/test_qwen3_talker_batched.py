"""The Qwen3-Omni talker steps every decoding request together (tiny random checkpoint, in-process with the stage's
own scheduler and step): one talker forward and ``num_code_groups - 1`` code-predictor forwards per decode step
whatever the batch size, the same codes as each request stepped alone, seeded sampling independent of batch-mates
(and of torch's global generator), a long prompt prefilled in pieces between the others' decode steps, admission
under a tiny KV budget, and one failing request failing alone.

The talker's inputs are the thinker's, as they reach it: the thinker stage run on the prompts, its step data put
through the thinker -> talker chunk processor, the chunks arriving at chosen steps."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnipipe.models.qwen3_omni.handoff import thinker2talker, thinker2talker_async_chunk
from omnipipe.models.qwen3_omni.runners.talker import Qwen3TalkerRunner
from omnipipe.models.qwen3_omni.runners.thinker import Qwen3ThinkerRunner
from omnipipe.models.qwen3_omni.weights.tiny import write_tiny_checkpoint
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerContext, RunnerOutput
from omnipipe.stage.runner_driver import Arrival, DriveResult, ForwardCounter, drive
from omnipipe.util.media import load_audio, load_image
from tests.models import media_files

FRAMES = 16
GREEDY = {"temperature": 0.0, "max_tokens": FRAMES}
GREEDY_PENALISED = {**GREEDY, "repetition_penalty": 1.05}  # the model's greedy talker keeps its penalty


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Any:
    """One torch thread, as the stage runs with ``threads: 1`` (and the tests share few cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen3-omni") / "ckpt", seed=0)


def runner(checkpoint: Path, **options: Any) -> Qwen3TalkerRunner:
    loaded = Qwen3TalkerRunner(RunnerContext("talker", "cpu", 1, 8, {"model": str(checkpoint), **options}))
    loaded.load()
    return loaded


@pytest.fixture(scope="module")
def talker(checkpoint: Path) -> Qwen3TalkerRunner:
    return runner(checkpoint)


def prompts() -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    image = np.asarray(load_image(media_files.png(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)), "image"))
    audio = load_audio(media_files.wav((0.2 * np.sin(np.arange(16000) / 50)).astype(np.float32)), "audio")
    texts = [{"text": f"question {i}: " + "tell me more " * i} for i in range(7)]
    return [*texts, {"text": "what do you see and hear", "images": [image], "audios": [audio]}]


@pytest.fixture(scope="module")
def thinker_data(checkpoint: Path) -> list[list[dict[str, Any]]]:
    """Each prompt's thinker step data (greedy, 4 to 11 tokens)."""
    thinker = Qwen3ThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {"model": str(checkpoint)}))
    thinker.load()
    try:
        arrivals = [Arrival(f"t{i}", {"temperature": 0.0, "max_tokens": 4 + i}, [item])
                    for i, item in enumerate(prompts())]
        result = drive(thinker, arrivals)
    finally:
        thinker.close()
    assert not result.errors
    return [[o.data for o in result.outputs[a.request_id] if o.data] for a in arrivals]


def chunks(data: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The talker's input chunks under async chunk: the prompt with the first text embedding, then one a step."""
    state: dict[str, Any] = {}
    return [chunk for i, output in enumerate(data)
            for chunk in thinker2talker_async_chunk(state, output, i == len(data) - 1, None)]


def streamed(request_id: str, params: dict[str, Any], data: list[dict[str, Any]], step: int,
             gap: int = 2) -> Arrival:
    """A request joining at ``step`` with its first chunk, the others arriving every ``gap`` steps (slower than
    the talker steps, so it waits for them)."""
    first, *rest = chunks(data)
    return Arrival(request_id, params, [first], step=step, more=[(step + gap * i, c) for i, c in enumerate(rest, 1)])


def whole(request_id: str, params: dict[str, Any], data: list[dict[str, Any]], step: int = 0) -> Arrival:
    return Arrival(request_id, params, thinker2talker(data), step=step)


def frames(result: DriveResult, request_id: str) -> list[list[int]]:
    return [o.data["frames"][:, 0].tolist() for o in result.outputs[request_id] if o.data]


def mixed_arrivals(thinker_data: list[list[dict[str, Any]]]) -> list[Arrival]:
    """Eight requests joining at steps 0..7: streamed or whole, greedy with and without the penalty."""
    return [(streamed if i % 3 else whole)(f"r{i}", GREEDY_PENALISED if i % 2 else GREEDY, data, step=i)
            for i, data in enumerate(thinker_data)]


def test_eight_requests_joining_at_different_steps_equal_each_alone(talker: Qwen3TalkerRunner,
                                                                    thinker_data: list) -> None:
    arrivals = mixed_arrivals(thinker_data)
    batched = drive(talker, arrivals)
    assert not batched.errors
    assert max(len(ids) for prefill, ids, _ in batched.steps if not prefill) == 8  # they did share steps
    for arrival in arrivals:
        rid = arrival.request_id
        alone = drive(talker, [arrival])
        assert frames(batched, rid) == frames(alone, rid) and batched.finished(rid)
        assert len(frames(alone, rid)) > FRAMES // 2 and all(len(f) == 4 for f in frames(alone, rid))
    assert talker.kv.free_blocks == talker.kv.num_blocks  # every block came back


def test_a_request_whose_thinker_said_nothing_ends_without_frames(talker: Qwen3TalkerRunner,
                                                                  thinker_data: list) -> None:
    silent = {**thinker2talker(thinker_data[0][:1])[0]}
    assert len(silent["text_embeds"]) == 0 and silent["done"]
    result = drive(talker, [Arrival("silent", GREEDY, [silent])])
    assert result.finished("silent") and not frames(result, "silent") and not result.errors


@pytest.mark.parametrize("n", [1, 4, 8])
def test_forwards_per_decode_step_are_constant_in_the_batch(talker: Qwen3TalkerRunner, thinker_data: list,
                                                            n: int) -> None:
    """Per decode step: one talker forward and groups - 1 code-predictor forwards, for 1, 4 or 8 requests."""
    decoder, predictor = ForwardCounter(talker.model.model), ForwardCounter(talker.model.code_predictor.model)
    per_step: list[tuple[bool, int, int, int]] = []
    execute = talker.execute

    def counted(batch: list[StageRequest]) -> list[RunnerOutput]:
        decoder.reset(), predictor.reset()
        is_prefill = not all(request.prefilled for request in batch)  # before the step: a prompt in it
        outputs = execute(batch)
        per_step.append((is_prefill, len(batch), decoder.reset(), predictor.reset()))
        return outputs

    talker.execute = counted  # type: ignore[method-assign]  # removed again below
    try:
        result = drive(talker, [whole(f"r{i}", GREEDY, thinker_data[i]) for i in range(n)])
    finally:
        vars(talker).pop("execute", None)
        decoder.close(), predictor.close()
    assert not result.errors
    groups = int(talker.config.talker_config.num_code_groups)
    decode_steps = [step for step in per_step if not step[0]]
    assert len(decode_steps) >= FRAMES // 2 and max(rows for _, rows, _, _ in decode_steps) == n
    assert {(talker_calls, predictor_calls) for _, _, talker_calls, predictor_calls in decode_steps} == \
        {(1, groups - 1)}
    assert [calls for prefill, _, calls, _ in per_step if prefill] == [n]  # one forward per prompt


def test_a_seeded_sampled_request_is_the_same_alone_and_in_a_batch(talker: Qwen3TalkerRunner,
                                                                   thinker_data: list) -> None:
    seeded = {"temperature": 0.9, "top_k": 50, "seed": 1234, "max_tokens": FRAMES}
    global_state = torch.random.get_rng_state()
    alone = drive(talker, [streamed("seeded", seeded, thinker_data[3], step=0)])
    assert torch.equal(torch.random.get_rng_state(), global_state)  # its draws are its own generator's
    others = [whole(f"o{i}", {"temperature": 1.0, "max_tokens": FRAMES - i}, thinker_data[i], step=i)
              for i in range(7)]
    batched = drive(talker, [*others, streamed("seeded", seeded, thinker_data[3], step=2)])
    assert not batched.errors
    # it stepped with others (sampled: a batch-mate may draw its end code early, so not always all 8 at once)
    assert max(len(ids) for prefill, ids, _ in batched.steps if not prefill and "seeded" in ids) >= 5
    assert frames(alone, "seeded") == frames(batched, "seeded") and frames(alone, "seeded")
    greedy = drive(talker, [streamed("greedy", {**GREEDY}, thinker_data[3], step=0)])
    # the residual codes are sampled too, not only the talker's own
    assert [f[1:] for f in frames(alone, "seeded")] != [f[1:] for f in frames(greedy, "greedy")]


def test_a_long_prompt_is_prefilled_in_pieces_while_four_streams_decode(checkpoint: Path,
                                                                        talker: Qwen3TalkerRunner,
                                                                        thinker_data: list) -> None:
    chunked = runner(checkpoint, prefill_chunk_tokens=16)
    streams = [whole(f"s{i}", {**GREEDY, "max_tokens": 60}, thinker_data[i]) for i in range(4)]
    long_prompt = whole("long", GREEDY, thinker_data[6], step=30)  # the longest prompt, once the streams decode
    result = drive(chunked, [*streams, long_prompt])
    assert not result.errors
    pieces = [i for i, (prefill, ids, _) in enumerate(result.steps) if prefill and ids == ["long"]]
    assert len(pieces) >= 4
    for earlier, later in zip(pieces, pieces[1:], strict=False):  # the four streams decoded between any two pieces
        assert [ids for _, ids, _ in result.steps[earlier + 1:later]] == [[s.request_id for s in streams]]
    want = drive(talker, [*streams, long_prompt])
    assert all(frames(result, a.request_id) == frames(want, a.request_id) for a in [*streams, long_prompt])
    assert chunked.kv.free_blocks == chunked.kv.num_blocks


def test_admission_under_a_tiny_kv_budget_queues_and_serves_every_request(checkpoint: Path,
                                                                          talker: Qwen3TalkerRunner,
                                                                          thinker_data: list) -> None:
    per_token = talker.kv.keys[0][0].numel() * 2 * len(talker.kv.keys) * 4
    small = runner(checkpoint, kv_cache_bytes=per_token * 16 * 8, kv_block_tokens=16)  # ~2-3 requests' worth
    arrivals = [whole(f"r{i}", GREEDY, data) for i, data in enumerate(thinker_data[:6])]
    result = drive(small, arrivals)
    assert not result.errors and all(result.finished(a.request_id) for a in arrivals)
    assert max(len(ids) for prefill, ids, _ in result.steps if not prefill) < 6  # it could not run them all at once
    want = drive(talker, arrivals)
    assert all(frames(result, a.request_id) == frames(want, a.request_id) for a in arrivals)
    assert small.kv.free_blocks == small.kv.num_blocks
    never = drive(small, [whole("huge", {"temperature": 0.0, "max_tokens": 10_000}, thinker_data[0])])
    assert "sampling_params.max_tokens" in never.errors["huge"] and "raise kv_cache_bytes" in never.errors["huge"]


def test_a_request_that_breaks_the_step_fails_alone(talker: Qwen3TalkerRunner, thinker_data: list,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    arrivals = mixed_arrivals(thinker_data)
    want = drive(talker, arrivals)
    emit = talker.emit

    def broken(request: StageRequest, code: int, logits: torch.Tensor, frame: torch.Tensor | None) -> RunnerOutput:
        if request.request_id == "r2" and len(request.runner_state.generated) == 5:
            raise RuntimeError("boom")
        return emit(request, code, logits, frame)

    monkeypatch.setattr(talker, "emit", broken)
    result = drive(talker, arrivals)
    assert set(result.errors) == {"r2"} and "boom" in result.errors["r2"]
    for arrival in arrivals:
        if arrival.request_id != "r2":
            rid = arrival.request_id
            assert frames(result, rid) == frames(want, rid) and result.finished(rid)
    assert talker.kv.free_blocks == talker.kv.num_blocks


def test_batched_frames_per_second_against_stepping_each_request(talker: Qwen3TalkerRunner,
                                                                 thinker_data: list) -> None:
    """Not a speed bound (timers do not fail tests): the figures, printed for the record."""
    params = {"temperature": 0.0, "max_tokens": 40}
    figures = {}
    for n in (1, 8):
        arrivals = [whole(f"r{i}", params, thinker_data[i]) for i in range(n)]
        for per_request in (True, False):
            start = time.perf_counter()
            result = drive(talker, arrivals, per_request=per_request)
            seconds = time.perf_counter() - start
            figures[n, per_request] = sum(len(frames(result, a.request_id)) for a in arrivals) / seconds
    print("tiny qwen3 talker frames/s: " + ", ".join(
        f"{n} request(s) {figures[n, False]:.0f} batched / {figures[n, True]:.0f} per request" for n in (1, 8)))


def test_a_prompt_sharing_its_start_with_an_earlier_one_is_not_prefilled_again(checkpoint: Path,
                                                                             talker: Qwen3TalkerRunner) -> None:
    """A conversation's next turn repeats the user turns before it: the talker's prompt keeps only the user turns,
    so two questions opening alike share the blocks of that opening, and the frames are those of a talker without
    the prefix cache."""
    opening = "tell me about the picture and the sound, " * 5
    thinker = Qwen3ThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {"model": str(checkpoint)}))
    thinker.load()
    try:
        result = drive(thinker, [Arrival(f"t{i}", {"temperature": 0.0, "max_tokens": 6}, [{"text": opening + q}])
                                 for i, q in enumerate(("what is first?", "and what is second?"))])
    finally:
        thinker.close()
    data = [[o.data for o in result.outputs[f"t{i}"] if o.data] for i in range(2)]
    plain = runner(checkpoint, prefix_caching=False)
    hits = []
    for i, item in enumerate(data):
        before = talker.kv.prefix_hits
        got = drive(talker, [whole(f"p{i}", GREEDY, item)])
        hits.append(talker.kv.prefix_hits - before)
        assert frames(got, f"p{i}") == frames(drive(plain, [whole(f"p{i}", GREEDY, item)]), f"p{i}")
    assert hits[1] >= hits[0] + 2 * talker.kv.block_tokens, hits  # the opening's blocks, at least
    assert plain.kv.prefix_hits == 0
