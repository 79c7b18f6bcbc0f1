"""Qwen2.5-Omni stage by stage through the engine, on a tiny random checkpoint, against transformers' own
``generate``: the same text (greedy), the same waveform (fixed noise) within AUDIO_TOLERANCE of its absmax, with
async chunk on and off (one engine each, shared by the module); image + audio + video (frames and an MP4 file,
sampled at the thinker's video_fps) + text equal the thinker's generate, through the engine and through the OpenAI
server; a realtime turn's live camera frames reach the thinker as one video beside the audio; stop strings and
penalties; a chunked token2wav stays near a whole decode; the tiny-checkpoint CLI; an abort mid-stream leaves
nothing held and a killed talker recovers (last: the engines go on with a restarted talker)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import openai
import pytest
import torch

from omnipipe import SamplingParams
from tests.conftest import EngineHarness, collect, state_is_idle, wait_until_idle
from tests.models.media_files import mp4, png, wav
from tests.models.server_voices import check_server_voices
from tests.server.conftest import API_KEY, running_server

pytestmark = pytest.mark.slow  # tiny Qwen2.5-Omni checkpoints written and served stage by stage

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
# the thinker's video sampling (not its defaults, 2.0 and 64, so that the tests see the options honoured)
VIDEO_FPS = 3.0
VIDEO_MAX_FRAMES = 5


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
                                        talker_eos_token_id=[model.talker.codec_pad_token,
                                                             model.talker.codec_eos_token],
                                        speaker="Chelsie")
    ids = sequences[0, inputs["input_ids"].shape[1]:].tolist()
    return processor.tokenizer.decode(ids, skip_special_tokens=True), wav.numpy(), model, processor


def _deploy(checkpoint, async_chunk: bool) -> dict:
    stages = {name: {"options": {"model": str(checkpoint)}} for name in ("thinker", "talker", "token2wav")}
    stages["thinker"]["options"].update(video_fps=VIDEO_FPS, video_max_frames=VIDEO_MAX_FRAMES)
    return {"async_chunk": async_chunk, "stages": stages}


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


def _media() -> dict:
    """An image, a 1 s tone, a video as 7 frames and a 2 s video file (8 frames at 4 fps) as MP4 bytes."""
    rng = np.random.default_rng(3)
    gradient = np.linspace(0, 255, 8, dtype=np.uint8)[:, None, None, None]
    return {"image": rng.integers(0, 255, (40, 56, 3), dtype=np.uint8),
            "audio": (0.2 * np.sin(np.arange(16000) / 16000 * 2 * np.pi * 330)).astype(np.float32),
            "frames": rng.integers(0, 255, (7, 32, 32, 3), dtype=np.uint8),
            "mp4": mp4(np.broadcast_to(gradient, (8, 32, 32, 3)).copy(), fps=4)}


def _thinker_answer(reference, question: str, images: list, audios: list, videos: list) -> tuple[str, dict]:
    """The thinker's own generate on the processed inputs (videos as the frames the stage is to keep): (text, the
    processor's tensors)."""
    from omnipipe.models.qwen2_5_omni.processors import chat_messages

    _, _, model, processor = reference
    data = {"text": question, "images": images, "audios": audios, "videos": videos}
    text = processor.apply_chat_template(chat_messages(data), add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=images or None, audio=audios or None, videos=videos or None, fps=VIDEO_FPS,
                       return_tensors="pt")
    with torch.no_grad():
        sequences = model.thinker.generate(**inputs, max_new_tokens=MAX_TEXT_TOKENS, do_sample=False,
                                           use_audio_in_video=False)
    length = inputs["input_ids"].shape[1]
    return processor.tokenizer.decode(sequences[0, length:], skip_special_tokens=True), inputs


def test_image_audio_video_and_text_equal_the_thinkers_generate(engine, reference) -> None:
    """A video as frames and one as an MP4 file, beside an image, audio and text: the reply is the thinker's own
    for those inputs, the file sampled at the stage's video_fps and both cut to its video_max_frames."""
    from omnipipe.util.field_error import FieldError
    from omnipipe.util.media import load_video

    media, question = _media(), "what do you see and hear"
    from_file = load_video(media["mp4"], "video", fps=VIDEO_FPS, max_frames=VIDEO_MAX_FRAMES)
    assert len(from_file) == VIDEO_MAX_FRAMES  # 6 instants in 2 s at 3 fps, cut to 5
    frames = media["frames"][[0, 2, 3, 4, 6]]  # 7 frames cut to 5, spread evenly
    want, inputs = _thinker_answer(reference, question, [media["image"]], [media["audio"]], [frames, from_file])
    assert inputs["video_grid_thw"][:, 0].tolist() == [3, 3]  # 5 frames, 2 per temporal patch
    assert torch.allclose(inputs["video_second_per_grid"], torch.tensor(2 / VIDEO_FPS))
    prompt = {"prompt": question, "multi_modal_data": {"image": media["image"], "audio": media["audio"],
                                                       "video": [media["frames"], media["mp4"]]}}
    outputs = engine.run(collect(engine.engine, prompt, sampling_params=_params(), output_modalities=["text"]))
    shapes = next(o.details for o in outputs if o.details)["inputs"]
    assert shapes["input_ids"] == list(inputs["input_ids"].shape) and shapes["video_grid_thw"] == [2, 3]
    assert want and outputs[-1].finished and outputs[-1].text == want
    with pytest.raises(FieldError) as caught:  # a file the thinker cannot decode: the caller's, in its field
        engine.run(collect(engine.engine, {**prompt, "multi_modal_data": {"video": [media["frames"], b"no video"]}},
                           sampling_params=_params(), output_modalities=["text"]))
    assert caught.value.field == "prompt.multi_modal_data.video[1]"


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    """One OpenAI-compatible server on the checkpoint (async chunk on), shared by the module's server tests."""
    with running_server("qwen2_5_omni", _deploy(checkpoint, True), tmp_path_factory.mktemp("server"), 300) as served:
        yield served


def test_image_audio_video_and_text_through_the_openai_server(server, reference) -> None:
    """image_url, input_audio, video_url (an MP4 data URL) and text parts with the real client: the reply is the
    thinker's own for those inputs."""
    from omnipipe.util.media import load_audio, load_image, load_video

    media, question = _media(), "describe what you see and hear"
    image, sound, video = png(media["image"]), wav(media["audio"]), media["mp4"]
    want, _ = _thinker_answer(reference, question, [np.asarray(load_image(image, "image"))],
                              [load_audio(sound, "audio")],
                              [load_video(video, "video", fps=VIDEO_FPS, max_frames=VIDEO_MAX_FRAMES)])
    content = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(image).decode()}},
               {"type": "input_audio", "input_audio": {"data": base64.b64encode(sound).decode(), "format": "wav"}},
               {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(video).decode()}},
               {"type": "text", "text": question}]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    reply = client.chat.completions.create(model="qwen2_5_omni", max_tokens=MAX_TEXT_TOKENS, temperature=0,
                                           messages=[{"role": "user", "content": content}])
    # the checkpoint's voices (spk_dict.pt; Chelsie is the talker's default); the vocoder's noise seeded
    check_server_voices(server.url, "qwen2_5_omni", ["Chelsie", "Ethan"], "Chelsie", "Ethan",
                        {"talker": {"temperature": 0, "max_tokens": MAX_CODES}, "token2wav": {"seed": SEED}})
    assert want and reply.choices[0].message.content == want


def _camera_frames(count: int) -> tuple[list[str], np.ndarray]:
    """``count`` camera frames as JPEG data URLs (what a browser sends) and as the pixels PIL decodes from them."""
    import io

    from PIL import Image

    urls, pixels = [], []
    for frame in np.random.default_rng(4).integers(0, 255, (count, 36, 44, 3), dtype=np.uint8):
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, "JPEG", quality=90)
        urls.append("data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode())
        pixels.append(np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")))
    return urls, np.stack(pixels)


def _streamed_turns(server) -> float:
    """The server's count of realtime turns whose audio streamed into the pipeline while it was spoken."""
    import httpx

    metrics = httpx.get(f"{server.url}/metrics", headers=server.headers, timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("omnipipe:realtime_streamed_turns_total{"))


def test_a_realtime_turn_gives_the_thinker_its_camera_frames_as_video(server, reference, checkpoint) -> None:
    """Live camera frames beside a spoken turn (``input_video_frame.append``): the thinker gets the turn's frames
    (the newest video_max_frames, taken at its video_fps) as one video with the audio, exactly as its own processor
    builds them, and answers as its own generate does; the user item lists the frames it took. The audio streamed
    into the thinker as it was appended (the turn's prompt names the stream, not the clip)."""
    from websockets.sync.client import connect

    from omnipipe.models.qwen2_5_omni.pipeline import PIPELINE
    from omnipipe.models.qwen2_5_omni.processors import omni_prompt
    from omnipipe.models.qwen2_5_omni.thinker_inputs import ThinkerInputs
    from omnipipe.server.routes.realtime.frames import Frame, frames_media
    from omnipipe.util.media import load_audio

    urls, pixels = _camera_frames(7)
    times = [1000.0 + 300 * i for i in range(7)]  # 300 ms apart: every one kept at 3 fps; the newest 5
    pcm = (0.2 * np.sin(np.arange(24_000) / 24_000 * 2 * np.pi * 330) * 32767).astype("<i2")
    heard = load_audio((pcm.astype(np.float32) / 32768.0, 24_000), "audio", 16_000)
    want, inputs = _thinker_answer(reference, "", [], [heard], [pixels[2:]])
    assert want != _thinker_answer(reference, "", [], [heard], [pixels[:5]])[0]  # the answer tells the frames apart

    # what the realtime route hands the prompt processor, processed as the thinker does: the processor's own tensors
    frames = [Frame(url, at, (44, 36)) for url, at in zip(urls[2:], times[2:], strict=True)]
    media = frames_media(PIPELINE, None, frames)
    prompt = {"prompt": "", "history": [], "multi_modal_data": {"audio": (pcm.astype(np.float32) / 32768.0, 24_000),
                                                                 **media}}
    processed = ThinkerInputs(checkpoint, VIDEO_FPS, VIDEO_MAX_FRAMES)(omni_prompt(prompt).data)
    for key in ("input_ids", "pixel_values_videos", "video_grid_thw", "input_features"):
        assert torch.equal(processed[key], inputs[key]), key

    streamed = _streamed_turns(server)
    headers = {**server.headers, "OpenAI-Beta": "realtime=v1"}
    with connect(server.url.replace("http", "ws") + "/v1/realtime", additional_headers=headers, max_size=None,
                 open_timeout=60) as ws:
        def send(type_: str, **fields) -> None:
            ws.send(json.dumps({"type": type_, **fields}))

        def until(type_: str) -> tuple[list[dict], dict]:
            seen = []
            while True:
                event = json.loads(ws.recv(timeout=120))
                assert event["type"] != "error", event
                if event["type"] == type_:
                    return seen, event
                seen.append(event)

        send("session.update", session={"turn_detection": None, "modalities": ["text"], "temperature": 0,
                                        "max_response_output_tokens": MAX_TEXT_TOKENS})
        until("session.updated")
        for i, (url, at) in enumerate(zip(urls, times, strict=True)):
            send("input_video_frame.append", image=url, captured_at_ms=at)
            send("input_audio_buffer.append", audio=base64.b64encode(pcm[i * 3000:(i + 1) * 3000].tobytes()).decode())
        send("input_audio_buffer.append", audio=base64.b64encode(pcm[21_000:].tobytes()).decode())
        send("input_audio_buffer.commit")
        _, created = until("conversation.item.created")
        assert [p.get("captured_at_ms") for p in created["item"]["content"] if p["type"] == "input_image"] == \
            times[2:]
        send("response.create")
        events, done = until("response.done")
    assert done["response"]["status"] == "completed", done
    said = "".join(e["delta"] for e in events if e["type"] == "response.text.delta")
    assert want and said == want
    assert _streamed_turns(server) == streamed + 1


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


# ---------------------------------------------------------------- sampling params
@pytest.fixture(scope="module")
def thinker(checkpoint):
    """The thinker stage's runner, loaded outside an engine."""
    from omnipipe.models.qwen2_5_omni.runners.thinker import Qwen25ThinkerRunner
    from omnipipe.stage.runner import RunnerContext

    runner = Qwen25ThinkerRunner(RunnerContext("thinker", "cpu", 1, 1, {"model": str(checkpoint)}))
    runner.load()
    return runner


def _run_thinker(runner, params: dict, item: dict | None = None) -> tuple[list[str], list[int], str | None]:
    """One request through the runner: (text deltas, generated tokens, finish reason)."""
    from omnipipe.stage.request import StageRequest

    request = StageRequest("r", params, emit_final=True, emit_data=True, chunk_targets=[])
    request.inputs.append(item or {"text": PROMPT, "history": [], "images": [], "audios": [], "videos": []})
    deltas = []
    while True:
        (out,) = runner.execute([request])
        deltas.append(out.text_delta)
        if out.finished:
            generated = list(request.runner_state.generated)
            runner.free(request)  # as the stage does: its KV blocks go back
            return deltas, generated, out.finish_reason


def test_thinker_stops_before_a_stop_string(thinker, reference) -> None:
    text = reference[0]
    deltas, _, reason = _run_thinker(thinker, {"temperature": 0.0, "max_tokens": MAX_TEXT_TOKENS})
    assert "".join(deltas) == text and reason == "length"
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop.strip()
    deltas, tokens, reason = _run_thinker(thinker, {"temperature": 0.0, "max_tokens": MAX_TEXT_TOKENS,
                                                    "stop": ["never in it", stop]})
    assert "".join(deltas) == text[:text.index(stop)] and reason == "stop"
    assert len(tokens) < MAX_TEXT_TOKENS or text.index(stop) + len(stop) == len(text)


class _Penalties:
    """Presence and frequency penalties over the tokens after the prompt, as a transformers logits processor."""

    def __init__(self, prompt_length: int, presence: float, frequency: float) -> None:
        self.prompt_length, self.presence, self.frequency = prompt_length, presence, frequency

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        for token in input_ids[0, self.prompt_length:].tolist():
            scores[0, token] -= self.frequency
        for token in set(input_ids[0, self.prompt_length:].tolist()):
            scores[0, token] -= self.presence
        return scores


def test_thinker_penalties_equal_generate_with_them(thinker, reference) -> None:
    from transformers.generation.logits_process import LogitsProcessorList

    from omnipipe.models.qwen2_5_omni.processors import chat_messages

    _, _, model, processor = reference
    item = {"text": PROMPT, "history": [], "images": [], "audios": [], "videos": []}
    text = processor.apply_chat_template(chat_messages(item), add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], return_tensors="pt")
    length = inputs["input_ids"].shape[1]
    tokens = 16
    plain = _run_thinker(thinker, {"temperature": 0.0, "max_tokens": tokens}, dict(item))[1]
    params = {"temperature": 0.0, "max_tokens": tokens, "presence_penalty": 1.5, "frequency_penalty": 0.7,
              "repetition_penalty": 1.3}
    _, got, _ = _run_thinker(thinker, params, dict(item))
    with torch.no_grad():
        want = model.thinker.generate(**inputs, max_new_tokens=tokens, do_sample=False, repetition_penalty=1.3,
                                      logits_processor=LogitsProcessorList([_Penalties(length, 1.5, 0.7)]))
    assert got == want[0, length:].tolist()
    assert got != plain  # the penalties changed the reply


def test_stage_params_that_do_not_apply_are_refused(engine) -> None:
    from omnipipe.util.field_error import FieldError

    for stage, params, field in (("talker", SamplingParams(stop=["x"]), "sampling_params.stop"),
                                 ("token2wav", SamplingParams(temperature=0.7), "sampling_params.temperature")):
        with pytest.raises(FieldError) as caught:
            engine.run(collect(engine.engine, PROMPT, sampling_params={**_params(), stage: params}))
        assert caught.value.field == field


def test_random_weights_write_json_of_the_schema_with_its_logprobs(engine) -> None:
    """The random thinker writes noise; under a response_format its text is JSON of the schema (the grammar
    makes it), with one logprob entry per token of it."""
    import jsonschema

    schema = {"type": "object", "properties": {"word": {"type": "string", "maxLength": 6},
                                               "kind": {"enum": ["a", "b"]},
                                               "n": {"type": "array", "items": {"type": "integer"}, "maxItems": 2}},
              "required": ["word", "kind", "n"], "additionalProperties": False}
    thinker = SamplingParams(temperature=0.9, seed=3, max_tokens=80, logprobs=2,
                             response_format={"type": "json_schema", "schema": schema})
    outs = engine.run(collect(engine.engine, PROMPT, sampling_params={**_params(), "thinker": thinker},
                              output_modalities=["text"]))
    final = outs[-1]
    assert final.finish_reason == "stop", final.text
    jsonschema.validate(json.loads(final.text), schema)
    entries = [e for out in outs if out.modality == "text" and out.details for e in out.details.get("logprobs", [])]
    # a token may hold part of a character: its bytes, joined, are the text
    assert bytes(b for e in entries for b in e["bytes"]).decode() == final.text
    assert all(len(e["top_logprobs"]) == 2 for e in entries)


def test_tiny_checkpoint_cli_and_generate(tmp_path) -> None:
    """``omnipipe tiny-checkpoint qwen2_5_omni DIR`` writes a checkpoint that ``omnipipe generate`` answers with."""
    import soundfile

    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    made = subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "tiny-checkpoint", "qwen2_5_omni",
                           str(tmp_path / "ckpt")], capture_output=True, text=True, env=env, timeout=300)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "ckpt" / "config.json").is_file() and (tmp_path / "ckpt" / "spk_dict.pt").is_file()
    # the talker samples (the model's own decoding): now and then it ends before its first code, so up to 3 tries
    for _ in range(3):
        out = subprocess.run([sys.executable, "-m", "omnipipe.cli.main", "generate", "--pipeline", "qwen2_5_omni",
                              "--model", str(tmp_path / "ckpt"), "--max-tokens", "6", "-o", str(tmp_path / "a.wav"),
                              "hello"], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "not writable" not in out.stderr  # the stages copy the read-only arrays they receive
        if (tmp_path / "a.wav").exists():
            break
        assert "no audio was produced (the answer had none)" in out.stderr, out.stderr[-3000:]
    audio, rate = soundfile.read(tmp_path / "a.wav")
    assert rate == 24000 and len(audio) > 0 and np.abs(audio).max() > 0


def test_abort_mid_stream_and_a_killed_talker_recovers(engine, reference) -> None:
    """Last of the module: the shared engines go on with a restarted talker. An abort mid-stream leaves nothing
    held; once the talker's process is killed, the next request is answered as before by its restarted stage."""
    text, wav, _, _ = reference

    async def run() -> tuple[list, dict, list, dict, int]:
        aborted = []
        async for out in engine.engine.generate(PROMPT, request_id="to-abort", sampling_params={
                "thinker": SamplingParams(temperature=0.0, max_tokens=64), "talker": TALKER}):
            aborted.append(out)
            if out.modality == "text" and not out.finished:
                await engine.engine.abort("to-abort")
        after_abort = await wait_until_idle(engine.engine)
        killed = (await engine.engine.debug_state())["pids"]["talker"]
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while True:  # requests fail until the talker is back
            try:
                outputs = await collect(engine.engine, PROMPT, sampling_params=_params(), edge_options=SMALL_CHUNKS)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1)
        return aborted, after_abort, outputs, await wait_until_idle(engine.engine), killed

    aborted, after_abort, outputs, after, killed = engine.run(run(), timeout_s=240)
    assert after["pids"]["talker"] != killed  # a new talker process answered
    assert aborted[-1].finished and aborted[-1].finish_reason == "abort"
    for state in (after_abort, after):
        assert state_is_idle(state), state
        for stage in ("thinker", "talker", "token2wav"):
            assert not state["stages"][stage].get("requests"), state["stages"][stage]
    final = outputs[-1]
    assert final.finished and final.text == text
    assert final.audio is not None and len(final.audio) == len(wav)
    assert float(np.abs(final.audio - wav).max()) <= AUDIO_TOLERANCE * float(np.abs(wav).max())
