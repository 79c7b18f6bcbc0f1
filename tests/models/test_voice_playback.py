"""The default family's talker and decoder say how many seconds of playback each output carries (the ``deadline``
schedule serves by it)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from omnipipe.models.default.pipeline import VOICE_HOP_SAMPLES, VOICE_SAMPLE_RATE_HZ
from omnipipe.models.default.runners.code2wav import PiperCode2WavRunner
from omnipipe.models.default.runners.talker import PiperTalkerRunner
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerContext

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _request(rid: str, chunk: dict[str, object]) -> StageRequest:
    request = StageRequest(rid, {}, True, True, [])
    request.inputs.append(chunk)
    return request


@pytest.mark.models
def test_talker_frames_and_decoder_samples_say_their_playback_seconds() -> None:
    talker = PiperTalkerRunner(RunnerContext("talker", "cpu", 1, 2, {"noise_scale": 0.0, "noise_w": 0.0}))
    talker.load()
    spoken, silent = talker.execute([_request("a", {"text": "Hello there."}), _request("b", {"text": ""})])
    frames = spoken.data["frames"]
    assert frames.shape[1] > 0
    assert spoken.playback_s == pytest.approx(frames.shape[1] * VOICE_HOP_SAMPLES / VOICE_SAMPLE_RATE_HZ)
    assert silent.playback_s == 0.0

    decoder = PiperCode2WavRunner(RunnerContext("code2wav", "cpu", 1, 2, {}))
    decoder.load()
    (output,) = decoder.execute([_request("a", {"frames": np.asarray(frames)})])
    assert output.audio is not None and len(output.audio) == frames.shape[1] * VOICE_HOP_SAMPLES
    assert output.playback_s == pytest.approx(len(output.audio) / VOICE_SAMPLE_RATE_HZ)
    assert output.playback_s == pytest.approx(spoken.playback_s)
