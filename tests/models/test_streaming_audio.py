"""Audio streamed into a Qwen-Omni thinker (tiny random checkpoints, CPU, float32) in pieces of 20-200 ms gives what
the whole clip gives: the feature extractor's tensors bit for bit (features and mask), and the audio encoder's
output within ENCODER_BOUND of its absmax.

The bound: the streamed encoder reads the same features, cut where the model cuts them, but runs a chunk (Qwen2.5)
or an attention window (Qwen3) per call instead of the whole clip in one call, so only the kernels' rounding may
differ (matrix products sum in an order that can depend on how many rows a call holds). Measured: at most 4e-7 of
the absmax on clips up to 20 s. The tests give the tiny checkpoints' audio convolutions random biases (theirs are
zero, under which a chunk's zero padding cannot show)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnipipe.bench.streaming_audio import pieces, speech_like_clip
from omnipipe.stage.streaming_audio import LogMelStream, StreamingAudioInput

ENCODER_BOUND = 2e-6  # of the whole-clip output's absmax


class Family:
    """A tiny checkpoint's thinker, its whole-clip processing (as its thinker stage does it) and new streams."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        if name == "qwen2_5_omni":
            from omnipipe.models.qwen2_5_omni.modeling.audio_stream import streaming_audio
            from omnipipe.models.qwen2_5_omni.thinker_inputs import ThinkerInputs
            from omnipipe.models.qwen2_5_omni.weights.load import load_part
            from omnipipe.models.qwen2_5_omni.weights.tiny import write_tiny_checkpoint

            write_tiny_checkpoint(directory, seed=0)
            self.thinker = load_part(directory, "thinker", torch.device("cpu"), torch.float32)
            inputs = ThinkerInputs(directory, 2.0, 8)
            self.extractor = inputs.processor.feature_extractor
            self.whole_inputs: Callable[[np.ndarray], dict[str, Any]] = \
                lambda clip: inputs({"text": "hi", "history": [], "audios": [clip]})
        else:
            from omnipipe.models.qwen3_omni.modeling.audio_stream import streaming_audio
            from omnipipe.models.qwen3_omni.thinker_inputs import ThinkerInputBuilder
            from omnipipe.models.qwen3_omni.weights.load import load_config, load_part
            from omnipipe.models.qwen3_omni.weights.tiny import write_tiny_checkpoint

            write_tiny_checkpoint(directory, seed=0)
            self.thinker = load_part(directory, "thinker", "cpu", torch.float32)
            builder = ThinkerInputBuilder(directory, load_config(directory))
            self.extractor = builder.feature_extractor
            self.whole_inputs = lambda clip: builder({"text": "hi", "audios": [clip]})
        # the tiny checkpoints' convolutions have zero biases, under which a chunk's zero padding is invisible
        tower = self.thinker.model.audio_tower
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for conv in (tower.conv1, tower.conv2) if name == "qwen2_5_omni" else \
                    (tower.conv2d1, tower.conv2d2, tower.conv2d3):
                conv.bias.copy_(torch.randn(conv.bias.shape, generator=generator))
        self.new_stream: Callable[[bool], StreamingAudioInput] = \
            lambda encoder=True: streaming_audio(self.extractor, self.thinker if encoder else None)

    def whole(self, clip: np.ndarray) -> tuple[dict[str, Any], torch.Tensor]:
        """The thinker stage's inputs for the clip and its audio encoder's output over them."""
        inputs = self.whole_inputs(clip)
        with torch.inference_mode():
            embeds = self.thinker.get_audio_features(inputs["input_features"],
                                                     inputs["feature_attention_mask"]).last_hidden_state
        return inputs, embeds

    def streamed(self, clip: np.ndarray, seed: int) -> Any:
        stream = self.new_stream()
        for part in pieces(clip, seed):
            stream.append(part)
        return stream.finish()


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only contend on a shared box
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=["qwen2_5_omni", "qwen3_omni"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    return Family(request.param, tmp_path_factory.mktemp(request.param) / "ckpt")


def assert_within_bound(streamed: torch.Tensor, whole: torch.Tensor) -> None:
    assert streamed.shape == whole.shape
    difference = float((streamed - whole).abs().max())
    assert difference <= ENCODER_BOUND * float(whole.abs().max()), f"{difference} over absmax {whole.abs().max()}"


# 0.3 s: under one chunk; 2 s: whole chunks only; 4.37 s: a partial tail; 9.1 s: more than two Qwen3 windows
@pytest.mark.parametrize("seconds", [0.3, 2.0, 4.37, 9.1])
def test_a_clip_streamed_in_random_pieces_equals_the_whole_clip(family: Family, seconds: float) -> None:
    clip = speech_like_clip(seconds, seed=int(seconds * 100))
    inputs, embeds = family.whole(clip)
    for seed in (1, 2):
        streamed = family.streamed(clip, seed)
        assert torch.equal(streamed.input_features, inputs["input_features"])
        assert torch.equal(streamed.feature_attention_mask, inputs["feature_attention_mask"])
        assert_within_bound(streamed.audio_embeds, embeds)


def test_the_work_is_done_while_the_clip_streams_and_only_the_tail_is_left(family: Family) -> None:
    clip = speech_like_clip(9.5, seed=3)  # 950 frames: 9 whole chunks and a tail of 50
    clip[:1600] += 0.9 * np.sin(np.arange(1600) * 0.2).astype(np.float32)  # the loudest sound comes first
    streamed = family.streamed(clip, seed=4)
    stats = streamed.stats
    assert stats["chunks_kept"] == 9 and stats["chunks_redone"] == 1
    windows = 1 if family.name == "qwen2_5_omni" else 4  # Qwen3's tiny checkpoint attends within 4 chunks
    assert stats["windows_kept"] == 9 // windows and stats["windows_redone"] == 1
    assert_within_bound(streamed.audio_embeds, family.whole(clip)[1])


@pytest.mark.parametrize(("loud_at_s", "redone_streaming", "kept", "redone"), [(3.0, 2, 5, 1), (5.5, 0, 0, 6)])
def test_a_louder_sound_changes_the_chunks_before_it_and_they_are_redone(family: Family, loud_at_s: float,
                                                                         redone_streaming: int, kept: int,
                                                                         redone: int) -> None:
    """A sound louder than all before it raises the normalisation's floor of every earlier chunk: mid-clip, they
    are redone as the next chunk completes (while the user speaks); in the last piece, at the end."""
    clip = speech_like_clip(6.0, seed=5) * 0.3  # 600 frames: 6 chunks, the last completed by the last piece
    loud = slice(int(loud_at_s * 16000), int(loud_at_s * 16000) + 8000)
    clip[loud] += np.sin(np.arange(8000) * 0.3).astype(np.float32)
    streamed = family.streamed(clip, seed=6)
    stats = streamed.stats
    assert stats["chunks_redone_streaming"] >= redone_streaming
    assert (stats["chunks_kept"], stats["chunks_redone"]) == (kept, redone)
    inputs, embeds = family.whole(clip)
    assert torch.equal(streamed.input_features, inputs["input_features"])
    assert_within_bound(streamed.audio_embeds, embeds)


def test_features_alone_stream_without_an_encoder(family: Family) -> None:
    clip = speech_like_clip(1.3, seed=7)
    stream = family.new_stream(False)
    for part in pieces(clip, seed=8):
        stream.append(part)
    streamed = stream.finish()
    assert streamed.audio_embeds is None
    assert torch.equal(streamed.input_features, family.whole_inputs(clip)["input_features"])


def test_qwen2_5_cuts_a_clip_at_30_seconds_as_its_processor_does(tmp_path: Path) -> None:
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=128)
    clip = speech_like_clip(31.0, seed=9)
    whole = extractor([clip], sampling_rate=16000, padding="max_length", return_attention_mask=True,
                      return_tensors="pt")
    stream = StreamingAudioInput(LogMelStream(extractor, 480_000))
    for part in pieces(clip, seed=10):
        stream.append(part)
    streamed = stream.finish()
    assert torch.equal(streamed.input_features, whole["input_features"])
    assert torch.equal(streamed.feature_attention_mask, whole["attention_mask"])


def test_a_finished_stream_takes_no_more_audio_and_a_too_short_clip_is_refused() -> None:
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=128)
    stream = StreamingAudioInput(LogMelStream(extractor))
    stream.append(np.zeros(150, dtype=np.float32))
    with pytest.raises(ValueError, match="too short"):
        stream.finish()
    with pytest.raises(RuntimeError, match="finished"):
        stream.append(np.zeros(10, dtype=np.float32))


def test_a_streamed_clip_in_the_thinkers_prompt_gives_the_decoder_what_the_whole_clip_gives(family: Family) -> None:
    """The thinker's inputs built from a finished stream: the same ids, features and mask as from the clip; and the
    decoder's input embeddings with the streamed encoder output merged (the audio tower not run again) within the
    bound of those the model merges from the features itself."""
    from omnipipe.stage.prompt_pieces import capture_decoder_inputs
    from omnipipe.stage.streaming_audio import merge_audio_embeds

    clip = speech_like_clip(3.3, seed=11)
    whole, _ = family.whole(clip)
    streamed = family.whole_inputs(family.streamed(clip, seed=12))  # type: ignore[arg-type]
    for key in ("input_ids", "attention_mask", "input_features", "feature_attention_mask"):
        assert torch.equal(streamed[key], whole[key]), key
    model = family.thinker.model
    config = family.thinker.config
    token = config.audio_token_index if family.name == "qwen2_5_omni" else config.audio_token_id
    common = {"input_ids": whole["input_ids"], "attention_mask": whole["attention_mask"], "use_cache": False,
              "feature_attention_mask": whole["feature_attention_mask"]}
    if family.name == "qwen3_omni":
        common["position_ids"] = family.thinker._prepare_position_ids_for_generation(
            whole["input_ids"], {**whole, "past_key_values": None})
        model.rope_deltas = None
    with torch.inference_mode():
        by_model = capture_decoder_inputs(model, model.language_model, input_features=whole["input_features"],
                                          **common)
        merged = merge_audio_embeds(model.get_input_embeddings(), whole["input_ids"], token,
                                    streamed["audio_embeds"])
        by_stream = capture_decoder_inputs(model, model.language_model, inputs_embeds=merged, **common)
    audio = whole["input_ids"][0] == token
    assert int(audio.sum()) == streamed["audio_embeds"].shape[0] > 0
    assert torch.equal(by_stream["inputs_embeds"][0, ~audio], by_model["inputs_embeds"][0, ~audio])
    assert_within_bound(by_stream["inputs_embeds"][0, audio], by_model["inputs_embeds"][0, audio])
    assert torch.equal(by_stream["position_ids"], by_model["position_ids"])
