"""``merged_replay.mp4``: a live session's camera frames as video, with the merged replay's audio, encoded with PyAV.

The video runs at a fixed ``VIDEO_REPLAY_FPS`` (4, the most frames per second the worker takes): output frame ``k``
(at ``k / 4`` s) shows the latest camera frame placed at or before that time, black before the first. The worker
takes frames at least 250 ms apart, so every kept frame shows in at least one output frame: decoded, the video
holds one run of identical pictures per frame sent (a frame held ``d`` seconds fills about ``4 d`` output frames),
``ceil(4 x duration)`` frames in all. The audio is ``ReplayMix``'s stereo mix (user left, AI right) as AAC, on
the same timeline. Both streams last ``duration_s`` (the session's length), at least until the last frame has
had its 1/4 s; pictures are scaled to the first frame's size (at most ``MAX_VIDEO_SIDE`` on the long side).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image

from omnipipe.gateway.recording.replay import REPLAY_RATE_HZ, Clip, ReplayMix
from omnipipe.gateway.recording.store import temporary_path
from omnipipe.protocol.realtime import MIN_FRAME_INTERVAL_MS

logger = logging.getLogger(__name__)

VIDEO_REPLAY_FPS = round(1000 / MIN_FRAME_INTERVAL_MS)  # 4: every frame the worker takes shows at least once
MAX_VIDEO_SIDE = 1280
VIDEO_CODEC = "libx264"  # H.264 in MP4 plays in every browser
AUDIO_CODEC = "aac"
_ENCODER_THREADS = 2  # the encoder runs on a recording thread beside live sessions: leave them CPU
_BLOCK_S = 1.0


def _output_size(frames: Sequence[tuple[float, Path]]) -> tuple[int, int]:
    """The first readable frame's size, scaled to at most ``MAX_VIDEO_SIDE``, even (as yuv420p needs)."""
    for _, path in frames:
        try:
            with Image.open(path) as image:
                width, height = image.size
        except (OSError, ValueError):
            continue
        scale = min(1.0, MAX_VIDEO_SIDE / max(width, height))
        return max(2, int(width * scale) // 2 * 2), max(2, int(height * scale) // 2 * 2)
    return 320, 240


class _Pictures:
    """The picture each output frame shows: frames decoded once, when they become current."""

    def __init__(self, frames: Sequence[tuple[float, Path]], size: tuple[int, int]) -> None:
        self._frames = frames
        self.size = size
        self._next = 0
        self._current = self._to_video_frame(np.zeros((size[1], size[0], 3), dtype=np.uint8))

    def _to_video_frame(self, rgb: np.ndarray) -> av.VideoFrame:
        return av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")

    def at(self, t: float) -> av.VideoFrame:
        """The picture of the latest frame placed at or before ``t`` (an unreadable frame keeps the previous)."""
        while self._next < len(self._frames) and self._frames[self._next][0] <= t + 1e-9:
            path = self._frames[self._next][1]
            self._next += 1
            try:
                with Image.open(path) as image:
                    rgb = np.asarray(image.convert("RGB").resize(self.size))
            except (OSError, ValueError) as exc:
                logger.warning("replay video: frame %s left out (%s)", path.name, exc)
                continue
            self._current = self._to_video_frame(rgb)
        return self._current


def replay_duration(frames: Sequence[tuple[float, Path]], mix: ReplayMix, duration_s: float) -> float:
    """How long the video replay lasts: ``duration_s``, or longer to the end of the audio or the last frame's slot."""
    last_frame_end = frames[-1][0] + 1.0 / VIDEO_REPLAY_FPS if frames else 0.0
    return max(duration_s, mix.frames / mix.rate, last_frame_end)


def write_video_replay(path: Path, frames: Sequence[tuple[float, Path]], user: Sequence[Clip], ai: Sequence[Clip],
                       *, duration_s: float, max_duration_s: float | None = None) -> Path:
    """Write ``merged_replay.mp4`` at ``path`` (atomically) from ``frames`` (``(t, JPEG file)`` in time order) and
    the ``user``/``ai`` clips; the replay lasts ``replay_duration``, cut at ``max_duration_s``."""
    mix = ReplayMix(user, ai, REPLAY_RATE_HZ)
    end_s = replay_duration(frames, mix, duration_s)
    if max_duration_s is not None and end_s > max_duration_s:
        logger.warning("replay %s: cut at %.0f s (the session spans %.0f s)", path, max_duration_s, end_s)
        end_s = max_duration_s
    temp = temporary_path(path)
    try:
        with av.open(str(temp), mode="w", format="mp4") as container:
            _encode(container, _Pictures(frames, _output_size(frames)), mix, end_s)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return path


def _encode(container: av.container.OutputContainer, pictures: _Pictures, mix: ReplayMix, end_s: float) -> None:
    """Both streams, a second at a time, so the file is interleaved and memory stays bounded."""
    width, height = pictures.size
    video = container.add_stream(VIDEO_CODEC, rate=VIDEO_REPLAY_FPS, width=width, height=height, pix_fmt="yuv420p",
                                 options={"preset": "veryfast", "crf": "23", "threads": str(_ENCODER_THREADS)})
    audio = container.add_stream(AUDIO_CODEC, rate=mix.rate, layout="stereo")
    slots = math.ceil(end_s * VIDEO_REPLAY_FPS - 1e-6)
    samples = round(end_s * mix.rate)
    for second in range(math.ceil(end_s / _BLOCK_S)):
        begin, end = round(second * _BLOCK_S * mix.rate), min(samples, round((second + 1) * _BLOCK_S * mix.rate))
        if begin < end:
            block = av.AudioFrame.from_ndarray(np.ascontiguousarray(mix.block(begin, end).T), format="fltp",
                                               layout="stereo")
            block.sample_rate, block.pts, block.time_base = mix.rate, begin, Fraction(1, mix.rate)
            container.mux(audio.encode(block))
        first_slot = math.ceil(second * _BLOCK_S * VIDEO_REPLAY_FPS)
        for slot in range(first_slot, min(slots, math.ceil((second + 1) * _BLOCK_S * VIDEO_REPLAY_FPS))):
            picture = pictures.at(slot / VIDEO_REPLAY_FPS)
            picture.pts, picture.time_base = slot, Fraction(1, VIDEO_REPLAY_FPS)
            container.mux(video.encode(picture))
    container.mux(video.encode(None))
    container.mux(audio.encode(None))
