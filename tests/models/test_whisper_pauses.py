"""whisper's fitted window (a realtime turn's live transcription) on a question with a thinking pause: the word
after the pause is heard, as a whole-clip decode hears it (``omnipipe bench hearing`` measures the rest)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.server.conftest import spoken

pytestmark = pytest.mark.models

RATE = 24_000


def _words(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def _clip(text: str) -> np.ndarray:
    """``text`` said by the packaged voice (the same samples every run), without its trailing quiet."""
    from omnipipe.bench.voice_questions import cut_trailing_quiet

    pcm = (np.clip(spoken(text, steady=True), -1, 1) * 32767).astype("<i2").tobytes()
    return np.frombuffer(cut_trailing_quiet(pcm), "<i2").astype(np.float32) / 32768.0


@pytest.fixture(scope="module")
def asr() -> object:
    pytest.importorskip("faster_whisper")
    from omnipipe.models.default.modeling.whisper import WhisperASR

    return WhisperASR()


def test_the_word_after_a_thinking_pause_is_kept(asr: object) -> None:
    """"What is the capital of, um," 0.8 s of quiet, "Italy?", as a realtime session under semantic VAD passes it
    to transcription: the pcm16 buffer from 244 ms (where the VAD heard speech start, less its prefix padding) to the
    pause that starts the turn's final pass (3.20 s of speech), or to the commit. Without whisper's timestamps the
    fitted decode ended at the pause ("What is the capital of"), with or without the settled words as prefix."""
    from omnipipe.models.default.modeling.whisper import WhisperASR

    assert isinstance(asr, WhisperASR)
    silence = lambda seconds: np.zeros(int(seconds * RATE), np.float32)  # noqa: E731
    buffer = np.concatenate([silence(0.5), _clip("What is the capital of, um,"), silence(0.8), _clip("Italy?"),
                             silence(2.0)])
    sent = (np.clip(buffer, -1, 1) * 32767).astype("<i2")  # as the client appends it (pcm16)
    speech = sent.astype(np.float32)[244 * RATE // 1000:] / 32768.0
    for seconds in (3.20, 4.60):
        for prefix in ("", "What is the capital"):
            segment = asr.start_fitted(speech[:int(seconds * RATE)], RATE, prefix).next_segment()
            heard = segment.text if segment is not None else ""
            assert _words(heard)[-2:] == ["of", "italy"], (seconds, prefix, heard)
