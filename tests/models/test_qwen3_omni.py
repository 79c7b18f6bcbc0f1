"""The qwen3_omni pipeline on a tiny random checkpoint (written by the test, offline), stage by stage through the real
engine (stage processes, relays, async chunk on and off) against the model's own ``generate``: text exactly, audio
within 1e-5 of its absmax; image + audio + video + text through the OpenAI server with the real client; abort
mid-stream; a killed talker recovers."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch

from omnipipe import AsyncOmni, SamplingParams
from omnipipe.models.qwen3_omni.weights.tiny import write_tiny_checkpoint
from tests.models import media_files
from tests.models.server_voices import check_server_voices
from tests.server.conftest import API_KEY, running_server

pytestmark = pytest.mark.slow  # tiny Qwen3-Omni checkpoints written and served stage by stage

STAGES = ("thinker", "talker", "code2wav")
THINKER_TOKENS = 14
TALKER_FRAMES = 40
EXACT_CONTEXT = 152  # the tiny code2wav's exact left context (2 layers x 71 + the convolutions' 10)
AUDIO_BOUND = 1e-5  # of the reference's absmax


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen3-omni") / "ckpt", seed=0)


def deploy(checkpoint: Path, async_chunk: bool) -> dict[str, Any]:
    return {"async_chunk": async_chunk,
            "edges": {"talker->code2wav": {"options": {"left_context_frames": EXACT_CONTEXT, "codec_chunk_frames": 7,
                                                       "initial_codec_chunk_frames": 3}}},
            "stages": {s: {"threads": 1, "options": {"model": str(checkpoint)}} for s in STAGES}}


def params() -> dict[str, SamplingParams]:
    # the model's greedy talker keeps its repetition penalty (1.05), as generate(talker_do_sample=False) does
    return {"thinker": SamplingParams(max_tokens=THINKER_TOKENS),
            "talker": SamplingParams(temperature=0, max_tokens=TALKER_FRAMES, repetition_penalty=1.05)}


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> dict[str, tuple[str, np.ndarray]]:
    """The model's own generate, greedy, for each prompt the tests send."""
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    out = {}
    for text in ("hello world", "describe the sound you hear"):
        ids = tokenizer(chat(text), return_tensors="pt")
        with torch.inference_mode():
            sequences, wav = model.generate(**ids, thinker_max_new_tokens=THINKER_TOKENS,
                                            talker_max_new_tokens=TALKER_FRAMES, thinker_do_sample=False,
                                            talker_do_sample=False,
                                            thinker_eos_token_id=[tokenizer.convert_tokens_to_ids("<|im_end|>")])
        answer = tokenizer.decode(sequences[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        out[text] = (answer, wav.reshape(-1).float().numpy())
    return out


async def answer(engine: AsyncOmni, prompt: Any, **kwargs: Any) -> tuple[str, np.ndarray, int]:
    return await answer_with(engine, prompt, params(), **kwargs)


async def answer_with(engine: AsyncOmni, prompt: Any, sampling: dict[str, SamplingParams],
                      **kwargs: Any) -> tuple[str, np.ndarray, int]:
    text, audio = "", []
    async for out in engine.generate(prompt, sampling_params=sampling, output_modalities=["text", "audio"],
                                     **kwargs):
        if out.modality == "text":
            text += out.text_delta
        elif out.modality == "audio":
            audio.append(out.audio)
    return text, (np.concatenate(audio) if audio else np.zeros(0, np.float32)), len(audio)


@pytest.mark.parametrize("async_chunk", [True, False], ids=["async-chunk", "whole"])
def test_stage_by_stage_equals_the_models_generate(checkpoint: Path, reference: dict, async_chunk: bool) -> None:
    async def run() -> list[tuple[str, np.ndarray, int]]:
        async with AsyncOmni("qwen3_omni", deploy(checkpoint, async_chunk)) as engine:
            # two at once: each request keeps its own caches and rope positions
            return await asyncio.gather(*(answer(engine, text) for text in reference))

    for (text, audio, pieces), (want_text, want_audio) in zip(asyncio.run(run()), reference.values(), strict=True):
        assert text == want_text
        assert audio.shape == want_audio.shape
        assert np.abs(audio - want_audio).max() <= AUDIO_BOUND * np.abs(want_audio).max()
        assert pieces >= (3 if async_chunk else 1)  # streamed in windows, or whole


async def nothing_held(engine: AsyncOmni) -> dict[str, Any]:
    """Wait (up to 30 s) until no stage holds a request or a relay slot; return the last state seen."""
    deadline = time.monotonic() + 30
    while True:
        state = await engine.debug_state()
        stages = state["stages"]
        held = state["orchestrator_requests"] or state["orchestrator_relay_slots"] or any(
            s["requests"] or s["relay_slots"] or s["pending_chunks"] for s in stages.values())
        if (set(stages) == set(STAGES) and not held) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.2)


def test_abort_at_every_stage_and_a_killed_talker_recovers(checkpoint: Path, reference: dict) -> None:
    async def cut(engine: AsyncOmni, request_id: str, at: str) -> None:
        """Leave the stream at its first ``at`` event: "text" while the thinker writes (a long answer asked for),
        "audio" while the talker and code2wav stream."""
        long = {**params(), "thinker": SamplingParams(max_tokens=400)}
        stream = engine.generate("hello world", request_id=request_id, sampling_params=long,
                                 output_modalities=["text", "audio"])
        async for out in stream:
            if out.modality == at:
                break
        await stream.aclose()
        await engine.abort(request_id)

    async def run() -> None:
        async with AsyncOmni("qwen3_omni", deploy(checkpoint, True)) as engine:
            for at in ("text", "audio"):
                await cut(engine, f"cut-{at}", at)
                state = await nothing_held(engine)
                assert set(state["stages"]) == set(STAGES)
                assert not state["orchestrator_requests"] and not state["orchestrator_relay_slots"], state
                for stage in STAGES:
                    held = state["stages"][stage]
                    assert not held["requests"] and not held["relay_slots"], (at, stage, held)
            talker = (await engine.debug_state())["pids"]["talker"]
            os.kill(talker, signal.SIGKILL)
            deadline = time.monotonic() + 120
            while True:  # the talker is restarted; the next request is answered as before
                try:
                    text, audio, _ = await answer(engine, "hello world")
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(1)
            state = await engine.debug_state()
            assert state["restarts"]["talker"] >= 1 and state["pids"]["talker"] != talker
            want_text, want_audio = reference["hello world"]
            assert text == want_text
            assert np.abs(audio - want_audio).max() <= AUDIO_BOUND * np.abs(want_audio).max()

    asyncio.run(run())


def test_image_audio_video_and_text_through_the_openai_server(checkpoint: Path, tmp_path: Path) -> None:
    """The parts reach the thinker (their processed shapes) and the answer is the model's own for those inputs."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from omnipipe.models.qwen3_omni.thinker_inputs import ThinkerInputBuilder
    from omnipipe.models.qwen3_omni.weights.load import load_config
    from omnipipe.util.media import load_audio, load_image, load_video

    rng = np.random.default_rng(1)
    png = media_files.png(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8))
    wav = media_files.wav((0.2 * np.sin(np.arange(16000) / 16000 * 2 * np.pi * 330)).astype(np.float32))
    mp4 = media_files.mp4(np.repeat(np.linspace(0, 255, 8, dtype=np.uint8)[:, None, None, None], 32, 1).repeat(32, 2)
               .repeat(3, 3), fps=4)
    question = "what do you see and hear"
    content = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}},
               {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}},
               {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(mp4).decode()}},
               {"type": "text", "text": question}]

    builder = ThinkerInputBuilder(checkpoint, load_config(checkpoint))
    frames = load_video(mp4, "video", fps=2.0, max_frames=64)
    inputs = builder({"text": question, "images": [np.asarray(load_image(png, "image"))],
                      "audios": [load_audio(wav, "audio")], "videos": [frames], "video_fps": 2.0})
    assert inputs["pixel_values"].shape[0] == int(inputs["image_grid_thw"].prod())
    assert inputs["pixel_values_videos"].shape[0] == int(inputs["video_grid_thw"].prod())
    assert int(inputs["video_grid_thw"][0, 0]) == (len(frames) + 1) // 2
    assert inputs["input_features"].shape[1] == 128 and int(inputs["feature_attention_mask"].sum()) == 100
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True).eval()
    with torch.inference_mode():
        sequences = model.thinker.generate(**inputs, max_new_tokens=THINKER_TOKENS, do_sample=False,
                                           eos_token_id=[builder.tokenizer.convert_tokens_to_ids("<|im_end|>")])
    want = builder.tokenizer.decode(sequences[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)

    with running_server("qwen3_omni", deploy(checkpoint, True), tmp_path, 300) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
        reply = client.chat.completions.create(model="qwen3_omni", max_tokens=THINKER_TOKENS, temperature=0,
                                               messages=[{"role": "user", "content": content}])
        assert reply.choices[0].message.content == want
        with pytest.raises(openai.BadRequestError) as caught:  # the server fetches nothing
            client.chat.completions.create(model="qwen3_omni", messages=[{"role": "user", "content": [
                {"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}}]}])
        assert caught.value.body["param"] == "messages[0].content[0].video_url.url"
        # the checkpoint's voices (the stage option's, ethan, is the default)
        check_server_voices(server.url, "qwen3_omni", ["chelsie", "ethan"], "ethan", "chelsie",
                            {"talker": {"temperature": 0, "max_tokens": 20}})


def test_tiny_checkpoint_cli_and_generate_with_every_input(tmp_path: Path) -> None:
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    cli = [sys.executable, "-m", "omnipipe.cli.main"]
    made = subprocess.run([*cli, "tiny-checkpoint", "qwen3_omni", str(tmp_path / "ckpt")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "ckpt" / "config.json").is_file()
    again = subprocess.run([*cli, "tiny-checkpoint", "qwen3_omni", str(tmp_path / "ckpt")], capture_output=True,
                           text=True, env=env, timeout=300)
    assert again.returncode == 2 and "is not empty" in again.stderr and "--force" in again.stderr
    rng = np.random.default_rng(2)
    (tmp_path / "q.wav").write_bytes(media_files.wav((0.2 * rng.standard_normal(8000)).astype(np.float32)))
    (tmp_path / "p.png").write_bytes(media_files.png(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)))
    (tmp_path / "v.mp4").write_bytes(media_files.mp4(rng.integers(0, 255, (6, 32, 32, 3), dtype=np.uint8), fps=3))
    # the talker samples (the model's own decoding): now and then it ends before its first frame, so up to 3 tries
    for _ in range(3):
        out = subprocess.run([*cli, "generate", "--pipeline", "qwen3_omni", "--model", str(tmp_path / "ckpt"),
                              "--max-tokens", "6", "-o", str(tmp_path / "a.wav"), "--audio-in", str(tmp_path / "q.wav"),
                              "--image", str(tmp_path / "p.png"), "--video", str(tmp_path / "v.mp4"), "what is this"],
                             capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        if (tmp_path / "a.wav").exists():
            break
        assert "no audio was produced (the answer had none)" in out.stderr, out.stderr[-3000:]
    import soundfile

    audio, rate = soundfile.read(tmp_path / "a.wav")
    assert rate == 24000 and len(audio) >= 1920  # at least one codec frame
    assert np.abs(audio).max() > 0


def test_bad_options_and_params_are_refused_naming_the_field(checkpoint: Path) -> None:
    from omnipipe.engine.startup import EngineStartError

    bad = deploy(checkpoint, True)
    bad["stages"]["talker"]["options"]["max_new_token"] = 10
    with pytest.raises(EngineStartError, match=r"stages\.talker\.options\.max_new_token: unknown option"):
        asyncio.run(AsyncOmni("qwen3_omni", bad).start())

    async def run() -> None:
        async with AsyncOmni("qwen3_omni", deploy(checkpoint, True)) as engine:
            for stage, sampling, field in (("talker", SamplingParams(stop=["x"]), "sampling_params.stop"),
                                           ("code2wav", SamplingParams(), "sampling_params")):
                with pytest.raises(ValueError) as caught:
                    async for _ in engine.generate("hello", sampling_params={**params(), stage: sampling},
                                                   output_modalities=["text", "audio"]):
                        pass
                assert getattr(caught.value, "field", None) == field, caught.value
            # the thinker's first token ends it: nothing to speak, the request still ends cleanly
            text, audio, _ = await answer_with(engine, "hello world", {"thinker": SamplingParams(max_tokens=1)})
            assert len(audio) == 0
            # a seeded sampled talker speaks the same twice, even side by side
            sampled = {"thinker": SamplingParams(max_tokens=THINKER_TOKENS),
                       "talker": SamplingParams(temperature=0.9, top_k=50, seed=7, max_tokens=TALKER_FRAMES)}
            first, second = await asyncio.gather(answer_with(engine, "hello world", sampled),
                                                 answer_with(engine, "hello world", sampled))
            # the same codes; the vocoder may batch the two streams' windows (float rounding only)
            assert len(first[1]) > 0 and first[1].shape == second[1].shape
            assert np.abs(first[1] - second[1]).max() <= AUDIO_BOUND * np.abs(first[1]).max()

    asyncio.run(run())


def test_the_tiny_checkpoint_is_the_same_for_a_seed_and_finite(checkpoint: Path, tmp_path: Path) -> None:
    """Every tensor is drawn from the seed (transformers' init leaves the talker's MoE experts unset: the writer
    draws them), so a second write equals the first."""
    from safetensors import safe_open

    again = write_tiny_checkpoint(tmp_path / "again", seed=0)
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as first, \
            safe_open(str(again / "model.safetensors"), "pt") as second:
        assert set(first.keys()) == set(second.keys())
        for key in first.keys():  # noqa: SIM118 - a safetensors handle is no mapping: it has keys() only
            tensor = first.get_tensor(key)
            assert torch.isfinite(tensor.float()).all(), key
            assert torch.equal(tensor, second.get_tensor(key)), key


def test_the_thinker_stops_before_a_stop_string_and_never_shows_part_of_one(checkpoint: Path, reference: dict) -> None:
    """Greedy through the thinker's runner: with a stop string from the middle of the reference answer, the streamed
    text is exactly what comes before it, and no delta sent ever showed a piece of it (text that may begin a stop
    string waits until the next tokens settle it)."""
    from omnipipe.models.qwen3_omni.runners.thinker import Qwen3ThinkerRunner
    from omnipipe.stage.request import StageRequest
    from omnipipe.stage.runner import RunnerContext

    runner = Qwen3ThinkerRunner(RunnerContext("thinker", "cpu", 1, 1, {"model": str(checkpoint)}))
    runner.load()

    def run(params: dict[str, Any]) -> tuple[list[str], int, str | None]:
        request = StageRequest("r", params, emit_final=True, emit_data=True, chunk_targets=[])
        request.inputs.append({"text": "hello world"})
        deltas, units = [], 0
        while True:
            (out,) = runner.execute([request])
            deltas.append(out.text_delta)
            units += out.num_units
            if out.finished:
                runner.free(request)  # as the stage does: its KV blocks go back
                return deltas, units, out.finish_reason

    text = reference["hello world"][0]
    deltas, units, reason = run({"temperature": 0.0, "max_tokens": THINKER_TOKENS})
    assert "".join(deltas) == text and reason == "length" and units == THINKER_TOKENS
    checked = 0
    for start in range(1, len(text) - 3):
        stop = text[start:start + 3]
        if not stop.strip() or text.index(stop) != start:
            continue
        deltas, units, reason = run({"temperature": 0.0, "max_tokens": THINKER_TOKENS, "stop": ["never in it", stop]})
        assert "".join(deltas) == text[:start] and reason == "stop", (stop, deltas)
        assert 0 < units <= THINKER_TOKENS
        checked += 1
    assert checked >= 3


JSON_SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                      "size": {"enum": ["small", "large"]},
                                      "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
                                      "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                                "required": ["ok"], "additionalProperties": False}},
     "required": ["name", "size", "tags", "inner"], "additionalProperties": False},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"],
     "additionalProperties": False},
]


def test_random_weights_still_write_json_of_the_schema(checkpoint: Path) -> None:
    """The thinker of a random checkpoint writes noise; under a response_format it writes JSON that validates
    against the schema, two requests at once in one batch beside a free one: the grammar, not the model, makes it
    valid, request by request."""
    import json

    import jsonschema

    async def run() -> None:
        async with AsyncOmni("qwen3_omni", deploy(checkpoint, False)) as engine:
            async def answer(sampling: SamplingParams) -> tuple[str, str | None]:
                final = None
                async for out in engine.generate("hello world", sampling_params={"thinker": sampling},
                                                 output_modalities=["text"]):
                    final = out
                assert final is not None
                return final.text, final.finish_reason

            shaped = [SamplingParams(max_tokens=120, temperature=0.8, seed=i,
                                     response_format={"type": "json_schema", "schema": schema})
                      for i, schema in enumerate(JSON_SCHEMAS)]
            results = await asyncio.gather(*(answer(s) for s in shaped), answer(SamplingParams(max_tokens=20)))
            for (text, finish), schema in zip(results[:2], JSON_SCHEMAS, strict=True):
                assert finish == "stop", text
                jsonschema.validate(json.loads(text), schema)
            free_text = results[2][0]
            with pytest.raises(ValueError):  # the free request beside them is the model's noise, not JSON
                json.loads(free_text)
            with pytest.raises(ValueError) as caught:
                await answer(SamplingParams(response_format={"type": "json_schema", "schema": {"$ref": "#/nope"}}))
            assert getattr(caught.value, "field", None) == "sampling_params.response_format", caught.value

    asyncio.run(run())


WEATHER_TOOL = {"name": "get_weather", "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                               "required": ["city"], "additionalProperties": False}}


def test_the_chat_text_writes_tools_calls_and_results_as_qwen3s_template() -> None:
    from omnipipe.models.qwen3_omni.thinker_inputs import ThinkerInputBuilder
    from omnipipe.stage.structured_output import TOOLS_INTRO, TOOLS_OUTRO

    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
                   {"id": "c2", "name": "get_weather", "arguments": '{"city": "Rome"}'}]},
               {"role": "tool", "content": "18C", "tool_call_id": "c1"},
               {"role": "tool", "content": "21C", "tool_call_id": "c2"}]
    text = ThinkerInputBuilder.chat_text(None, {"text": "", "history": history, "tools": [WEATHER_TOOL]}, [])  # type: ignore[arg-type]
    tool = ('{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", '
            '"parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, '
            '"required": ["city"], "additionalProperties": false}}}')
    assert text == (
        f"<|im_start|>system\nBe brief.\n\n{TOOLS_INTRO}\n{tool}{TOOLS_OUTRO}<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\n21C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")


def test_random_weights_make_a_required_call_that_validates_and_is_not_spoken(checkpoint: Path) -> None:
    """tool_choice required on random weights: a call whose arguments validate (the grammar makes it), finish reason
    tool_calls, and no audio for it, while a free request beside it is spoken."""
    import json

    import jsonschema

    async def run() -> None:
        async with AsyncOmni("qwen3_omni", deploy(checkpoint, True)) as engine:
            async def answer(prompt: Any, sampling: SamplingParams) -> tuple[Any, list[Any], np.ndarray]:
                pieces: list[Any] = []
                final = None
                async for out in engine.generate(prompt, sampling_params={**params(), "thinker": sampling},
                                                 output_modalities=["text", "audio"]):
                    if out.modality == "text" and out.details:
                        pieces += out.details.get("tool_calls") or []
                    final = out
                assert final is not None
                return final, pieces, final.audio if final.audio is not None else np.zeros(0)

            required = SamplingParams(max_tokens=200, temperature=0.8, seed=1, tool_choice="required",
                                      parallel_tool_calls=False)
            (call, pieces, audio), (free, _, free_audio) = await asyncio.gather(
                answer({"prompt": "hello world", "tools": [WEATHER_TOOL]}, required),
                answer("hello world", SamplingParams(max_tokens=THINKER_TOKENS)))
            arguments = "".join(piece.get("arguments", "") for piece in pieces)
            assert call.finish_reason == "tool_calls", (call.text, arguments, call.finish_reason)
            assert call.text == ""
            assert pieces[0] == {"index": 0, "name": "get_weather"}
            arguments = "".join(piece.get("arguments", "") for piece in pieces if piece["index"] == 0)
            jsonschema.validate(json.loads(arguments), WEATHER_TOOL["parameters"])
            assert len(audio) == 0, "a turn of calls is not spoken"
            assert free.text and len(free_audio) > 0

    asyncio.run(run())
