"""Voxtral Realtime's transcriber on a tiny random checkpoint, in-process with the stage's own scheduler and step:
greedy float32 tokens equal ``VoxtralRealtimeForConditionalGeneration.generate`` on the same ids and log-mel frames
(clips long enough that the encoder's and the language model's sliding windows slide); eight requests joining at
different steps equal each stepped alone; the prompt and padding are mistral-common's offline streaming layout; the
released sizes count Voxtral-Mini-4B-Realtime-2602's parameters; bad input fails the request, naming its field."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnipipe.models.registry import TINY_CHECKPOINTS, get_pipeline
from omnipipe.models.voxtral_realtime.processors import transcription_prompt
from omnipipe.models.voxtral_realtime.runners.transcriber import VoxtralRealtimeRunner
from omnipipe.models.voxtral_realtime.weights.tiny import RELEASED, write_tiny_checkpoint
from omnipipe.stage.runner import RunnerContext
from omnipipe.stage.runner_driver import Arrival, DriveResult, drive
from omnipipe.util.field_error import FieldError

pytestmark = pytest.mark.slow  # a tiny checkpoint written for the module, run beside transformers' generate

PER_TOKEN = 1280  # samples of one audio token (80 ms at 16 kHz)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("voxtral_realtime") / "ckpt", seed=0)


def runner(checkpoint: Path, **options: Any) -> VoxtralRealtimeRunner:
    loaded = VoxtralRealtimeRunner(RunnerContext("transcriber", "cpu", 1, 8, {"model": str(checkpoint), **options}))
    loaded.load()
    return loaded


@pytest.fixture(scope="module")
def transcriber(checkpoint: Path) -> VoxtralRealtimeRunner:
    return runner(checkpoint)


@pytest.fixture(scope="module")
def model(checkpoint: Path) -> Any:
    from transformers import VoxtralRealtimeForConditionalGeneration

    return VoxtralRealtimeForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True).eval()


def clip(seconds: float, seed: int) -> np.ndarray:
    """A tone with a little noise, 16 kHz (the seed picks the pitch and the noise)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    tone = 0.3 * np.sin(2 * np.pi * (150 + 40 * seed) * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return (tone + 0.02 * rng.standard_normal(t.size)).astype(np.float32)


def tokens(result: DriveResult, rid: str) -> list[int]:
    assert not result.errors, result.errors
    return [o.data["token"] for o in result.outputs[rid] if o.data]


def processed(transcriber: VoxtralRealtimeRunner) -> None:
    """Wait until every prompt admitted so far is processed, so a request joins the batch at the step it arrives."""
    done = threading.Event()
    transcriber.prompts.run(done.set)
    assert done.wait(60)


def generated(model: Any, inputs: dict[str, torch.Tensor], delay: int) -> list[int]:
    ids = inputs["input_ids"]
    with torch.inference_mode():
        out = model.generate(input_ids=ids, input_features=inputs["input_features"],
                             attention_mask=torch.ones_like(ids), num_delay_tokens=delay, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("seconds", [0.7, 3.3, 9.0])
def test_greedy_tokens_equal_generate(transcriber: VoxtralRealtimeRunner, model: Any, seconds: float) -> None:
    sound = clip(seconds, seed=int(seconds))
    inputs = transcriber.inputs(sound)
    audio_tokens = inputs["input_features"].shape[-1] // 8
    want = generated(model, inputs, transcriber.inputs.num_delay_tokens)
    assert len(want) == audio_tokens - inputs["input_ids"].shape[1]  # one text token a position, to the audio's end
    if seconds > 5:  # past both sliding windows (the language model's 48 positions, the encoder's 96 frames)
        assert audio_tokens > 48 and audio_tokens * 4 > 96
    result = drive(transcriber, [Arrival("r", {"temperature": 0.0}, [{"audio": sound}])])
    assert tokens(result, "r") == want
    last = result.outputs["r"][-1]
    assert last.finished and last.details == {"duration": pytest.approx(seconds, abs=1e-4)}
    assert result.text("r") == transcriber.inputs.tokenizer.decode(want, skip_special_tokens=True)


def test_eight_requests_joining_at_different_steps_equal_each_stepped_alone(
        transcriber: VoxtralRealtimeRunner) -> None:
    arrivals = [Arrival(f"r{i}", {"temperature": 0.0}, [{"audio": clip(1 + 0.6 * i, seed=i)}], step=2 * i)
                for i in range(8)]
    alone = drive(transcriber, arrivals, per_request=True)
    batched = drive(transcriber, arrivals, on_step=lambda _: processed(transcriber))
    assert max(len(ids) for prefill, ids, _ in batched.steps if not prefill) == 8  # they did share steps
    for arrival in arrivals:
        rid = arrival.request_id
        assert tokens(batched, rid) == tokens(alone, rid) and len(tokens(alone, rid)) > 10
        assert batched.text(rid) == alone.text(rid) and batched.finished(rid)
    assert transcriber.kv.free_blocks == transcriber.kv.num_blocks  # every request gave its blocks back


def test_max_tokens_and_prefill_pieces(checkpoint: Path, transcriber: VoxtralRealtimeRunner) -> None:
    sound = clip(2.5, seed=3)
    whole = tokens(drive(transcriber, [Arrival("r", {"temperature": 0.0}, [{"audio": sound}])]), "r")
    pieces = runner(checkpoint, prefill_chunk_tokens=5)
    result = drive(pieces, [Arrival("r", {"temperature": 0.0}, [{"audio": sound}])])
    assert tokens(result, "r") == whole
    assert sum(1 for prefill, _, _ in result.steps if prefill) >= 23 // 5  # the 23-token prompt in pieces
    capped = drive(transcriber, [Arrival("r", {"temperature": 0.0, "max_tokens": 5}, [{"audio": sound}])])
    assert tokens(capped, "r") == whole[:5] and capped.outputs["r"][-1].finish_reason == "length"


def test_the_prompt_is_mistral_commons_offline_streaming_layout(transcriber: VoxtralRealtimeRunner) -> None:
    """``<s>`` + [STREAMING_PAD] x (16 left-pad tokens + 6 delay tokens); the clip padded with 16 tokens of silence
    on the left, to a whole token and 6 + 1 + 10 tokens on the right; 8 log-mel frames a token."""
    pad = transcriber.inputs.tokenizer.convert_tokens_to_ids("[STREAMING_PAD]")
    sound = clip(1.0, seed=1)  # 12.5 tokens
    inputs = transcriber.inputs(sound)
    assert inputs["input_ids"][0].tolist() == [1] + [pad] * 22
    padded = transcriber.inputs.padded(sound)
    assert len(padded) == (16 + 13 + 17) * PER_TOKEN
    assert not padded[:16 * PER_TOKEN].any() and np.array_equal(padded[16 * PER_TOKEN:16 * PER_TOKEN + 16000], sound)
    assert inputs["input_features"].shape == (1, 128, (16 + 13 + 17) * 8)
    entry = transcription_prompt({"prompt": "", "multi_modal_data": {"audio": [sound]}})
    assert entry.stage == "transcriber" and np.array_equal(entry.data["audio"], sound)


def test_bad_input_is_refused_naming_its_field(transcriber: VoxtralRealtimeRunner, checkpoint: Path) -> None:
    with pytest.raises(FieldError) as caught:
        transcription_prompt({"prompt": "", "multi_modal_data": {"audio": [clip(1, 1), clip(1, 2)]}})
    assert caught.value.field == "prompt.multi_modal_data.audio"
    result = drive(transcriber, [Arrival("bad", {"temperature": 0.0}, [{"audio": np.zeros((2, 2), np.float32)}]),
                                 Arrival("fine", {"temperature": 0.0, "max_tokens": 3}, [{"audio": clip(1, 1)}])])
    assert result.errors["bad"].startswith("prompt.multi_modal_data.audio:") and "fine" not in result.errors
    with pytest.raises(FieldError) as caught:
        runner(checkpoint, paged_attention="reference")
    assert caught.value.field == "stages.transcriber.options.paged_attention"
    pipeline = get_pipeline("voxtral_realtime")
    assert pipeline.input_modalities == ("audio",) and pipeline.output_modalities == ["text"]
    assert "voxtral_realtime" in TINY_CHECKPOINTS


def test_the_released_sizes_have_voxtral_mini_4b_realtimes_parameter_count() -> None:
    """The sizes ``--size released`` writes, counted on the meta device: the encoder 970.4M, the language model
    3.43B (its output layer tied to its embedding)."""
    from transformers import VoxtralRealtimeConfig, VoxtralRealtimeForConditionalGeneration

    config = VoxtralRealtimeConfig(audio_config=RELEASED["audio"], text_config=RELEASED["text"])
    with torch.device("meta"):
        model = VoxtralRealtimeForConditionalGeneration(config)
    assert sum(param.numel() for param in model.parameters()) == 4_429_679_360
    assert sum(param.numel() for param in model.model.audio_tower.parameters()) == 970_395_392
