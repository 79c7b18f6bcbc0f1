"""Audio helpers of the recordings: 16-bit PCM WAV files (stdlib ``wave``) and the merged stereo replay of clips
placed on the session timeline (``ReplayMix``; a saved session's clips are read by ``session_replay``).

The merged replay puts every user clip on the left channel and every AI clip on the right, each at its start
time, so one listen follows the conversation as it happened. It is mixed and written block by block, so a long
session with little speech does not need its whole length in memory.
"""

from __future__ import annotations

import io
import logging
import math
import os
import wave
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from omnipipe.gateway.recording.store import temporary_path
from omnipipe.util.audio import resample

logger = logging.getLogger(__name__)

REPLAY_RATE_HZ = 24_000
Clip = tuple[float, np.ndarray, int]
"""``(start_s, samples, rate_hz)``: audio placed ``start_s`` seconds after the session start."""

_WRITE_BLOCK_S = 10.0
_PCM16_SCALE = 32767.0


def check_rate(rate: int, name: str = "rate") -> int:
    """``rate`` as an ``int`` if it is a positive integer, else ``ValueError`` naming ``name``."""
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate <= 0:
        raise ValueError(f"{name}: must be a positive integer sample rate, got {rate!r}")
    return int(rate)


def to_mono_float32(samples: np.ndarray) -> np.ndarray:
    """Samples as float32 in [-1, 1]: integer types are scaled, ``[frames, channels]`` is averaged, NaN -> 0."""
    array = np.asarray(samples)
    if np.issubdtype(array.dtype, np.integer):
        array = array.astype(np.float32) / float(-np.iinfo(array.dtype).min)
    array = np.asarray(array, dtype=np.float32)
    if array.ndim == 2:
        array = array.mean(axis=1, dtype=np.float32)
    elif array.ndim != 1:
        raise ValueError(f"samples: expected a 1-D or [frames, channels] array, got shape {list(array.shape)}")
    return np.nan_to_num(array, nan=0.0, posinf=1.0, neginf=-1.0)


def resample_clip(samples: np.ndarray, from_hz: int, to_hz: int) -> np.ndarray:
    """Float mono audio at ``to_hz``: soxr when installed, else linear interpolation."""
    if from_hz == to_hz or samples.size == 0:
        return samples
    try:
        return resample(samples, from_hz, to_hz)
    except ImportError:
        count = max(1, round(samples.size * to_hz / from_hz))
        positions = np.arange(count, dtype=np.float64) * (from_hz / to_hz)
        return np.interp(positions, np.arange(samples.size), samples).astype(np.float32)


def _to_pcm16(samples: np.ndarray) -> bytes:
    clipped = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    return np.round(clipped * _PCM16_SCALE).astype("<i2").tobytes()


def encode_wav(samples: np.ndarray, rate_hz: int) -> bytes:
    """Mono audio (any ``to_mono_float32`` input) as a 16-bit PCM WAV file."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(int(rate_hz))
        out.writeframes(_to_pcm16(to_mono_float32(samples)))
    return buffer.getvalue()


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A 16-bit PCM WAV file as ``(float32 mono samples, rate_hz)``; ``wave.Error`` for other encodings."""
    with wave.open(str(path), "rb") as source:
        if source.getsampwidth() != 2:
            raise wave.Error(f"{path.name}: expected 16-bit PCM, got {8 * source.getsampwidth()}-bit")
        channels = source.getnchannels()
        rate = source.getframerate()
        data = source.readframes(source.getnframes())
    samples = np.frombuffer(data, dtype="<i2").reshape(-1, channels)
    return to_mono_float32(samples), rate


def _placed(clips: Sequence[Clip], rate: int, channel: str) -> list[tuple[int, np.ndarray]]:
    """``(start_frame, samples at rate)`` of each non-empty clip."""
    placed: list[tuple[int, np.ndarray]] = []
    for i, (start_s, samples, clip_rate) in enumerate(clips):
        clip_rate = check_rate(clip_rate, f"{channel}[{i}] rate")
        if not math.isfinite(start_s):
            raise ValueError(f"{channel}[{i}] start: must be a finite number of seconds, got {start_s!r}")
        audio = resample_clip(to_mono_float32(samples), clip_rate, rate)
        if audio.size:
            placed.append((max(0, round(start_s * rate)), audio))
    return placed


def _mix(placed: list[tuple[int, np.ndarray]], begin: int, end: int) -> np.ndarray:
    """Frames ``begin..end`` of one channel: overlapping clips summed, then clipped to [-1, 1]."""
    out = np.zeros(end - begin, dtype=np.float32)
    for start, audio in placed:
        low, high = max(begin, start), min(end, start + audio.size)
        if low < high:
            out[low - begin:high - begin] += audio[low - start:high - start]
    return np.clip(out, -1.0, 1.0)


class ReplayMix:
    """User clips (channel 0) and AI clips (channel 1) placed on the session timeline at ``rate``, mixed a block
    at a time: ``frames`` reaches the end of the last clip; a block past it is silence."""

    def __init__(self, user: Sequence[Clip], ai: Sequence[Clip], rate: int = REPLAY_RATE_HZ) -> None:
        self.rate = check_rate(rate)
        self._user, self._ai = _placed(user, self.rate, "user"), _placed(ai, self.rate, "ai")
        self.frames = max((start + audio.size for placed in (self._user, self._ai) for start, audio in placed),
                          default=0)

    def block(self, begin: int, end: int) -> np.ndarray:
        """Frames ``begin..end`` as float32 ``[frames, 2]``."""
        return np.stack([_mix(self._user, begin, end), _mix(self._ai, begin, end)], axis=1)


def merged_replay(user: Sequence[Clip], ai: Sequence[Clip], rate: int = REPLAY_RATE_HZ) -> np.ndarray:
    """The conversation as float32 ``[frames, 2]`` at ``rate``: user clips on channel 0, AI clips on channel 1."""
    mix = ReplayMix(user, ai, rate)
    return mix.block(0, mix.frames)


def write_merged_replay(path: Path | str, user: Sequence[Clip], ai: Sequence[Clip], rate: int = REPLAY_RATE_HZ,
                        *, max_duration_s: float | None = None) -> Path:
    """Write ``merged_replay(user, ai, rate)`` as a stereo 16-bit WAV, atomically, cut at ``max_duration_s``."""
    mix = ReplayMix(user, ai, rate)
    path = Path(path)
    frames = mix.frames
    if max_duration_s is not None and frames > max_duration_s * mix.rate:
        logger.warning("replay %s: cut at %.0f s (the session spans %.0f s)", path, max_duration_s,
                       frames / mix.rate)
        frames = int(max_duration_s * mix.rate)
    block = int(_WRITE_BLOCK_S * mix.rate)
    temp = temporary_path(path)
    try:
        with wave.open(str(temp), "wb") as out:
            out.setnchannels(2)
            out.setsampwidth(2)
            out.setframerate(mix.rate)
            for begin in range(0, frames, block):
                out.writeframes(_to_pcm16(mix.block(begin, min(frames, begin + block))))
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return path
