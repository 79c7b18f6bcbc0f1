"""Voxtral Realtime's transcriber on a tiny random checkpoint, in-process with the stage's own scheduler and step:
greedy float32 tokens equal ``VoxtralRealtimeForConditionalGeneration.generate`` on the same ids and log-mel frames
(clips long enough that the encoder's and the language model's sliding windows slide); eight requests joining at
different steps equal each stepped alone; the prompt and padding are mistral-common's offline streaming layout; the
released sizes count Voxtral-Mini-4B-Realtime-2602's parameters; bad input fails the request, naming its field.

Live: a stream appended to in uneven pieces gives the extractor's log-mel frames (each token's once its windows are
heard), the same encoder output however it is cut (and the whole clip's to float rounding), and a session that
waits for each position's audio, streams text before the audio ends and ends, once the stream is dropped, with the
whole clip's tokens; through the engine with real stage processes too."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnipipe.models.registry import TINY_CHECKPOINTS, get_pipeline
from omnipipe.models.voxtral_realtime.processors import transcription_prompt
from omnipipe.models.voxtral_realtime.runners.transcriber import VoxtralRealtimeRunner
from omnipipe.models.voxtral_realtime.streaming import HeardClip, LogMelTokens
from omnipipe.models.voxtral_realtime.weights.tiny import RELEASED, write_tiny_checkpoint
from omnipipe.stage.runner import RunnerContext
from omnipipe.stage.runner_driver import Arrival, DriveResult, drive
from omnipipe.stage.streaming_audio import AUDIO_FIELD
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


# ----------------------------------------------------------------------------------------------------- live audio
def pieces(sound: np.ndarray, seed: int, most: int = 2880) -> list[np.ndarray]:
    """``sound`` cut into uneven pieces of 1 sample to ``most``."""
    rng = np.random.default_rng(seed)
    cuts, at = [], 0
    while at < len(sound):
        size = int(rng.integers(1, most))
        cuts.append(sound[at:at + size])
        at += size
    return cuts


def test_a_streams_log_mel_frames_are_the_extractors_each_once_its_windows_are_heard(
        transcriber: VoxtralRealtimeRunner) -> None:
    """A token's 8 frames come once the 40 samples of the next token its last window reads are heard (the left
    silence's at once); at the end the right padding's; all of them the feature extractor's frames of the whole
    padded clip (bit-equal on MKL's AVX-512 kernels; a last-bit difference at most elsewhere)."""
    inputs = transcriber.inputs
    for seconds, seed in ((0.05, 1), (2.37, 2), (6.0, 3)):
        sound = clip(seconds, seed)
        whole = inputs(sound)["input_features"][0]
        stream = LogMelTokens(inputs.feature_extractor, inputs.geometry)
        made, heard = [], 16 * PER_TOKEN
        for part in pieces(sound, seed):
            made += stream.push(part)
            heard += len(part)
            assert len(made) == max(0, (heard - 1320) // PER_TOKEN + 1)  # each token held back 40 samples
        made += stream.end()
        streamed = torch.cat(made, dim=1)
        assert streamed.shape == whole.shape and stream.total == whole.shape[1] // 8
        assert (streamed - whole).abs().max().item() <= 2.4e-7


def test_a_streams_encoder_output_is_the_same_however_it_is_cut(transcriber: VoxtralRealtimeRunner) -> None:
    """One token at a time, the embeddings are bit-equal for any pieces; the whole clip's (its encoder run 64
    tokens at once) equal them to float rounding: 4.2e-5 of absmax 19 here."""
    sound = clip(5.5, seed=4)
    heard = []
    for seed in (5, 6):
        stream = HeardClip(transcriber.inputs, transcriber.model)
        for part in pieces(sound, seed, most=6000 * seed - 29000):  # pieces of 1 sample to 60 ms; to 440 ms
            stream.append(part)
        assert stream.total is None and stream.ready == (16 * PER_TOKEN + len(sound) - 1320) // PER_TOKEN + 1
        stream.close()
        heard.append(torch.stack(stream.embeddings))
        assert stream.total == len(stream.embeddings) and stream.clip_s == pytest.approx(5.5)
    assert torch.equal(heard[0], heard[1])
    with torch.inference_mode():
        whole = transcriber.encode(transcriber.inputs(sound)["input_features"])
    assert heard[0].shape == whole.shape
    assert (heard[0] - whole).abs().max().item() <= 1e-5 * whole.abs().max().item()


def live_session(transcriber: VoxtralRealtimeRunner, rid: str, parts: list[np.ndarray], every: int = 2,
                 params: dict[str, Any] | None = None) -> tuple[DriveResult, int]:
    """A session hearing stream ``rid``: a piece appended every ``every`` steps, then the stream dropped; and the
    step of its last append."""
    last = every * len(parts)

    def speak(step: int) -> None:
        if step % every == 0 and step // every < len(parts):
            transcriber.append_audio(rid, None, parts[step // every], step // every)
        elif step == last:
            transcriber.drop_audio_stream(rid)

    arrival = Arrival(rid, params or {"temperature": 0.0}, [{"stream": rid}])
    return drive(transcriber, [arrival], on_step=speak), last - every


def test_a_live_session_waits_for_its_audio_streams_text_and_ends_with_the_whole_clips_tokens(
        transcriber: VoxtralRealtimeRunner, model: Any) -> None:
    sound = clip(4.1, seed=7)
    inputs = transcriber.inputs(sound)
    want = generated(model, inputs, transcriber.inputs.num_delay_tokens)
    whole = drive(transcriber, [Arrival("whole", {"temperature": 0.0}, [{"audio": sound}])])
    assert tokens(whole, "whole") == want
    parts = pieces(sound, seed=8, most=1800)  # ~0.7 tokens a piece: a session outruns its audio and waits
    outputs: list[Any] = []
    live, last_append = live_session(transcriber, "live", parts)
    outputs = live.outputs["live"]
    assert tokens(live, "live") == want and live.text("live") == whole.text("whole")
    statuses = [o.status.name for o in outputs]
    assert statuses[0] == "WAITING_FOR_CHUNK"  # its prompt's audio (the clip's first 560 ms) awaited
    assert statuses.count("WAITING_FOR_CHUNK") >= 10  # it waited for its positions' audio, never ahead of it
    texts = [i for i, o in enumerate(outputs) if o.text_delta]
    assert len(texts) > 10 and texts[0] < len(outputs) // 2  # text streamed while the audio came
    last = outputs[-1]
    assert last.finish_reason == "stop" and last.details == {"duration": pytest.approx(4.1, abs=1e-4)}
    assert transcriber.kv.free_blocks == transcriber.kv.num_blocks and len(transcriber.streams) == 0
    # a clip appended whole and dropped before its session starts is heard whole; a cap ends it early
    transcriber.append_audio("early", None, sound, 0)
    transcriber.drop_audio_stream("early")
    early = drive(transcriber, [Arrival("early", {"temperature": 0.0}, [{"stream": "early"}])])
    assert tokens(early, "early") == want
    capped, _ = live_session(transcriber, "capped", parts, params={"temperature": 0.0, "max_tokens": 5})
    assert tokens(capped, "capped") == want[:5] and capped.outputs["capped"][-1].finish_reason == "length"
    assert transcriber.kv.free_blocks == transcriber.kv.num_blocks and len(transcriber.streams) == 0


def test_live_sessions_joining_at_different_steps_equal_their_whole_clips(transcriber: VoxtralRealtimeRunner) -> None:
    sounds = {f"s{i}": clip(1.2 + 0.5 * i, seed=10 + i) for i in range(4)}
    cut = {rid: pieces(sound, seed=20 + i) for i, (rid, sound) in enumerate(sounds.items())}

    def speak(step: int) -> None:  # each stream's pieces from its own step on, one a step, then its end
        for i, rid in enumerate(cut):
            index = step - 3 * i
            if 0 <= index < len(cut[rid]):
                transcriber.append_audio(rid, None, cut[rid][index], index)
            elif index == len(cut[rid]):
                transcriber.drop_audio_stream(rid)

    arrivals = [Arrival(rid, {"temperature": 0.0}, [{"stream": rid}], step=2 * i) for i, rid in enumerate(cut)]
    live = drive(transcriber, arrivals, on_step=speak)
    assert max(len(ids) for prefill, ids, _ in live.steps if not prefill) == 4  # they did share steps
    for rid, sound in sounds.items():
        alone = drive(transcriber, [Arrival(rid, {"temperature": 0.0}, [{"audio": sound}])])
        assert tokens(live, rid) == tokens(alone, rid) and live.text(rid) == alone.text(rid)
    assert transcriber.kv.free_blocks == transcriber.kv.num_blocks and len(transcriber.streams) == 0


def test_bad_streams_fail_their_session_alone_naming_the_audio(transcriber: VoxtralRealtimeRunner) -> None:
    greedy = {"temperature": 0.0}
    transcriber.append_audio("shared", None, clip(0.8, 1), 0)
    transcriber.append_audio("gap", None, clip(0.8, 1), 0)
    transcriber.append_audio("gap", None, clip(0.2, 2), 2)

    def end(step: int) -> None:
        if step == 3:
            transcriber.drop_audio_stream("shared")
            transcriber.drop_audio_stream("silent")

    result = drive(transcriber, [Arrival("first", greedy, [{"stream": "shared"}]),
                                 Arrival("second", greedy, [{"stream": "shared"}], step=1),
                                 Arrival("gap", greedy, [{"stream": "gap"}], step=1),
                                 Arrival("silent", greedy, [{"stream": "silent"}], step=1)], on_step=end)
    assert result.errors["second"].startswith(f"{AUDIO_FIELD}:") and "already heard" in result.errors["second"]
    assert result.errors["gap"].startswith(f"{AUDIO_FIELD}:") and "lost appends 1 to 1" in result.errors["gap"]
    assert result.errors["silent"].startswith(f"{AUDIO_FIELD}:") and "before any audio" in result.errors["silent"]
    assert "first" not in result.errors and result.outputs["first"][-1].finish_reason == "stop"
    assert transcriber.kv.free_blocks == transcriber.kv.num_blocks and len(transcriber.streams) == 0
    entry = transcription_prompt({"multi_modal_data": {"audio": [{"stream": "s1"}]}})
    assert entry.stage == "transcriber" and entry.data == {"stream": "s1"}
    with pytest.raises(FieldError) as caught:
        transcription_prompt({"multi_modal_data": {"audio": [{"stream": 3}]}})
    assert caught.value.field == f"{AUDIO_FIELD}[0].stream"
    assert transcriber.max_audio_streams == 32 and transcriber.max_audio_stream_s == 300.0


# ----------------------------------------------------------------------------------------------- the engine
def test_a_live_session_through_the_engine(checkpoint: Path, transcriber: VoxtralRealtimeRunner) -> None:
    """Real stage processes: the first text comes while the user still speaks; the transcript, once the stream is
    dropped, is the whole clip's."""
    from omnipipe import AsyncOmni, SamplingParams

    sound = clip(3.5, seed=30)
    want = drive(transcriber, [Arrival("whole", {"temperature": 0.0}, [{"audio": sound}])]).text("whole")
    deploy = {"stages": {"transcriber": {"threads": 1, "options": {"model": str(checkpoint)}}}}
    half = len(sound) // 2

    async def run() -> tuple[str, str, str | None, list[str]]:
        async with AsyncOmni("voxtral_realtime", deploy) as engine:
            first_text = asyncio.Event()
            text, before_end, reason, deltas = "", "", None, []

            async def speak() -> None:
                for part in pieces(sound[:half], seed=31):
                    await engine.append_audio("live", part, session_id="call")
                await asyncio.wait_for(first_text.wait(), 120)  # text while the user still speaks
                for part in pieces(sound[half:], seed=32):
                    await engine.append_audio("live", part, session_id="call")
                await engine.drop_audio_stream("live")  # the user stops

            speaker = asyncio.ensure_future(speak())
            async for out in engine.generate({"multi_modal_data": {"audio": [{"stream": "live"}]}},
                                             sampling_params={"transcriber": SamplingParams(temperature=0)},
                                             session_id="call"):
                text += out.text_delta
                deltas.append(out.text_delta)
                if text and not first_text.is_set():
                    before_end = text
                    first_text.set()
                if out.finished:
                    reason = out.finish_reason
            await speaker
            assert engine.engine.audio_streams == {}  # the dropped stream is gone
            return text, before_end, reason, deltas

    text, before_end, reason, deltas = asyncio.run(run())
    assert reason == "stop" and text == want
    assert before_end and text.startswith(before_end) and len(before_end) < len(text)
