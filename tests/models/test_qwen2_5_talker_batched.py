"""The Qwen2.5-Omni talker steps every decoding request in one forward (tiny random checkpoint, in-process with the
stage's own scheduler and step): the same codes as each request stepped alone while reply items arrive at different
rates, forwards per decode step constant in the batch size, seeded sampling independent of batch-mates, a prompt
prefilled in pieces, admission under a tiny KV budget, and one failing request failing alone.

The talker's inputs are made as the thinker stage makes them (its prompt part, then a reply item per token it reads:
the layer-0 embedding and last-layer hidden state), from the thinker model directly, and shaped by the pipeline's
own thinker -> talker chunk processor."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from omnipipe.models.qwen2_5_omni.handoff import Qwen25TalkerPrompt, thinker2talker_async_chunk
from omnipipe.models.qwen2_5_omni.modeling.processor import OmniProcessor
from omnipipe.models.qwen2_5_omni.processors import chat_messages
from omnipipe.models.qwen2_5_omni.runners.talker import Qwen25TalkerRunner
from omnipipe.models.qwen2_5_omni.weights.load import load_config, load_part, load_speakers
from omnipipe.models.qwen2_5_omni.weights.tiny import write_tiny_checkpoint
from omnipipe.stage.kv_cache import token_bytes
from omnipipe.stage.request import RequestStatus
from omnipipe.stage.runner import RunnerContext
from omnipipe.stage.runner_driver import Arrival, DriveResult, ForwardCounter, drive
from omnipipe.stage.sampling import TokenSamplingParams, sample_next_token
from omnipipe.util.field_error import FieldError

GREEDY = {"temperature": 0.0, "max_tokens": 24}  # the model's repetition penalty (1.05) stays on
LOGITS_BOUND = 1e-5  # of the logits' absmax: float32 rounding of another batch (seen: 3e-7; a wrong rope delta: 2e-4)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen2_5-omni") / "ckpt", seed=0)


class ThinkerOutputs:
    """The thinker stage's step data for a prompt and a given reply (one forward of the thinker over both: each
    reply position sees what it would see at its decode step), as talker input chunks."""

    def __init__(self, checkpoint: Path) -> None:
        self.model = load_part(checkpoint, "thinker", torch.device("cpu"), torch.float32)
        self.processor = OmniProcessor.from_pretrained(checkpoint, local_files_only=True)
        talker = load_config(checkpoint).talker_config
        embed = self.model.get_input_embeddings()

        def vector(token: int) -> torch.Tensor:
            return embed(torch.tensor([token]))[0].detach()

        self.text_eos, self.text_pad = vector(talker.tts_text_end_token_id), vector(talker.tts_text_pad_token_id)
        self.speaker_bos = {name: vector(int(s["bos_token"])) for name, s in load_speakers(checkpoint).items()}

    @torch.inference_mode()
    def chunks(self, item: dict[str, Any], reply: str) -> list[dict[str, Any]]:
        chat = self.processor.apply_chat_template(chat_messages(item), add_generation_prompt=True, tokenize=False)
        inputs = self.processor(text=[chat], images=item.get("images") or None, audio=item.get("audios") or None,
                                return_tensors="pt")
        prompt_ids = inputs["input_ids"]
        reply_ids = torch.tensor([self.processor.tokenizer(reply)["input_ids"]])
        ids = torch.cat([prompt_ids, reply_ids], dim=1)
        mask = torch.ones_like(ids)
        media = {k: inputs[k] for k in ("pixel_values", "image_grid_thw", "input_features", "feature_attention_mask")
                 if k in inputs}
        audio_lengths = media["feature_attention_mask"].sum(-1) if "feature_attention_mask" in media else None
        positions, _ = self.model.get_rope_index(ids, media.get("image_grid_thw"), None, mask, False, audio_lengths)
        text_positions = torch.arange(ids.shape[1]).view(1, 1, -1)
        out = self.model.model(input_ids=ids, attention_mask=mask, position_ids=torch.cat([text_positions, positions]),
                               output_hidden_states=True, use_audio_in_video=False, **media)
        length = prompt_ids.shape[1]
        embeds, hidden = out.hidden_states[0][0].clone(), out.last_hidden_state[0]
        config = self.model.config
        for key, token in (("input_features", config.audio_token_index), ("pixel_values", config.image_token_index)):
            if key in media:
                embeds[ids[0] == token] = 0
        grids = {"image_grid_thw": media["image_grid_thw"]} if "image_grid_thw" in media else {}
        if audio_lengths is not None:
            grids["audio_feature_lengths"] = audio_lengths
        prompt = Qwen25TalkerPrompt(prompt_ids[0], mask[0, :length], embeds[:length], hidden[:length],
                                    int(reply_ids[0, 0]), self.text_eos, self.text_pad, self.speaker_bos, grids)
        outputs = [{"prompt": prompt.to_dict()}] + [{"embed": embeds[i], "hidden": hidden[i]}
                                                    for i in range(length, ids.shape[1])]
        state: dict[str, Any] = {}
        return [chunk for i, output in enumerate(outputs)
                for chunk in thinker2talker_async_chunk(state, output, i == len(outputs) - 1, None)]


@pytest.fixture(scope="module")
def thinker(checkpoint: Path) -> ThinkerOutputs:
    return ThinkerOutputs(checkpoint)


def runner(checkpoint: Path, **options: Any) -> Qwen25TalkerRunner:
    loaded = Qwen25TalkerRunner(RunnerContext("talker", "cpu", 1, 8, {"model": str(checkpoint), **options}))
    loaded.load()
    return loaded


@pytest.fixture(scope="module")
def talker(checkpoint: Path) -> Qwen25TalkerRunner:
    return runner(checkpoint)


@pytest.fixture(scope="module")
def inputs(thinker: ThinkerOutputs) -> list[list[dict[str, Any]]]:
    """Eight requests' talker inputs: six text prompts, one with an image and one with audio (their media offset
    the rope positions), replies of different lengths."""
    rng = np.random.default_rng(1)
    image = rng.integers(0, 255, (56, 56, 3), dtype=np.uint8)
    audio = (0.2 * np.sin(np.arange(16000) / 50)).astype(np.float32)
    items = [{"text": f"question {i}: " + "tell me more " * i} for i in range(6)]
    items += [{"text": "what do you see", "images": [image]}, {"text": "what do you hear", "audios": [audio]}]
    return [thinker.chunks(item, "the answer is " + "yes and no " * (i % 4)) for i, item in enumerate(items)]


def arrival(request_id: str, params: dict[str, Any], chunks: list[dict[str, Any]], step: int = 0,
            every: int = 0) -> Arrival:
    """All chunks at ``step``, or the first one then one more every ``every`` steps (the thinker streaming)."""
    if not every:
        return Arrival(request_id, params, list(chunks), step=step)
    return Arrival(request_id, params, [chunks[0]], step=step,
                   more=[(step + every * (k + 1), chunk) for k, chunk in enumerate(chunks[1:])])


def codes(result: DriveResult, request_id: str) -> list[int]:
    return [int(o.data["frames"][0, 0]) for o in result.outputs[request_id] if o.data]


def test_eight_requests_joining_at_different_steps_equal_each_stepped_alone(talker: Qwen25TalkerRunner,
                                                                          inputs: list) -> None:
    arrivals = [arrival(f"r{i}", GREEDY, chunks, step=i, every=i % 3) for i, chunks in enumerate(inputs)]
    batched = drive(talker, arrivals)
    per_request = drive(talker, arrivals, per_request=True)
    assert not batched.errors and not per_request.errors
    assert max(len(ids) for prefill, ids, _ in batched.steps if not prefill) == 8  # they did share steps
    for a in arrivals:
        alone = drive(talker, [Arrival(a.request_id, a.params, [*a.inputs, *(c for _, c in a.more)])])
        assert codes(batched, a.request_id) == codes(alone, a.request_id) == codes(per_request, a.request_id)
        assert len(codes(batched, a.request_id)) >= 5 and batched.finished(a.request_id)
    assert talker.kv.free_blocks == talker.kv.num_blocks


def stepped_alone(talker: Qwen25TalkerRunner, chunks: list[dict[str, Any]], max_codes: int) -> tuple[list[int],
                                                                                                   torch.Tensor]:
    """The talker model's own forward on one request's talker input, step by step with a DynamicCache (its own
    rope positions and deltas, computed by the model), greedy with the model's repetition penalty: the codes before
    the end code, and the logits of every step."""
    model, prompt = talker.model, chunks[0]["prompt"]
    tensor = torch.as_tensor
    replies = [e + h for chunk in chunks for e, h in zip(chunk["text_embeds"], chunk["text_hidden"], strict=True)]
    replies += [prompt["text_eos"]] + [prompt["text_pad"]] * max_codes
    ids = tensor(prompt["input_ids"])[None]
    length = ids.shape[1] + 2
    history = [model.codec_mask_token] * ids.shape[1] + [model.codec_pad_token, model.codec_bos_token]
    extra = dict(prompt["grids"])
    cache, sampling, steps = DynamicCache(), TokenSamplingParams(temperature=0.0, repetition_penalty=1.05), []
    model.rope_deltas = None
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([history]), past_key_values=cache, use_cache=True,
                    input_text_ids=torch.cat([ids, torch.tensor([[talker.bos_tokens["Chelsie"],
                                                                  prompt["first_token"]]])], dim=1),
                    inputs_embeds=torch.cat([tensor(prompt["hidden"]) + tensor(prompt["embeds"]),
                                             prompt["speaker_bos"]["Chelsie"][None], replies[0][None]])[None],
                    attention_mask=torch.ones(1, length, dtype=torch.long), use_audio_in_video=False, **extra)
        for reply in replies[1:max_codes + 1]:
            steps.append(out.logits[0, -1])
            code = sample_next_token(steps[-1], sampling, history[length:], prompt_ids=history[:length],
                                     suppress=[model.codec_bos_token])
            if code in talker.eos_codes:
                break
            history.append(code)
            out = model(input_ids=torch.tensor([[code]]), thinker_reply_part=reply.view(1, 1, -1),
                        attention_mask=torch.ones(1, len(history), dtype=torch.long), past_key_values=cache,
                        use_cache=True)
    model.rope_deltas = None
    return history[length:], torch.stack(steps)


def test_batched_codes_and_logits_equal_the_model_stepped_alone(talker: Qwen25TalkerRunner, inputs: list,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The image request's media move its rope positions (its delta is -2): each row decodes at its own. The
    tiny talker barely reads positions (a delta ignored moves its logits by ~1e-4 and no code), so the logits are
    compared too, within float32 rounding of a different batch shape."""
    logits: dict[str, list[torch.Tensor]] = {}
    emit = talker.emit

    def recorded(request: Any, code: int, row: torch.Tensor, extra: Any) -> Any:
        logits.setdefault(request.request_id, []).append(row.clone())
        return emit(request, code, row, extra)

    monkeypatch.setattr(talker, "emit", recorded)
    arrivals = [arrival(f"r{i}", GREEDY, chunks, step=i % 3) for i, chunks in enumerate(inputs)]
    batched = drive(talker, arrivals)
    assert talker.kv.free_blocks == talker.kv.num_blocks
    for i in (0, 3, 6, 7):
        want_codes, want_logits = stepped_alone(talker, inputs[i], GREEDY["max_tokens"])
        got = torch.stack(logits[f"r{i}"])
        assert codes(batched, f"r{i}") == want_codes and got.shape == want_logits.shape
        assert float((got - want_logits).abs().max()) <= LOGITS_BOUND * float(want_logits.abs().max())


def test_a_request_waiting_for_its_reply_item_holds_up_no_one(talker: Qwen25TalkerRunner, inputs: list) -> None:
    slow = arrival("slow", GREEDY, inputs[0], every=6)
    fast = arrival("fast", GREEDY, inputs[1])
    result = drive(talker, [slow, fast])
    fast_steps = [i for i, (prefill, ids, _) in enumerate(result.steps) if "fast" in ids]
    assert fast_steps == list(range(len(fast_steps)))  # a step for the fast one every step until it is done
    assert any("slow" not in ids for prefill, ids, _ in result.steps[1:len(fast_steps)])  # while the slow waited
    assert any(o.status is RequestStatus.WAITING_FOR_CHUNK for o in result.outputs["slow"])
    assert codes(result, "slow") == codes(drive(talker, [arrival("slow", GREEDY, inputs[0])]), "slow")


@pytest.mark.parametrize("n", [1, 4, 8])
def test_one_talker_forward_per_decode_step_whatever_the_batch(talker: Qwen25TalkerRunner, inputs: list,
                                                               n: int) -> None:
    counter = ForwardCounter(talker.decoder)
    try:
        result = drive(talker, [arrival(f"r{i}", GREEDY, inputs[i]) for i in range(n)])
    finally:
        counter.close()
    assert not result.errors
    decode_steps = [ids for prefill, ids, _ in result.steps if not prefill]
    assert len(decode_steps) >= 5 and max(len(ids) for ids in decode_steps) == n
    assert counter.calls == n + len(decode_steps)  # one forward per prompt, then one per decode step


def test_a_seeded_sampled_request_is_the_same_alone_and_in_a_batch(talker: Qwen25TalkerRunner, inputs: list) -> None:
    seeded = {"seed": 1234, "max_tokens": 20}  # the model's decoding: temperature 0.9, top-k 40, top-p 0.8
    alone = drive(talker, [arrival("seeded", seeded, inputs[6])])
    others = [arrival(f"o{i}", {"temperature": 1.0, "max_tokens": 12 + i}, inputs[i], step=i) for i in range(7)]
    batched = drive(talker, [*others, arrival("seeded", seeded, inputs[6], step=2, every=2)])
    assert codes(alone, "seeded") == codes(batched, "seeded") and len(codes(alone, "seeded")) >= 5


def test_a_prompt_prefilled_in_pieces_gives_the_same_codes(checkpoint: Path, talker: Qwen25TalkerRunner,
                                                           inputs: list) -> None:
    # the prompts share their leading blocks: without the prefix cache every piece of the long one is fed
    chunked = runner(checkpoint, prefill_chunk_tokens=16, prefix_caching=False)
    streams = [arrival(f"s{i}", GREEDY, inputs[i]) for i in range(3)]
    long_prompt = arrival("long", GREEDY, inputs[5], step=2)
    result = drive(chunked, [*streams, long_prompt])
    pieces = [i for i, (prefill, ids, _) in enumerate(result.steps) if prefill and ids == ["long"]]
    assert len(pieces) >= len(inputs[5][0]["prompt"]["input_ids"]) // 16
    for earlier, later in zip(pieces, pieces[1:], strict=False):  # the streams decode between any two pieces
        assert any(not result.steps[i][0] for i in range(earlier + 1, later))
    want = drive(talker, [*streams, long_prompt])
    assert all(codes(result, rid) == codes(want, rid) for rid in ("s0", "s1", "s2", "long"))


def test_admission_under_a_tiny_kv_budget_queues_and_serves_every_request(checkpoint: Path,
                                                                          talker: Qwen25TalkerRunner,
                                                                          inputs: list) -> None:
    per_token = token_bytes(talker.model.config, torch.float32)
    small = runner(checkpoint, kv_cache_bytes=per_token * 16 * 12, kv_block_tokens=16)  # ~2 requests' worth
    arrivals = [arrival(f"r{i}", GREEDY, inputs[i]) for i in range(6)]
    result = drive(small, arrivals)
    assert not result.errors and all(result.finished(a.request_id) for a in arrivals)
    assert max(len(ids) for prefill, ids, _ in result.steps if not prefill) < 6  # it could not run them all at once
    want = drive(talker, arrivals)
    assert all(codes(result, a.request_id) == codes(want, a.request_id) for a in arrivals)
    assert small.kv.free_blocks == small.kv.num_blocks
    never = drive(small, [arrival("huge", {"temperature": 0.0, "max_tokens": 10_000}, inputs[0])])
    assert "sampling_params.max_tokens" in never.errors["huge"] and "raise kv_cache_bytes" in never.errors["huge"]


def test_a_request_that_breaks_the_step_fails_alone(talker: Qwen25TalkerRunner, inputs: list,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    arrivals = [arrival(f"r{i}", GREEDY, inputs[i], every=1) for i in range(4)]
    want = drive(talker, arrivals)
    emit = talker.emit

    def broken(request: Any, code: int, *rest: Any) -> Any:
        if request.request_id == "r2" and len(request.runner_state.generated) == 4:
            raise RuntimeError("boom")
        return emit(request, code, *rest)

    monkeypatch.setattr(talker, "emit", broken)
    result = drive(talker, arrivals)
    assert set(result.errors) == {"r2"} and "boom" in result.errors["r2"]
    for rid in ("r0", "r1", "r3"):
        assert codes(result, rid) == codes(want, rid) and result.finished(rid)
    assert talker.kv.free_blocks == talker.kv.num_blocks


def test_batched_decoding_is_faster_than_stepping_each_request(talker: Qwen25TalkerRunner, inputs: list) -> None:
    """Not a speed bound (timers do not fail tests): the figures, printed for the record (one thread: other
    processes on a small machine make torch's thread pool stall)."""
    params = {"temperature": 0.0, "max_tokens": 40}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        print_figures(talker, inputs, params)
    finally:
        torch.set_num_threads(threads)


def print_figures(talker: Qwen25TalkerRunner, inputs: list, params: dict[str, Any]) -> None:
    for n in (1, 8):
        arrivals = [arrival(f"r{i}", params, inputs[i]) for i in range(n)]
        figures = {}
        for per_request in (True, False):
            start = time.perf_counter()
            result = drive(talker, arrivals, per_request=per_request)
            figures[per_request] = sum(len(codes(result, a.request_id)) for a in arrivals) / \
                (time.perf_counter() - start)
        print(f"tiny qwen2.5 talker, {n} request(s): {figures[False]:.0f} codes/s batched, {figures[True]:.0f} "
              f"codes/s per request ({figures[False] / figures[True]:.1f}x)")


def test_the_speaker_option_sets_the_voice_of_requests_that_name_none(checkpoint: Path, talker: Qwen25TalkerRunner,
                                                                     inputs: list) -> None:
    """Qwen3's talker option, here too: the stage's ``speaker`` (any case) is the voice of a request that names
    none, the same codes as a request naming it; an unknown voice is refused naming the option or the field."""
    names = sorted(load_speakers(checkpoint))
    other = next(name for name in names if name != talker.speaker)
    chosen = runner(checkpoint, speaker=other.upper())
    assert chosen.speaker == other
    named = drive(talker, [arrival("named", {**GREEDY, "extra": {"speaker": other}}, inputs[0])])
    by_option = drive(chosen, [arrival("plain", GREEDY, inputs[0])])
    default = drive(talker, [arrival("plain", GREEDY, inputs[0])])
    assert codes(by_option, "plain") == codes(named, "named")

    def voices(result: DriveResult, request_id: str) -> set[str]:  # what the token2wav is told to speak with
        return {o.data["speaker"] for o in result.outputs[request_id] if o.data}

    assert voices(by_option, "plain") == voices(named, "named") == {other}
    assert voices(default, "plain") == {talker.speaker} != {other}
    with pytest.raises(FieldError) as unknown:
        runner(checkpoint, speaker="nobody")
    assert unknown.value.field == "stages.talker.options.speaker" and other in unknown.value.rule
    with pytest.raises(FieldError) as asked:
        talker.validate({"extra": {"speaker": "nobody"}})
    assert asked.value.field == "sampling_params.extra.speaker"


def test_a_prompt_sharing_its_start_with_an_earlier_one_is_not_prefilled_again(checkpoint: Path,
                                                                             talker: Qwen25TalkerRunner,
                                                                             thinker: ThinkerOutputs) -> None:
    """Two questions opening alike (a second conversation with the same opening, a conversation's next turn): the
    talker's prompt is the thinker's whole prompt, so the second shares the blocks of the opening, and the codes
    are those of a talker without the prefix cache."""
    opening = "tell me about the picture and the sound, " * 5
    inputs = [thinker.chunks({"text": opening + question}, "it is so") for question in ("first?", "then second?")]
    plain = runner(checkpoint, prefix_caching=False)
    hits = []
    for i, chunks in enumerate(inputs):
        before = talker.kv.prefix_hits
        got = drive(talker, [arrival(f"p{i}", GREEDY, chunks)])
        hits.append(talker.kv.prefix_hits - before)
        assert codes(got, f"p{i}") == codes(drive(plain, [arrival(f"p{i}", GREEDY, chunks)]), f"p{i}")
    assert hits[1] >= hits[0] + 2 * talker.kv.block_tokens, hits  # the opening's blocks, at least
    assert plain.kv.prefix_hits == 0
