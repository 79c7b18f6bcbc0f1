"""Decoder stage of a Piper voice: latent frames -> waveform, whole or in windows.

The decoder is a HiFi-GAN stack of convolutions (no recurrence, no attention):
one latent frame becomes ``hop_samples`` (256) output samples and each output
sample depends on about 10 latent frames on either side. A window with 10
frames of context on each side of its new frames reproduces the whole-sequence
decode to ~1e-6. Left context alone is not enough: the missing right context
changes the last frames of a chunk by up to ~0.15 (audible clicks).

Streaming therefore holds back the last ``right_context_frames`` of what has
arrived until more frames (or the end of the utterance) are known; see
``DecoderStream``. The talker produces a whole sentence of latents in one
call, so within a sentence this lookahead costs no waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from omnipipe.models.default.weights.voice import (
    AUDIO_NAME,
    LATENTS_NAME,
    ModelPreparationError,
    VoicePaths,
    make_session_options,
)

logger = logging.getLogger(__name__)

# Measured: context at or beyond this many frames leaves the new frames unchanged (~1e-6).
EXACT_CONTEXT_FRAMES = 10
DEFAULT_CHUNK_FRAMES = 25
DEFAULT_LEFT_CONTEXT_FRAMES = EXACT_CONTEXT_FRAMES
DEFAULT_RIGHT_CONTEXT_FRAMES = EXACT_CONTEXT_FRAMES


class DecoderWindow(NamedTuple):
    """Latents ``[channels, left + new + right]`` with the context sizes in frames."""

    latents: np.ndarray
    left_context_frames: int
    right_context_frames: int = 0

    @property
    def new_frames(self) -> int:
        return int(self.latents.shape[1]) - self.left_context_frames - self.right_context_frames


class PiperDecoder:
    """Runs the decoder graph of a split Piper voice (see ``voice_weights``)."""

    def __init__(self, paths: VoicePaths, num_threads: int = 1, providers: list[Any] | None = None) -> None:
        try:
            import onnxruntime
        except ImportError as exc:
            raise ModelPreparationError("the Piper decoder needs onnxruntime: pip install onnxruntime") from exc
        self.paths = paths
        self.sample_rate_hz = paths.sample_rate_hz
        self.hop_samples = paths.hop_samples
        self.latent_channels = paths.latent_channels
        self._session = onnxruntime.InferenceSession(
            str(paths.decoder_onnx),
            sess_options=make_session_options(num_threads),
            providers=providers or ["CPUExecutionProvider"],
        )

    def _check_latents(self, latents: np.ndarray) -> np.ndarray:
        latents = np.asarray(latents, dtype=np.float32)
        if latents.ndim != 2 or latents.shape[0] != self.latent_channels:
            raise ValueError(f"latents must be [{self.latent_channels}, frames], got {list(latents.shape)}")
        return latents

    def _run(self, batch: np.ndarray) -> np.ndarray:
        """Decode ``[batch, channels, frames]`` -> ``[batch, frames * hop]``."""
        started_s = time.perf_counter()
        (audio,) = self._session.run([AUDIO_NAME], {LATENTS_NAME: np.ascontiguousarray(batch)})
        audio = audio.reshape(batch.shape[0], -1)
        logger.debug(
            "decoder: batch %d x %d frames in %.1f ms",
            batch.shape[0],
            batch.shape[2],
            (time.perf_counter() - started_s) * 1e3,
        )
        return audio

    def decode(self, latents: np.ndarray) -> np.ndarray:
        """Whole waveform ``float32 [frames * hop]`` for latents ``[channels, frames]``."""
        latents = self._check_latents(latents)
        if latents.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        return self._run(latents[None])[0]

    def decode_window(
        self,
        latents_window: np.ndarray,
        left_context_frames: int,
        right_context_frames: int = 0,
    ) -> np.ndarray:
        """Waveform of the new frames only (context frames are decoded, then cut off)."""
        return self.decode_batch([DecoderWindow(latents_window, left_context_frames, right_context_frames)])[0]

    def decode_batch(self, windows: Sequence[DecoderWindow | tuple[np.ndarray, int, int]]) -> list[np.ndarray]:
        """Decode several windows (e.g. of different requests) in one onnxruntime call.

        Windows are zero-padded to the longest one. Each is padded on a side
        where its own context is at least ``EXACT_CONTEXT_FRAMES`` (then the
        padding does not reach its new frames); if neither side is, on the
        right (measured change of the new frames: ~1e-4).
        """
        checked: list[DecoderWindow] = []
        for window in windows:
            window = DecoderWindow(*window)
            latents = self._check_latents(window.latents)
            left, right = int(window.left_context_frames), int(window.right_context_frames)
            if left < 0 or right < 0 or left + right > latents.shape[1]:
                raise ValueError(
                    f"bad context sizes left={left} right={right} for a window of {latents.shape[1]} frames"
                )
            checked.append(DecoderWindow(latents, left, right))
        results = [np.zeros(0, dtype=np.float32) for _ in checked]
        active = [index for index, window in enumerate(checked) if window.new_frames > 0]
        if not active:
            return results

        max_frames = max(checked[index].latents.shape[1] for index in active)
        batch = np.zeros((len(active), self.latent_channels, max_frames), dtype=np.float32)
        offsets: list[int] = []
        for row, index in enumerate(active):
            window = checked[index]
            frames = window.latents.shape[1]
            pad_left = window.right_context_frames < EXACT_CONTEXT_FRAMES <= window.left_context_frames
            offset = max_frames - frames if pad_left else 0
            batch[row, :, offset : offset + frames] = window.latents
            offsets.append(offset)

        audio = self._run(batch)
        hop = self.hop_samples
        for row, index in enumerate(active):
            window = checked[index]
            start = (offsets[row] + window.left_context_frames) * hop
            results[index] = audio[row, start : start + window.new_frames * hop].copy()
        return results


def iter_windows(
    latents: np.ndarray,
    chunk_frames: int = DEFAULT_CHUNK_FRAMES,
    left_context_frames: int = DEFAULT_LEFT_CONTEXT_FRAMES,
    right_context_frames: int = DEFAULT_RIGHT_CONTEXT_FRAMES,
) -> Iterator[DecoderWindow]:
    """Cut ``[channels, frames]`` latents into decoder windows of ``chunk_frames`` new frames."""
    if chunk_frames <= 0:
        raise ValueError("chunk_frames must be positive")
    total_frames = latents.shape[1]
    for start in range(0, total_frames, chunk_frames):
        end = min(start + chunk_frames, total_frames)
        first = max(0, start - left_context_frames)
        last = min(total_frames, end + right_context_frames)
        yield DecoderWindow(latents[:, first:last], start - first, last - end)


class DecoderStream:
    """Per-request planner that turns latents arriving in pieces into decoder windows.

    ``push`` latents as they arrive and ``close`` at the end of the utterance;
    ``next_window`` returns a window once its new frames are final (``chunk_frames``
    new frames plus ``right_context_frames`` of lookahead have arrived, or the
    stream is closed), else None. Feed the windows of several streams to
    ``PiperDecoder.decode_batch``.
    """

    def __init__(
        self,
        latent_channels: int = 192,
        chunk_frames: int = DEFAULT_CHUNK_FRAMES,
        left_context_frames: int = DEFAULT_LEFT_CONTEXT_FRAMES,
        right_context_frames: int = DEFAULT_RIGHT_CONTEXT_FRAMES,
        first_chunk_frames: int | None = None,
    ) -> None:
        if chunk_frames <= 0 or (first_chunk_frames is not None and first_chunk_frames <= 0):
            raise ValueError("chunk sizes must be positive")
        self.latent_channels = latent_channels
        self.chunk_frames = chunk_frames
        self.first_chunk_frames = first_chunk_frames or chunk_frames
        self.left_context_frames = left_context_frames
        self.right_context_frames = right_context_frames
        self._buffer = np.zeros((latent_channels, 0), dtype=np.float32)
        self._buffer_start_frame = 0  # absolute index of the buffer's first frame
        self._received_frames = 0
        self._emitted_frames = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def done(self) -> bool:
        """Closed and every frame handed out in a window."""
        return self._closed and self._emitted_frames >= self._received_frames

    def push(self, latents: np.ndarray) -> None:
        if self._closed:
            raise RuntimeError("push after close")
        latents = np.asarray(latents, dtype=np.float32)
        if latents.ndim != 2 or latents.shape[0] != self.latent_channels:
            raise ValueError(f"latents must be [{self.latent_channels}, frames], got {list(latents.shape)}")
        self._buffer = np.concatenate([self._buffer, latents], axis=1)
        self._received_frames += latents.shape[1]

    def close(self) -> None:
        self._closed = True

    def next_window(self) -> DecoderWindow | None:
        target = self.first_chunk_frames if self._emitted_frames == 0 else self.chunk_frames
        start = self._emitted_frames
        if self._closed:
            end = min(start + target, self._received_frames)
            if end <= start:
                return None
        else:
            end = start + target
            if end + self.right_context_frames > self._received_frames:
                return None
        first = max(0, start - self.left_context_frames)
        last = min(self._received_frames, end + self.right_context_frames)
        offset = self._buffer_start_frame
        window = DecoderWindow(self._buffer[:, first - offset : last - offset].copy(), start - first, last - end)
        self._emitted_frames = end
        keep_from = max(0, end - self.left_context_frames)
        if keep_from > offset:
            self._buffer = self._buffer[:, keep_from - offset :]
            self._buffer_start_frame = keep_from
        return window
