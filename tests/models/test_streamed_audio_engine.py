"""Audio streamed into the Qwen-Omni pipelines through the real engine (stage processes; tiny checkpoints whose
thinker hears its audio, ``hearing_checkpoint.py``): a clip appended in random pieces of 20-200 ms answers, greedy,
with the same text (tokens exactly) and the same speech as the whole clip in the prompt; an unknown, dropped or
session-ended stream fails its request alone, naming the audio, and the engine goes on serving; bad arguments are
refused naming them, and the stage's limits counted in the engine; a stream whose stage restarted while it was
appended to fails its request rather than give the thinker a clip with a hole; the synchronous ``Omni`` streams as
well."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omnipipe import AsyncOmni, SamplingParams
from omnipipe.bench.streaming_audio import pieces, speech_like_clip
from omnipipe.models.registry import get_pipeline
from omnipipe.stage.streaming_audio import MAX_OPEN_STREAMS, MAX_STREAM_S
from omnipipe.util.field_error import FieldError
from tests.models.hearing_checkpoint import write_hearing_checkpoint

pytestmark = pytest.mark.slow  # a tiny Qwen3-Omni pipeline served stage by stage

AUDIO_FIELD = "prompt.multi_modal_data.audio"
QUESTION = "what did you hear"


@pytest.fixture(scope="module", params=["qwen3_omni", "qwen2_5_omni"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    return request.param, write_hearing_checkpoint(request.param, tmp_path_factory.mktemp(request.param) / "ckpt")


def deploy(checkpoint: Path, pipeline: str) -> dict[str, Any]:
    return {"stages": {s: {"threads": 1, "options": {"model": str(checkpoint)}}
                       for s in get_pipeline(pipeline).stage_names}}


def params() -> dict[str, SamplingParams]:
    return {"thinker": SamplingParams(temperature=0, max_tokens=12),
            "talker": SamplingParams(temperature=0, max_tokens=24)}


async def answer(engine: AsyncOmni, audio: Any, modalities: tuple[str, ...] = ("text", "audio"),
                 **kwargs: Any) -> tuple[str, np.ndarray]:
    text, speech = "", []
    async for out in engine.generate({"prompt": QUESTION, "multi_modal_data": {"audio": audio}},
                                     sampling_params=params(), output_modalities=list(modalities), **kwargs):
        if out.modality == "text":
            text += out.text_delta
        elif out.modality == "audio":
            speech.append(out.audio)
    return text, (np.concatenate(speech) if speech else np.zeros(0, np.float32))


async def append(engine: AsyncOmni, stream_id: str, clip: np.ndarray, seed: int, **kwargs: Any) -> None:
    for part in pieces(clip, seed):
        await engine.append_audio(stream_id, part, **kwargs)


async def refused(engine: AsyncOmni, stream_id: str) -> str:
    with pytest.raises(FieldError) as caught:
        await answer(engine, [{"stream": stream_id}], ("text",))
    assert caught.value.field == AUDIO_FIELD
    return caught.value.rule


def test_streamed_audio_through_the_engine(family: tuple[str, Path]) -> None:
    pipeline, checkpoint = family
    clip = speech_like_clip(2.6, seed=11)

    async def run() -> None:
        async with AsyncOmni(pipeline, deploy(checkpoint, pipeline)) as engine:
            await append(engine, "turn-1", clip, seed=32)
            streamed = await answer(engine, [{"stream": "turn-1"}])
            whole = await answer(engine, [clip])
            other = await answer(engine, [speech_like_clip(2.6, seed=99)])
            assert whole[0] and whole[0] != other[0]  # the thinker hears its audio
            assert streamed[0] == whole[0]
            assert streamed[1].shape == whole[1].shape and streamed[1].size
            assert np.array_equal(streamed[1], whole[1])  # the same speech codes, decoded the same

            # the request took its stream; a dropped one, one never appended and a session's are unknown
            assert "is unknown" in await refused(engine, "turn-1")
            await append(engine, "dropped", clip[:16000], seed=34)
            await engine.drop_audio_stream("dropped")
            await append(engine, "mine", clip[:16000], seed=35, session_id="session-a")
            await append(engine, "theirs", clip[:16000], seed=36, session_id="session-b")
            await engine.end_session("session-a")
            for stream_id in ("dropped", "never", "mine"):
                rule = await refused(engine, stream_id)
                assert "is unknown" in rule and repr(stream_id) in rule
            # the engine goes on serving, streams of other sessions included
            assert (await answer(engine, [{"stream": "theirs"}], ("text",), session_id="session-b"))[0]
            assert engine.engine.audio_streams == {}

            # what the API refuses, naming the argument
            for bad, name in (([0.1, 0.2], None), (np.zeros((2, 160), np.float32), "pcm16k"),
                              (np.zeros(0, np.float32), "pcm16k"), (np.array([np.nan], np.float32), "pcm16k")):
                if name is None:
                    await engine.append_audio("list", bad)  # a list of floats is taken
                    continue
                with pytest.raises(FieldError) as caught:
                    await engine.append_audio("bad", bad)
                assert caught.value.field == name
            with pytest.raises(FieldError) as caught:
                await engine.append_audio("", clip[:160])
            assert caught.value.field == "stream_id"
            with pytest.raises(FieldError) as caught:
                await engine.append_audio("list", clip[:160], session_id="another")
            assert caught.value.field == "session_id"
            for audio, where in (([{"stream": 3}], f"{AUDIO_FIELD}[0].stream"),
                                 ([{"stream": "list", "rate": 16000}], f"{AUDIO_FIELD}[0]"),
                                 ([{"stream": "list"}, clip], AUDIO_FIELD)):
                with pytest.raises(FieldError) as caught:
                    await answer(engine, audio, ("text",))
                assert caught.value.field == where
            # the stage's limits, counted in the engine ("list" is open)
            thinker = engine.engine.orchestrator.clients["thinker"]
            assert (thinker.max_audio_streams, thinker.max_audio_stream_s) == (MAX_OPEN_STREAMS, MAX_STREAM_S)
            thinker.max_audio_streams, thinker.max_audio_stream_s = 1, 0.5
            try:
                with pytest.raises(FieldError) as caught:
                    await engine.append_audio("second", clip[:160])
                assert caught.value.field == "stream_id" and "at most 1 open audio stream" in caught.value.rule
                with pytest.raises(FieldError) as caught:
                    await engine.append_audio("list", clip[:8000])
                assert caught.value.field == "pcm16k" and "longer than 0.5 s" in caught.value.rule
            finally:
                thinker.max_audio_streams, thinker.max_audio_stream_s = MAX_OPEN_STREAMS, MAX_STREAM_S
            await engine.drop_audio_stream("list")
            state = await engine.debug_state()
            assert not state["orchestrator_requests"]

    asyncio.run(run())


def test_a_stream_cut_by_a_restart_of_its_stage_fails_its_request(tmp_path: Path) -> None:
    pipeline = "qwen3_omni"  # one family is enough: the engine and stage code is shared
    checkpoint = write_hearing_checkpoint(pipeline, tmp_path / "ckpt")
    clip = speech_like_clip(1.5, seed=41)
    half = len(clip) // 2

    async def run() -> None:
        async with AsyncOmni(pipeline, deploy(checkpoint, pipeline)) as engine:
            await append(engine, "cut", clip[:half], seed=42)
            thinker = (await engine.debug_state())["pids"]["thinker"]
            os.kill(thinker, signal.SIGKILL)
            deadline = time.monotonic() + 120
            while True:  # the thinker is restarted
                try:
                    await answer(engine, [clip], ("text",))
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
            await append(engine, "cut", clip[half:], seed=43)
            assert "lost its first" in await refused(engine, "cut")
            await append(engine, "after", clip, seed=44)  # a stream begun after the restart is whole
            assert (await answer(engine, [{"stream": "after"}], ("text",)))[0] == \
                (await answer(engine, [clip], ("text",)))[0]

    asyncio.run(run())


def test_the_synchronous_api_streams_audio_too(tmp_path: Path) -> None:
    from omnipipe import Omni

    pipeline = "qwen3_omni"
    checkpoint = write_hearing_checkpoint(pipeline, tmp_path / "ckpt")
    clip = speech_like_clip(2.6, seed=11)
    with Omni(pipeline, deploy(checkpoint, pipeline)) as engine:
        for part in pieces(clip, seed=51):
            engine.append_audio("sync", part, session_id="s")
        prompts = [{"prompt": QUESTION, "multi_modal_data": {"audio": audio}}
                   for audio in ([{"stream": "sync"}], [clip])]
        streamed, whole = (engine.generate(prompt, sampling_params=params(), output_modalities=["text"],
                                           use_tqdm=False, session_id="s")[0] for prompt in prompts)
        assert streamed.text == whole.text and whole.text
        engine.append_audio("dropped", clip[:1600])
        engine.drop_audio_stream("dropped")
        with pytest.raises(FieldError) as caught:
            engine.generate({"prompt": QUESTION, "multi_modal_data": {"audio": [{"stream": "dropped"}]}},
                            output_modalities=["text"], use_tqdm=False)
        assert caught.value.field == AUDIO_FIELD
        engine.end_session("s")


def test_a_thinker_with_audio_streams_0_takes_none_and_hears_whole_clips(tmp_path: Path) -> None:
    from omnipipe.engine.async_omni_engine import AudioStreamsNotTakenError

    pipeline = "qwen3_omni"
    checkpoint = write_hearing_checkpoint(pipeline, tmp_path / "ckpt")
    clip = speech_like_clip(1.5, seed=61)
    no_streams = deploy(checkpoint, pipeline)
    no_streams["stages"]["thinker"]["options"]["audio_streams"] = 0

    async def run() -> None:
        async with AsyncOmni(pipeline, no_streams) as engine:
            with pytest.raises(AudioStreamsNotTakenError):
                await engine.append_audio("refused", clip[:1600])
            assert (await answer(engine, [clip], ("text",)))[0]  # whole clips are heard as ever

    asyncio.run(run())
    bad = deploy(checkpoint, pipeline)
    bad["stages"]["thinker"]["options"]["audio_streams"] = -1
    with pytest.raises(Exception, match=r"stages.thinker.options.audio_streams: must be an integer in \[0, 1024\]"):
        asyncio.run(AsyncOmni(pipeline, bad).__aenter__())
