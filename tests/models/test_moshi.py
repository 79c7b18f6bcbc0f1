"""Moshi's duplex stage on a tiny random checkpoint, in-process with the stage's own scheduler and step, and through
the engine: greedy float32 text tokens and Moshi frames equal ``MoshiForConditionalGeneration.generate`` in its
"prompt, then silence" mode; eight sessions joining at different steps (prompts, codes, clips, a seeded sampled one)
equal each stepped alone; a live stream appended to in uneven pieces, the session waiting for each frame, equals a
hand-written reference loop over the whole clip's codes (the loop ``generate`` runs, with the user's codes in place
of silence), and so does the clip given whole; through the engine a session fed live gives that loop's text and the
Mimi decode of its frames, one 80 ms frame of audio per 80 ms of input, audio coming while the user still speaks;
the 16 -> 24 kHz upsampler gives the same samples however its input is cut; bad input fails its session alone,
naming the field; ``--size released`` has hf-moshiko's parameter count."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnipipe.models.moshi.modeling.columns import Layout
from omnipipe.models.moshi.modeling.user_audio import Upsampler, upsample
from omnipipe.models.moshi.processors import prompt as moshi_prompt
from omnipipe.models.moshi.runners.duplex import MoshiDuplexRunner
from omnipipe.models.moshi.weights.tiny import CODEBOOK_SIZE, CODEBOOKS, write_tiny_checkpoint
from omnipipe.stage.runner import RunnerContext
from omnipipe.stage.runner_driver import Arrival, DriveResult, drive
from omnipipe.stage.streaming_audio import AUDIO_FIELD
from omnipipe.stage.text_stream import TextStream
from omnipipe.util.field_error import FieldError

FRAME_24K = 1920  # Mimi's frame at 24 kHz: 80 ms
FRAME_16K = 1280  # the same 80 ms as appended


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("moshi") / "ckpt", seed=0)


@pytest.fixture(scope="module")
def duplex(checkpoint: Path) -> MoshiDuplexRunner:
    runner = MoshiDuplexRunner(RunnerContext("duplex", "cpu", 1, 8, {"model": str(checkpoint)}))
    runner.load()
    return runner


@pytest.fixture(scope="module")
def model(checkpoint: Path) -> Any:
    from transformers import MoshiForConditionalGeneration

    return MoshiForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True).eval()


def speech(seconds: float, seed: int) -> np.ndarray:
    """A voiced-like 16 kHz clip: a wobbling tone over a little noise (the seed picks both)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    tone = 0.3 * np.sin(2 * np.pi * (140 + 30 * seed) * t + 2 * np.sin(2 * np.pi * 4 * t))
    return (tone + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def pieces(clip: np.ndarray, seed: int) -> list[np.ndarray]:
    """``clip`` cut into uneven pieces of 5 to 180 ms."""
    rng = np.random.default_rng(seed)
    cuts, at = [], 0
    while at < len(clip):
        size = int(rng.integers(80, 2880))
        cuts.append(clip[at:at + size])
        at += size
    return cuts


def tokens(result: DriveResult, rid: str) -> list[int]:
    assert not result.errors, result.errors
    return [o.data["token"] for o in result.outputs[rid] if o.data and "token" in o.data]


def frames(result: DriveResult, rid: str) -> np.ndarray:
    blocks = [o.data["frames"] for o in result.outputs[rid] if o.data and "frames" in o.data]
    return np.concatenate(blocks, axis=1) if blocks else np.zeros((CODEBOOKS, 0), np.int64)


# ------------------------------------------------------------------------------------------- the reference loop
def user_codes(model: Any, clip: np.ndarray) -> torch.Tensor:
    """The whole clip's user codes [K, N]: upsampled at once, padded to whole frames, one Mimi ``encode``."""
    samples = upsample(clip)
    count = -(-len(samples) // FRAME_24K)
    padded = np.pad(samples, (0, count * FRAME_24K - len(samples)))
    with torch.inference_mode():
        return model.audio_encoder.encode(torch.from_numpy(padded)[None, None], num_quantizers=CODEBOOKS).audio_codes[0]


@torch.inference_mode()
def reference(model: Any, user: torch.Tensor) -> tuple[list[int], np.ndarray]:
    """The loop transformers' ``generate`` runs (greedy), written out with its modules, with no prompt and the
    user's codes ``user`` [K, N] in place of its silence: N + 1 text tokens and N Moshi frames [K, N]."""
    config = model.config
    books, initial = config.num_codebooks, torch.full((config.num_codebooks,), config.audio_vocab_size)

    def embed(text: torch.Tensor, moshi: torch.Tensor, heard: torch.Tensor) -> torch.Tensor:
        codes = torch.cat([moshi, heard])
        audio = sum(model.embed_tokens[k](codes[k].view(1, 1)) for k in range(2 * books))
        return audio + model.decoder.model.embed_tokens(text.view(1, 1))

    def depth(hidden: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        codes, cache, step = [], None, text.view(1, 1)
        for _ in range(books):
            out = model.depth_decoder(input_ids=step, last_hidden_state=hidden, past_key_values=cache, use_cache=True)
            cache, step = out.past_key_values, out.logits[:, -1].argmax(-1).view(1, 1)
            codes.append(step[0, 0])
        return torch.stack(codes)

    out = model.decoder(inputs_embeds=embed(torch.tensor(config.vocab_size), initial, initial), use_cache=True)
    cache, hidden, text = out.past_key_values, out.last_hidden_state[:, -1:], [out.logits[0, -1].argmax()]
    made, previous, semantic = [], initial, None
    for index in range(user.shape[1]):
        moshi = depth(hidden, text[-1])
        if semantic is None:  # the unconditional frame's acoustic codes, as generate's delay mask keeps them
            moshi[1:] = config.audio_vocab_size
        else:
            made.append(torch.cat([semantic[None], moshi[1:]]))
        semantic = moshi[0]
        heard = torch.cat([user[:1, index], previous[1:]])  # the user's acoustic codes one frame late
        previous = user[:, index]
        out = model.decoder(inputs_embeds=embed(text[-1], moshi, heard), past_key_values=cache, use_cache=True)
        cache, hidden = out.past_key_values, out.last_hidden_state[:, -1:]
        text.append(out.logits[0, -1].argmax())
    made.append(torch.cat([semantic[None], depth(hidden, text[-1])[1:]]))  # the last frame's acoustic codes
    return [int(t) for t in text], torch.stack(made, dim=1).numpy()


def streamed_text(duplex: MoshiDuplexRunner, ids: list[int]) -> str:
    stream = TextStream(duplex._decode_ids)
    text = "".join(stream.push(t)[0] for t in ids if t not in duplex.silent_ids)
    return text + stream.finish()[0]


# ------------------------------------------------------------------------------------------------------ tests
def test_the_upsampler_gives_the_same_samples_however_its_input_is_cut() -> None:
    clip = speech(1.3, seed=3)
    whole = upsample(clip)
    assert len(whole) == (3 * len(clip) + 1) // 2
    upsampler = Upsampler()
    assert np.array_equal(np.concatenate([upsampler(part) for part in pieces(clip, seed=4)]), whole)
    t = np.arange(16000) / 16000  # a 1 kHz tone comes out a 1 kHz tone at 24 kHz, half a millisecond late
    tone = upsample(np.sin(2 * np.pi * 1000 * t).astype(np.float32))
    late = np.sin(2 * np.pi * 1000 * (np.arange(len(tone)) / 24000 - 23.5 / 48000))
    assert np.abs(tone[200:-200] - late[200:-200]).max() < 1e-3


def test_the_prompt_columns_delay_the_acoustic_codes_one_frame() -> None:
    layout = Layout(codebooks=3, initial_code=9, initial_text=50)
    text, moshi, user = torch.tensor([7, 8]), torch.tensor([[1, 2], [3, 4], [5, 6]]), torch.zeros(3, 2).long()
    text_columns, moshi_columns, user_columns = layout.prompt_columns(text, moshi, user)
    assert text_columns.tolist() == [50, 7, 8]
    assert moshi_columns.tolist() == [[9, 1, 2], [9, 9, 3], [9, 9, 5]]  # the semantic code on time, the rest late
    assert user_columns.tolist() == [[9, 0, 0], [9, 9, 0], [9, 9, 0]]


@pytest.mark.slow
@pytest.mark.parametrize(("prompt_frames", "new_tokens"), [(1, 6), (3, 12)])
def test_greedy_text_and_frames_equal_generate_after_a_prompt_then_silence(
        duplex: MoshiDuplexRunner, model: Any, prompt_frames: int, new_tokens: int) -> None:
    generator = torch.Generator().manual_seed(prompt_frames)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_frames), generator=generator)
    heard = torch.randint(0, CODEBOOK_SIZE, (1, CODEBOOKS, prompt_frames), generator=generator)
    said = torch.randint(0, CODEBOOK_SIZE, (1, CODEBOOKS, prompt_frames), generator=generator)
    with torch.inference_mode():
        want = model.generate(input_ids=ids, user_audio_codes=heard, moshi_audio_codes=said,
                              max_new_tokens=new_tokens, do_sample=False, depth_decoder_do_sample=False,
                              return_audio_codes=True)
    item = {"silence": True, "prompt": {"text": ids[0].numpy(), "moshi_codes": said[0].numpy(),
                                        "user_codes": heard[0].numpy()}}
    # generate's new tokens are the prefill's and one a step: new_tokens - 1 silent user frames
    result = drive(duplex, [Arrival("s", {"temperature": 0.0, "max_tokens": new_tokens - 1}, [item])])
    assert tokens(result, "s") == want.sequences[0, 1 + prompt_frames:].tolist()
    # generate's codes are the prompt's frames then the new ones (the last semantic code, of no whole frame, left out)
    assert np.array_equal(frames(result, "s"), want.audio_codes[0, :, prompt_frames:].numpy())
    assert frames(result, "s").shape[1] == new_tokens - 1
    assert result.outputs["s"][-1].finish_reason == "length"


@pytest.mark.slow
def test_eight_sessions_joining_at_different_steps_equal_each_stepped_alone(duplex: MoshiDuplexRunner) -> None:
    rng = np.random.default_rng(7)

    def codes(count: int) -> np.ndarray:
        return rng.integers(0, CODEBOOK_SIZE, (CODEBOOKS, count))

    prompt = {"text": rng.integers(0, 300, 2), "moshi_codes": codes(2), "user_codes": codes(2)}
    greedy = {"temperature": 0.0}
    arrivals = [Arrival("silence", {**greedy, "max_tokens": 9}, [{"silence": True, "prompt": prompt}], step=0),
                Arrival("codes", greedy, [{"user_codes": codes(7)}], step=1),
                Arrival("clip", greedy, [{"audio": speech(0.7, seed=1)}], step=2),
                Arrival("sampled", {"temperature": 0.8, "top_k": 20, "seed": 5}, [{"user_codes": codes(10)}], step=2),
                Arrival("prompted", greedy, [{"user_codes": codes(6), "prompt": prompt}], step=3),
                Arrival("long", greedy, [{"audio": speech(1.1, seed=2)}], step=4),
                Arrival("short", greedy, [{"user_codes": codes(1)}], step=5),
                Arrival("capped", {**greedy, "max_tokens": 3}, [{"audio": speech(1.0, seed=3)}], step=7)]
    alone = drive(duplex, arrivals, per_request=True)
    batched = drive(duplex, arrivals)
    assert max(len(ids) for prefill, ids, _ in batched.steps if not prefill) >= 6  # they did share steps
    for arrival in arrivals:
        rid = arrival.request_id
        assert tokens(batched, rid) == tokens(alone, rid)
        assert np.array_equal(frames(batched, rid), frames(alone, rid))
        assert frames(batched, rid).shape[1] == len(tokens(batched, rid)) - 1  # N frames, N + 1 text tokens
    assert frames(batched, "capped").shape[1] == 3 and batched.outputs["capped"][-1].finish_reason == "length"
    assert batched.outputs["long"][-1].finish_reason == "stop"
    assert duplex.kv.free_blocks == duplex.kv.num_blocks and len(duplex.streams) == 0  # all given back


@pytest.mark.slow
def test_a_live_stream_equals_the_reference_loop_and_waits_for_each_frame(duplex: MoshiDuplexRunner,
                                                                          model: Any) -> None:
    clip = speech(1.5, seed=5)
    want_tokens, want_frames = reference(model, user_codes(model, clip))
    assert len(want_tokens) == want_frames.shape[1] + 1 == -(-len(upsample(clip)) // FRAME_24K) + 1
    parts = pieces(clip, seed=6)

    def speak(step: int) -> None:  # a piece every other step, then the end
        index = step // 2 - 1
        if step % 2 or index < 0 or index > len(parts):
            return
        if index == len(parts):
            duplex.drop_audio_stream("live")
        else:
            duplex.append_audio("live", None, parts[index], index)

    live = drive(duplex, [Arrival("live", {"temperature": 0.0}, [{"stream": "live"}])], on_step=speak)
    assert tokens(live, "live") == want_tokens
    assert np.array_equal(frames(live, "live"), want_frames)
    statuses = [o.status.name for o in live.outputs["live"]]
    assert statuses.count("WAITING_FOR_CHUNK") >= 5  # it waited for the user's frames, never ahead of them
    assert live.outputs["live"][-1].finish_reason == "stop"
    whole = drive(duplex, [Arrival("whole", {"temperature": 0.0}, [{"audio": clip}])])
    assert tokens(whole, "whole") == want_tokens and np.array_equal(frames(whole, "whole"), want_frames)
    assert duplex.kv.free_blocks == duplex.kv.num_blocks and len(duplex.streams) == 0


@pytest.mark.slow
def test_bad_input_fails_its_session_alone_naming_the_field(duplex: MoshiDuplexRunner) -> None:
    greedy = {"temperature": 0.0}
    silence = {"silence": True}
    cases = {
        "two sources": ([{"silence": True, "user_codes": np.zeros((CODEBOOKS, 2), np.int64)}], greedy, AUDIO_FIELD),
        "no source": ([{}], greedy, AUDIO_FIELD),
        "bad codes": ([{"user_codes": np.full((CODEBOOKS, 2), CODEBOOK_SIZE)}], greedy, "user_codes"),
        "bad prompt": ([{**silence, "prompt": {"text": [1, 2], "moshi_codes": np.zeros((CODEBOOKS, 1), np.int64),
                                                "user_codes": np.zeros((CODEBOOKS, 2), np.int64)}}], greedy, "prompt"),
        "too long": ([silence], {**greedy, "max_tokens": 512}, "sampling_params.max_tokens"),
    }
    arrivals = [Arrival(rid, params, inputs) for rid, (inputs, params, _) in cases.items()]
    arrivals.append(Arrival("fine", {**greedy, "max_tokens": 2}, [silence]))
    result = drive(duplex, arrivals)
    for rid, (_, _, field) in cases.items():
        assert result.errors[rid].startswith(f"{field}:"), result.errors[rid]
    assert "fine" not in result.errors and result.finished("fine")
    with pytest.raises(FieldError) as caught:
        duplex.validate({"stop": ["bye"]})
    assert caught.value.field == "sampling_params.stop"

    # a stream is heard by one session; a stream that lost appends fails the session that hears it
    duplex.append_audio("shared", None, speech(0.2, seed=1), 0)
    duplex.append_audio("gap", None, speech(0.2, seed=1), 0)
    duplex.append_audio("gap", None, speech(0.2, seed=2), 2)
    result = drive(duplex, [Arrival("first", greedy, [{"stream": "shared"}]),
                            Arrival("second", greedy, [{"stream": "shared"}], step=1),
                            Arrival("gap", greedy, [{"stream": "gap"}], step=1)],
                   on_step=lambda step: duplex.drop_audio_stream("shared") if step == 4 else None)
    assert result.errors["second"].startswith(f"{AUDIO_FIELD}:") and "already heard" in result.errors["second"]
    assert result.errors["gap"].startswith(f"{AUDIO_FIELD}:") and "lost appends 1 to 1" in result.errors["gap"]
    assert "first" not in result.errors and result.outputs["first"][-1].finish_reason == "stop"
    assert duplex.kv.free_blocks == duplex.kv.num_blocks and len(duplex.streams) == 0


def test_the_prompt_processor_takes_one_live_stream_or_one_clip() -> None:
    clip = speech(0.3, seed=1)
    assert moshi_prompt({"multi_modal_data": {"audio": [{"stream": "s1"}]}}).data == {"stream": "s1"}
    assert np.array_equal(moshi_prompt({"multi_modal_data": {"audio": clip}}).data["audio"], clip)
    for prompt, field in (({"prompt": "hello", "multi_modal_data": {"audio": clip}}, "prompt.prompt"),
                          ({"prompt": ""}, AUDIO_FIELD),
                          ({"multi_modal_data": {"audio": [clip, clip]}}, AUDIO_FIELD),
                          ({"multi_modal_data": {"audio": [{"stream": 3}]}}, f"{AUDIO_FIELD}[0].stream")):
        with pytest.raises(FieldError) as caught:
            moshi_prompt(prompt)
        assert caught.value.field == field


def test_the_released_sizes_have_hf_moshikos_parameter_count() -> None:
    """What ``--size released`` builds, counted on the meta device (nothing allocated): the temporal transformer
    6.84B, the depth decoder 714M, the 16 audio embeddings 134M and Mimi 79M."""
    from transformers import MoshiForConditionalGeneration

    from omnipipe.models.moshi.weights.tiny import _config

    with torch.device("meta"):
        model = MoshiForConditionalGeneration(_config(320, "released", None))
    assert sum(param.numel() for param in model.parameters()) == 7_767_037_761
    assert sum(param.numel() for param in model.audio_encoder.parameters()) == 79_308_609


# ----------------------------------------------------------------------------------------------- the engine
@pytest.mark.slow
def test_a_live_session_through_the_engine(checkpoint: Path, duplex: MoshiDuplexRunner, model: Any) -> None:
    from omnipipe import AsyncOmni, SamplingParams

    clip = speech(2.0, seed=8)
    want_tokens, want_frames = reference(model, user_codes(model, clip))
    with torch.inference_mode():
        want_audio = model.audio_encoder.decode(torch.from_numpy(want_frames)[None]).audio_values[0, 0].numpy()
    assert want_audio.size == want_frames.shape[1] * FRAME_24K
    deploy = {"stages": {stage: {"threads": 1, "options": {"model": str(checkpoint)}} for stage in ("duplex", "mimi")}}
    half = len(clip) // 2

    async def run() -> tuple[str, np.ndarray, int, str | None]:
        async with AsyncOmni("moshi", deploy) as engine:
            heard_audio = asyncio.Event()
            text, audio, before_half, reason = "", [], 0, None

            async def speak() -> None:
                for part in pieces(clip[:half], seed=9):
                    await engine.append_audio("live", part, session_id="call")
                await asyncio.wait_for(heard_audio.wait(), 120)  # Moshi answers while the user still speaks
                for part in pieces(clip[half:], seed=10):
                    await engine.append_audio("live", part, session_id="call")
                await engine.drop_audio_stream("live")  # the user hangs up

            speaker = asyncio.ensure_future(speak())
            async for out in engine.generate({"multi_modal_data": {"audio": [{"stream": "live"}]}},
                                             sampling_params={"duplex": SamplingParams(temperature=0)},
                                             session_id="call"):
                if out.modality == "text":
                    text += out.text_delta
                elif out.modality == "audio":
                    audio.append(out.audio)
                    if not heard_audio.is_set():
                        before_half = sum(a.size for a in audio)
                        heard_audio.set()
                if out.finished:
                    reason = out.finish_reason
            await speaker
            assert engine.engine.audio_streams == {}  # the dropped stream is gone

            async def hang_up() -> None:  # a session whose caller ends it: it stops once its audio is heard
                await engine.append_audio("other", clip[:8000], session_id="call-2")
                await engine.end_session("call-2")

            ender = asyncio.ensure_future(hang_up())
            ended = [out async for out in engine.generate({"multi_modal_data": {"audio": [{"stream": "other"}]}},
                                                          session_id="call-2")]
            await ender
            assert ended[-1].finish_reason == "stop" and ended[-1].audio.size == 7 * FRAME_24K  # 0.5 s: 6.25 frames
            return text, np.concatenate(audio), before_half, reason

    text, audio, before_half, reason = asyncio.run(run())
    assert reason == "stop" and 0 < before_half < audio.size
    assert text == streamed_text(duplex, want_tokens)
    # one 80 ms frame out per 80 ms of input (the last partial frame padded): the user's duration
    assert audio.size == -(-len(upsample(clip)) // FRAME_24K) * FRAME_24K == want_audio.size
    assert np.abs(audio - want_audio).max() <= 1e-4 * max(1.0, float(np.abs(want_audio).max()))

