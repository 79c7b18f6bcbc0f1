"""Audio streamed into a Qwen-Omni thinker stage before its request (``append_audio``; tiny random checkpoints, CPU,
in-process with the stage's own scheduler and step): greedy text and the talker's hand-off equal the same request
with the whole clip, the audio tower does not run again at the prefill, and a stream that is unknown, dropped,
ended with its session, over its limits or missing appends fails its request alone, naming the audio."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnipipe.bench.streaming_audio import pieces, speech_like_clip
from omnipipe.stage.runner import RunnerContext, StageRunner
from omnipipe.stage.runner_driver import Arrival, DriveResult, drive
from omnipipe.stage.streaming_audio import AUDIO_FIELD
from tests.models.hearing_checkpoint import write_hearing_checkpoint

GREEDY = {"temperature": 0.0, "max_tokens": 12}
HANDOFF_BOUND = 1e-5  # of the values' absmax: the streamed encoder's rounding (within 2e-6, see its test)


def _qwen3(directory: Path) -> StageRunner:
    from omnipipe.models.qwen3_omni.runners.thinker import Qwen3ThinkerRunner

    write_hearing_checkpoint("qwen3_omni", directory)
    return Qwen3ThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {"model": str(directory)}))


def _qwen2_5(directory: Path) -> StageRunner:
    from omnipipe.models.qwen2_5_omni.runners.thinker import Qwen25ThinkerRunner

    write_hearing_checkpoint("qwen2_5_omni", directory)
    return Qwen25ThinkerRunner(RunnerContext("thinker", "cpu", 1, 8, {"model": str(directory)}))


FAMILIES: dict[str, Callable[[Path], StageRunner]] = {"qwen3_omni": _qwen3, "qwen2_5_omni": _qwen2_5}


@pytest.fixture(scope="module", params=list(FAMILIES))
def thinker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> StageRunner:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    runner = FAMILIES[request.param](tmp_path_factory.mktemp(request.param) / "ckpt")
    runner.load()
    yield runner
    runner.close()
    torch.set_num_threads(threads)


def stream(runner: StageRunner, stream_id: str, clip: np.ndarray, seed: int, session_id: str | None = None) -> None:
    for seq, part in enumerate(pieces(clip, seed)):
        runner.append_audio(stream_id, session_id, part, seq)


def run(runner: StageRunner, items: dict[str, dict[str, Any]]) -> DriveResult:
    return drive(runner, [Arrival(rid, GREEDY, [item]) for rid, item in items.items()])


def tower_calls(runner: StageRunner) -> list[int]:
    """The log-mel frames of each forward of the audio tower from now on (the streamed encoder of Qwen2.5 runs it
    over one chunk at a time, Qwen3's runs its parts; the whole clip's prefill runs it over every frame)."""
    calls: list[int] = []
    tower = runner.model.model.audio_tower

    def count(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        features = args[0] if args else kwargs["input_features"]
        calls.append(int(features.shape[-1]))

    tower.register_forward_pre_hook(count, with_kwargs=True)
    return calls


def test_a_streamed_clip_answers_as_the_whole_clip(thinker: StageRunner) -> None:
    clip = speech_like_clip(2.6, seed=11)
    stream(thinker, "s1", clip, seed=12)
    chunk = thinker.audio_streams._new_stream().encoder.chunk_frames
    calls = tower_calls(thinker)
    streamed = run(thinker, {"streamed": {"text": "what did you hear", "audios": [{"stream": "s1"}]}})
    assert all(frames <= chunk for frames in calls)  # the encoder output came with the stream
    whole = run(thinker, {"whole": {"text": "what did you hear", "audios": [clip]},
                          "other": {"text": "what did you hear", "audios": [speech_like_clip(2.6, seed=99)]}})
    assert max(calls) > chunk  # the whole clip's prefill ran the tower over it
    assert not streamed.errors and not whole.errors
    assert whole.text("other") != whole.text("whole")  # the thinker hears what it is given
    assert streamed.text("streamed") == whole.text("whole") and whole.text("whole")
    got = [o.data["token"] for o in streamed.outputs["streamed"] if o.data]
    want = [o.data["token"] for o in whole.outputs["whole"] if o.data]
    assert got == want and len(got) == GREEDY["max_tokens"]
    prompt_got = next(o.data["prompt"] for o in streamed.outputs["streamed"] if o.data)
    prompt_want = next(o.data["prompt"] for o in whole.outputs["whole"] if o.data)
    for key, value in prompt_want.items():
        if torch.is_tensor(value) and value.is_floating_point() and value.numel():
            scale = max(1.0, float(value.abs().max()))
            assert float((prompt_got[key] - value).abs().max()) <= HANDOFF_BOUND * scale, key
    assert len(thinker.audio_streams) == 0  # the request took it


def unknown(result: DriveResult, request_id: str) -> str:
    error = result.errors[request_id]
    assert error.startswith(f"{AUDIO_FIELD}: "), error
    return error


def test_an_unknown_or_dropped_stream_fails_its_request_alone(thinker: StageRunner) -> None:
    clip = speech_like_clip(0.8, seed=13)
    stream(thinker, "dropped", clip, seed=14)
    thinker.drop_audio_stream("dropped")
    stream(thinker, "used", clip, seed=15)
    result = run(thinker, {"never": {"text": "hi", "audios": [{"stream": "never"}]},
                           "dropped": {"text": "hi", "audios": [{"stream": "dropped"}]},
                           "used": {"text": "hi", "audios": [{"stream": "used"}]},
                           "text": {"text": "hello there"}})
    assert "is unknown" in unknown(result, "never") and "'never'" in unknown(result, "never")
    assert "is unknown" in unknown(result, "dropped")
    assert result.finished("used") and result.finished("text") and set(result.errors) == {"never", "dropped"}
    again = run(thinker, {"again": {"text": "hi", "audios": [{"stream": "used"}]}})  # the first request took it
    assert "is unknown" in unknown(again, "again")


def test_end_session_drops_the_sessions_streams(thinker: StageRunner) -> None:
    clip = speech_like_clip(0.5, seed=16)
    stream(thinker, "mine", clip, seed=17, session_id="a")
    stream(thinker, "theirs", clip, seed=18, session_id="b")
    thinker.end_session("a")
    result = run(thinker, {"mine": {"text": "hi", "audios": [{"stream": "mine"}]},
                           "theirs": {"text": "hi", "audios": [{"stream": "theirs"}]}})
    assert "is unknown" in unknown(result, "mine") and result.finished("theirs")


def test_a_stream_missing_appends_or_too_long_fails_by_name(thinker: StageRunner) -> None:
    clip = speech_like_clip(0.5, seed=19)
    parts = pieces(clip, seed=20)
    thinker.append_audio("late", None, parts[0], 1)  # its first append was lost (a restart)
    for seq, part in enumerate(parts[:2]):
        thinker.append_audio("gap", None, part, 2 * seq)
    limit = thinker.audio_streams.max_seconds
    thinker.audio_streams.max_seconds = 0.1
    try:
        stream(thinker, "long", clip, seed=21)
    finally:
        thinker.audio_streams.max_seconds = limit
    result = run(thinker, {name: {"text": "hi", "audios": [{"stream": name}]} for name in ("late", "gap", "long")})
    assert "lost its first 1 append" in unknown(result, "late")
    assert "lost appends 1 to 1" in unknown(result, "gap")
    assert "longer than 0.1 s" in unknown(result, "long")


def test_the_open_streams_are_bounded(thinker: StageRunner) -> None:
    clip = speech_like_clip(0.3, seed=22)
    most = thinker.audio_streams.max_streams
    thinker.audio_streams.max_streams = 2
    try:
        for name in ("first", "second", "third"):
            stream(thinker, name, clip, seed=23)
        assert len(thinker.audio_streams) == 2
    finally:
        thinker.audio_streams.max_streams = most
    result = run(thinker, {name: {"text": "hi", "audios": [{"stream": name}]} for name in ("first", "third")})
    assert "is unknown" in unknown(result, "first") and result.finished("third")
    thinker.drop_audio_stream("second")
