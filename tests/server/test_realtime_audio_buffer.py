"""The realtime input audio buffer (``server/routes/realtime/audio_buffer.py``): the appended 24 kHz audio kept as it
came and resampled once to the 16 kHz stream its listeners share, the speech cut from where the VAD heard it start,
when each chunk arrived, and the size limit refused by field."""

from __future__ import annotations

import numpy as np
import pytest

from omnipipe.server.routes.realtime.audio_buffer import LISTEN_RATE_HZ, InputAudioBuffer
from omnipipe.server.routes.realtime.events import EventError
from omnipipe.server.vad import MODEL_RATE_HZ
from omnipipe.util.audio import resample

RATE = 24_000


def tone(seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_appended_audio_is_kept_as_it_came_and_resampled_once_as_a_stream() -> None:
    assert LISTEN_RATE_HZ == MODEL_RATE_HZ == 16_000  # the VAD's rate is whisper's and the end-of-turn model's
    audio = tone(1.0)
    buffer = InputAudioBuffer(max_bytes=10 * RATE * 2)
    heard = [buffer.append(audio[i:i + 960], arrived=float(i)) for i in range(0, audio.size, 960)]  # 40 ms chunks
    np.testing.assert_array_equal(buffer.audio(), audio)
    assert buffer.buffered_ms() == pytest.approx(1000.0)
    stream = np.concatenate(heard)
    whole = buffer.speech(flush=True)
    assert whole.size == pytest.approx(LISTEN_RATE_HZ, abs=2)  # the stream and its flushed tail: all of it
    np.testing.assert_array_equal(whole[:stream.size], stream)  # what each append gave out, in order
    reference = resample(audio, RATE, LISTEN_RATE_HZ)
    middle = slice(LISTEN_RATE_HZ // 10, LISTEN_RATE_HZ * 9 // 10)
    assert np.max(np.abs(whole[middle] - reference[middle])) < 1e-2  # the same signal as one resampling


def test_the_speech_starts_where_the_vad_heard_it_and_arrivals_date_the_audio() -> None:
    buffer = InputAudioBuffer(max_bytes=10 * RATE * 2)
    for i in range(10):  # 100 ms chunks arriving at 10.0, 10.1, ...
        buffer.append(tone(0.1), arrived=10.0 + i / 10)
    buffer.speech_started(400)
    buffer.speech_started(700)  # the first start counts
    lag = 0.6 * LISTEN_RATE_HZ - buffer.speech().size  # the resampler holds back its last few ms until flushed
    assert 0 <= lag < 0.03 * LISTEN_RATE_HZ, lag
    assert buffer.speech(flush=True).size == pytest.approx(0.6 * LISTEN_RATE_HZ, abs=2)
    assert buffer.arrival_of(250) == pytest.approx(10.2)  # the chunk holding 250 ms arrived third
    assert buffer.arrival_of(5000) > 1000  # past the end: now
    buffer.reset()
    assert buffer.chunks == [] and buffer.speech().size == 0


def test_a_buffer_that_would_grow_too_big_refuses_the_append_by_field() -> None:
    buffer = InputAudioBuffer(max_bytes=RATE * 2)  # one second
    buffer.append(tone(0.9), arrived=0.0)
    with pytest.raises(EventError) as refused:
        buffer.append(tone(0.2), arrived=0.1)
    assert refused.value.param == "audio" and refused.value.code == "buffer_too_large"
    assert "commit or clear" in refused.value.message
    assert buffer.buffered_ms() == pytest.approx(900.0)  # the refused chunk was not kept
