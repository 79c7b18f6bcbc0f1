"""Qwen2.5-Omni stage by stage through the engine, on a tiny random checkpoint, against transformers' own
``generate``: the same text (greedy), the same waveform (fixed noise) within AUDIO_TOLERANCE of its absmax, with
async chunk on and off; multimodal inputs reach the thinker; a chunked token2wav stays near a whole decode; an abort
mid-stream ends the request."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from omnipipe import SamplingParams
from tests.conftest import EngineHarness, collect

MAX_TEXT_TOKENS = 8
MAX_CODES = 40
SEED = 5
# a streamed waveform against transformers' whole decode (same noise): the windows carry 24 codes of left and 12
# of right context; measured 5e-7 of absmax on 96 codes (token2wav_seam_rows), float error
AUDIO_TOLERANCE = 1e-4
STREAM_BOUND = 1e-4
# small chunks so that the short tiny utterance streams in several windows
SMALL_CHUNKS = {"talker->token2wav": {"initial_codec_chunk_frames": 2, "codec_chunk_frames": 2}}
TALKER = SamplingParams(temperature=0.0, repetition_penalty=1.05, max_tokens=MAX_CODES)
PROMPT = "Hello! How are you today?"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from omnipipe.models.qwen2_5_omni.weights.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen2_5_omni"), seed=0)


@pytest.fixture(scope="module")
def reference(checkpoint):
    """transformers' generate on the same chat: (generated text ids, waveform)."""
    from transformers.models.qwen2_5_omni import Qwen2_5OmniForConditionalGeneration

    from omnipipe.models.qwen2_5_omni.modeling.processor import OmniProcessor
    from omnipipe.models.qwen2_5_omni.processors import chat_messages

    torch.set_num_threads(1)
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True).eval()
    processor = OmniProcessor.from_pretrained(checkpoint, local_files_only=True)
    text = processor.apply_chat_template(chat_messages({"text": PROMPT}), add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], return_tensors="pt")
    torch.manual_seed(SEED)
    with torch.no_grad():
        sequences, wav = model.generate(**inputs, thinker_max_new_tokens=MAX_TEXT_TOKENS,
                                        talker_max_new_tokens=MAX_CODES, talker_do_sample=False,
                                        talker_eos_token_id=[model.talker.codec_pad_token, model.talker.codec_eos_token],
                                        speaker="Chelsie")
    ids = sequences[0, inputs["input_ids"].shape[1]:].tolist()
    return processor.tokenizer.decode(ids, skip_special_tokens=True), wav.numpy(), model, processor


def _deploy(checkpoint, async_chunk: bool) -> dict:
    return {"async_chunk": async_chunk,
            "stages": {name: {"options": {"model": str(checkpoint)}} for name in ("thinker", "talker", "token2wav")}}


@pytest.fixture(scope="module", params=[True, False], ids=["async_chunk", "whole"])
def engine(request, checkpoint):
    harness = EngineHarness("qwen2_5_omni", _deploy(checkpoint, request.param))
    harness.deploy_async = request.param
    yield harness
    harness.close()


def _params() -> dict:
    return {"thinker": SamplingParams(temperature=0.0, max_tokens=MAX_TEXT_TOKENS), "talker": TALKER,
            "token2wav": SamplingParams(seed=SEED)}


def test_text_and_audio_equal_transformers_generate(engine, reference) -> None:
    text, wav, _, _ = reference
    outputs = engine.run(collect(engine.engine, PROMPT, sampling_params=_params(), edge_options=SMALL_CHUNKS))
    final = outputs[-1]
    assert text and final.finished and final.text == text
    if engine.deploy_async:  # the audio came in several windows
        assert final.metrics.edges["talker->token2wav"]["chunks"] >= 3
    assert final.sample_rate_hz == 24_000
    audio = final.audio
    assert audio is not None and len(audio) == len(wav)
    scale = float(np.abs(wav).max())
    assert scale > 1e-3
    assert float(np.abs(audio - wav).max()) / scale <= AUDIO_TOLERANCE


def test_image_audio_and_text_reach_the_thinker(engine, reference) -> None:
    rng = np.random.default_rng(0)
    prompt = {"prompt": "What is in this image?",
              "multi_modal_data": {"image": rng.integers(0, 255, (60, 80, 3), dtype=np.uint8),
                                   "audio": (rng.standard_normal(8000) * 0.1).astype(np.float32)}}
    outputs = engine.run(collect(engine.engine, prompt, sampling_params=_params(), output_modalities=["text"]))
    details = next(o.details for o in outputs if o.details)
    shapes = details["inputs"]
    assert shapes["pixel_values"][1] == 3 * 2 * 14 * 14 and shapes["image_grid_thw"] == [1, 3]
    assert shapes["input_features"][:2] == [1, 128] and shapes["feature_attention_mask"][0] == 1
    assert outputs[-1].finished


def test_video_frames_go_through_the_image_processor(reference) -> None:
    _, _, _, processor = reference
    video = np.random.default_rng(1).integers(0, 255, (3, 56, 56, 3), dtype=np.uint8)
    out = processor(text=["<|vision_bos|><|VIDEO|><|vision_eos|>"], videos=[video], return_tensors="pt")
    assert out["video_grid_thw"].tolist() == [[2, 4, 4]]  # 3 frames padded to 4, 2 per temporal patch
    assert out["pixel_values_videos"].shape == (32, 3 * 2 * 14 * 14)
    assert int((out["input_ids"] == processor.video_token_id).sum()) == 2 * 4 * 4 // 4


def test_chunked_token2wav_matches_a_whole_decode(reference) -> None:
    from omnipipe.models.qwen2_5_omni.modeling.token2wav_stream import token2wav_seam_rows

    _, _, model, _ = reference
    speaker = model.speaker_map["Chelsie"]
    codes = torch.randint(0, 96, (1, 48), generator=torch.Generator().manual_seed(2))
    rows = token2wav_seam_rows(model.token2wav, codes, speaker["cond"].float(), speaker["ref_mel"].float(), seed=1,
                               settings=(("no context", 12, 0, 0), ("left + right context", 12, 24, 12)))
    assert all(r["samples_missing"] == 0 for r in rows)
    assert rows[0]["rel_error"] > 10 * STREAM_BOUND  # without context the seams show
    assert rows[1]["rel_error"] <= STREAM_BOUND


def test_abort_mid_stream(engine) -> None:
    async def run() -> list:
        outputs = []
        async for out in engine.engine.generate(PROMPT, request_id="to-abort", sampling_params={
                "thinker": SamplingParams(temperature=0.0, max_tokens=64), "talker": TALKER}):
            outputs.append(out)
            if out.modality == "text" and not out.finished:
                await engine.engine.abort("to-abort")
        return outputs

    outputs = engine.run(asyncio.wait_for(run(), 60))
    assert outputs[-1].finished and outputs[-1].finish_reason == "abort"
