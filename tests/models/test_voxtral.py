"""The Voxtral thinker on a tiny random checkpoint, in-process with the stage's own scheduler and step: greedy
float32 tokens equal ``VoxtralForConditionalGeneration.generate`` on the same ids and log-mel windows, for a clip
in one 30 s window and one over two; eight requests joining at different steps equal each stepped alone; a clip
asked about again is served from the prefix cache (its audio not encoded again) with the same tokens; the prompt
has Mistral's instruct and transcription layouts; bad input fails the request, naming its field."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnipipe.api.prompt import normalize_prompt
from omnipipe.models.registry import get_pipeline
from omnipipe.models.voxtral.processors import transcription_prompt
from omnipipe.models.voxtral.runners.thinker import VoxtralThinkerRunner
from omnipipe.models.voxtral.weights.tiny import RELEASED, write_tiny_checkpoint
from omnipipe.stage.runner import RunnerContext
from omnipipe.stage.runner_driver import Arrival, DriveResult, ForwardCounter, drive
from omnipipe.util.field_error import FieldError

pytestmark = pytest.mark.slow  # a tiny Voxtral checkpoint written for the module, run beside transformers' generate

WINDOW_S = 30
TOKENS_PER_WINDOW = 375  # the released geometry, which the tiny checkpoint keeps: 1500 encoder frames / 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("voxtral") / "ckpt", seed=0)


def runner(checkpoint: Path, **options: Any) -> VoxtralThinkerRunner:
    loaded = VoxtralThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {"model": str(checkpoint), **options}))
    loaded.load()
    return loaded


@pytest.fixture(scope="module")
def thinker(checkpoint: Path) -> VoxtralThinkerRunner:
    return runner(checkpoint)


@pytest.fixture(scope="module")
def model(checkpoint: Path) -> Any:
    from transformers import VoxtralForConditionalGeneration

    return VoxtralForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True).eval()


def clip(seconds: float, seed: int) -> np.ndarray:
    """A tone with a little noise, 16 kHz (the seed picks the pitch and the noise)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    tone = 0.3 * np.sin(2 * np.pi * (150 + 40 * seed) * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return (tone + 0.02 * rng.standard_normal(t.size)).astype(np.float32)


def tokens(result: DriveResult, rid: str) -> list[int]:
    assert not result.errors, result.errors
    return [o.data["token"] for o in result.outputs[rid] if o.data]


def processed(thinker: VoxtralThinkerRunner) -> None:
    """Wait until every prompt admitted so far is processed (its log-mel windows made on the background thread),
    so a request joins the batch at the step it arrives whatever this machine's speed."""
    done = threading.Event()
    thinker.prompts.run(done.set)
    assert done.wait(60)


def generated(model: Any, inputs: dict[str, torch.Tensor], max_new_tokens: int) -> list[int]:
    ids = inputs["input_ids"]
    with torch.inference_mode():
        out = model.generate(input_ids=ids, input_features=inputs.get("input_features"),
                             attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize(("seconds", "windows"), [(7.5, 1), (41.0, 2)])
def test_greedy_tokens_equal_generate_for_a_clip_in_one_window_and_over_two(
        thinker: VoxtralThinkerRunner, model: Any, seconds: float, windows: int) -> None:
    item = {"text": "what do you hear?", "audios": [clip(seconds, seed=windows)]}
    inputs = thinker.inputs(item)
    assert inputs["input_features"].shape == (windows, 128, 2 * 1500)
    assert int((inputs["input_ids"] == thinker.audio_token_id).sum()) == windows * TOKENS_PER_WINDOW
    result = drive(thinker, [Arrival("r", {"temperature": 0.0, "max_tokens": 16}, [item])])
    assert tokens(result, "r") == generated(model, inputs, 16)
    assert result.finished("r")


def test_eight_requests_joining_at_different_steps_equal_each_stepped_alone(thinker: VoxtralThinkerRunner) -> None:
    params = {"temperature": 0.0, "max_tokens": 24}
    items: list[dict[str, Any]] = [{"text": f"question {i}: " + "say more " * i, "audios": [clip(2 + i, seed=i)]}
                                   for i in range(6)]
    items += [{"text": "no audio, only text"}, {"text": "two clips", "audios": [clip(1, 7), clip(3, 8)]}]
    arrivals = [Arrival(f"r{i}", params, [item], step=i) for i, item in enumerate(items)]
    alone = drive(thinker, arrivals, per_request=True)
    batched = drive(thinker, arrivals, on_step=lambda _: processed(thinker))
    assert max(len(ids) for prefill, ids, _ in batched.steps if not prefill) == 8  # they did share steps
    for arrival in arrivals:
        rid = arrival.request_id
        assert tokens(batched, rid) == tokens(alone, rid) and len(tokens(alone, rid)) == 24
        assert batched.text(rid) == alone.text(rid) and batched.finished(rid)
    assert thinker.kv.free_blocks == thinker.kv.num_blocks  # every request gave its blocks back


def test_a_clip_asked_about_again_is_served_from_the_prefix_cache(checkpoint: Path,
                                                                  thinker: VoxtralThinkerRunner) -> None:
    computed = runner(checkpoint, prefix_caching=False)
    sound = clip(12, seed=11)
    cases = [("first", {"text": "what is it?", "audios": [sound]}),
             ("again", {"text": "what is it?", "audios": [sound]}),
             ("other question", {"text": "is it loud?", "audios": [sound]}),
             ("other clip", {"text": "what is it?", "audios": [clip(12, seed=12)]})]
    encoder = ForwardCounter(thinker.model.model.audio_tower)
    hits, encoded = {}, {}
    try:
        for rid, item in cases:
            before = thinker.kv.prefix_hits
            encoder.reset()
            got = drive(thinker, [Arrival(rid, {"temperature": 0.0, "max_tokens": 10}, [item])])
            hits[rid], encoded[rid] = thinker.kv.prefix_hits - before, encoder.reset()
            assert tokens(got, rid) == tokens(drive(computed, [Arrival(rid, {"temperature": 0.0, "max_tokens": 10},
                                                                        [item])]), rid)
    finally:
        encoder.close()
    block = thinker.kv.block_tokens
    audio_end = 3 + TOKENS_PER_WINDOW  # <s> [INST] [BEGIN_AUDIO] and the placeholders
    assert hits["again"] >= audio_end and encoded["again"] == 0  # the whole clip shared: its audio not encoded
    # another question about it: the clip's whole blocks shared (its last placeholders, in a block with the new
    # text, fed again from the encoder's output)
    assert hits["other question"] == audio_end // block * block and encoded["other question"] == 1
    assert hits["other clip"] < block and encoded["other clip"] == 1  # another clip: its own


def test_prompts_in_pieces_under_a_small_kv_budget_give_the_same_tokens(checkpoint: Path,
                                                                        thinker: VoxtralThinkerRunner) -> None:
    per_token = 2 * len(thinker.kv.keys) * thinker.kv.keys[0][0].numel() * 4  # keys and values, float32
    small = runner(checkpoint, prefill_chunk_tokens=64, kv_cache_bytes=per_token * 16 * 56)  # ~2 clips' prompts
    arrivals = [Arrival(f"r{i}", {"temperature": 0.0, "max_tokens": 12}, [{"text": f"q{i}", "audios": [clip(4, i)]}])
                for i in range(4)]
    result = drive(small, arrivals)
    want = drive(thinker, arrivals)
    assert all(tokens(result, a.request_id) == tokens(want, a.request_id) for a in arrivals)
    assert max(len(ids) for prefill, ids, _ in result.steps if not prefill) < 4  # not all fitted at once
    assert sum(1 for prefill, _, _ in result.steps if prefill) >= 4 * (3 + TOKENS_PER_WINDOW) // 64  # in pieces
    assert small.kv.free_blocks == small.kv.num_blocks
    never = drive(small, [Arrival("huge", {"temperature": 0.0, "max_tokens": 5000}, [{"text": "hi"}])])
    assert never.errors["huge"].startswith("sampling_params.max_tokens:")


def test_the_prompt_has_mistrals_instruct_and_transcription_layouts(thinker: VoxtralThinkerRunner) -> None:
    special = thinker.inputs.ids
    text = thinker.inputs.text_ids
    audio = [special["[BEGIN_AUDIO]"]] + [special["[AUDIO]"]] * TOKENS_PER_WINDOW
    sound = clip(3, seed=1)
    chat = thinker.inputs({"text": "and now?", "audios": [sound], "history": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"}]})
    want = [special["<s>"], special["[SYSTEM_PROMPT]"], *text("be brief"), special["[/SYSTEM_PROMPT]"],
            special["[INST]"], *text("hi"), special["[/INST]"], *text("hello"), special["</s>"],
            special["[INST]"], *audio, *text("and now?"), special["[/INST]"]]
    assert chat["input_ids"][0].tolist() == want
    entry = transcription_prompt({"prompt": "", "multi_modal_data": {"audio": [sound]}})
    transcribe = thinker.inputs(entry.data)
    assert transcribe["input_ids"][0].tolist() == [special["<s>"], special["[INST]"], *audio, special["[/INST]"],
                                                   special["[TRANSCRIBE]"]]
    english = thinker.inputs({**entry.data, "language": "en"})["input_ids"][0].tolist()
    assert english[-len(text("lang:en")) - 1:] == [*text("lang:en"), special["[TRANSCRIBE]"]]
    assert torch.equal(transcribe["input_features"], chat["input_features"])


def test_bad_input_is_refused_naming_its_field(thinker: VoxtralThinkerRunner) -> None:
    pipeline = get_pipeline("voxtral")
    with pytest.raises(FieldError) as caught:
        normalize_prompt({"prompt": "what is this?", "multi_modal_data": {"image": b"png"}},
                         pipeline.input_modalities, pipeline.takes_history)
    assert caught.value.field == "prompt.multi_modal_data.image"
    with pytest.raises(FieldError) as caught:
        normalize_prompt({"prompt": "say it"}, get_pipeline("voxtral_transcribe").input_modalities)
    assert caught.value.field == "prompt.prompt"
    with pytest.raises(FieldError) as caught:
        transcription_prompt({"prompt": "", "multi_modal_data": {"audio": [clip(1, 1), clip(1, 2)]}})
    assert caught.value.field == "prompt.multi_modal_data.audio"
    tool_turn = {"text": "go on", "history": [{"role": "tool", "content": "42", "tool_call_id": "c1"}]}
    result = drive(thinker, [Arrival("tools", {"temperature": 0.0, "max_tokens": 4}, [tool_turn]),
                             Arrival("fine", {"temperature": 0.0, "max_tokens": 4}, [{"text": "hi"}])])
    assert result.errors["tools"].startswith("prompt.history[0]:") and "fine" not in result.errors


def test_the_released_sizes_have_voxtral_mini_3bs_parameter_count() -> None:
    """The sizes ``--size released`` writes, counted on the meta device (nothing allocated): the audio encoder
    637.0M, the projector 25.2M, the Llama body 3.61B and its untied output layer 0.40B."""
    from transformers import VoxtralConfig, VoxtralForConditionalGeneration

    config = VoxtralConfig(audio_config=RELEASED["audio"], text_config={"model_type": "llama", **RELEASED["text"]},
                           audio_token_id=24)
    with torch.device("meta"):
        model = VoxtralForConditionalGeneration(config)
    assert sum(param.numel() for param in model.parameters()) == 4_676_271_104
