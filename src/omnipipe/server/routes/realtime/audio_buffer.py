"""A realtime session's input audio buffer: the pcm16 appended since the last commit or clear (24 kHz, at most the
server's body size), kept as it came (the user item a commit makes holds it) and resampled once, as a stream, to
the 16 kHz every listener of it takes (the speech VAD, the end-of-turn model through it, live transcription), with
when each chunk arrived (where the VAD hears the speech stop is when the user stopped speaking) and where the
speech in it started. It holds no session: the turn controller (``turn.py``) feeds it and asks it."""

from __future__ import annotations

import time

import numpy as np

from omnipipe.protocol.audio import PCM16_RATE_HZ
from omnipipe.server.routes.realtime.events import EventError
from omnipipe.server.vad import MODEL_RATE_HZ

LISTEN_RATE_HZ = MODEL_RATE_HZ  # the rate of the one resampled stream: the VAD's and whisper's


class InputAudioBuffer:
    """The audio appended since the last reset: as it came (24 kHz) and at ``LISTEN_RATE_HZ``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.reset()

    def reset(self) -> None:
        """Empty the buffer (its audio is dropped) and restart the resampler."""
        import soxr

        self.chunks: list[np.ndarray] = []
        self.size_bytes = 0
        self._heard: list[np.ndarray] = []  # the same audio at LISTEN_RATE_HZ
        self._resampler = soxr.ResampleStream(PCM16_RATE_HZ, LISTEN_RATE_HZ, 1, dtype="float32")
        self._arrivals: list[tuple[int, float]] = []  # (samples in the buffer after a chunk, when it arrived)
        self._speech_from_ms: int | None = None  # where the VAD heard the buffer's speech start

    def append(self, samples: np.ndarray, arrived: float) -> np.ndarray:
        """Keep a chunk (24 kHz float32) that ``arrived`` then (perf_counter); the same audio at ``LISTEN_RATE_HZ``
        (what the resampler gives out for it). An EventError naming ``audio`` when the buffer would grow too big."""
        if self.size_bytes + samples.size * 2 > self.max_bytes:
            raise EventError(f"audio: the input audio buffer would exceed {self.max_bytes} bytes; commit or "
                             "clear it", "audio", code="buffer_too_large")
        if samples.size == 0:
            return samples
        self.chunks.append(samples)
        self.size_bytes += samples.size * 2
        self._arrivals.append((self.size_bytes // 2, arrived))
        return self._keep_heard(self._resampler.resample_chunk(samples))

    def _keep_heard(self, heard: np.ndarray) -> np.ndarray:
        heard = np.asarray(heard, dtype=np.float32)
        if heard.size:
            self._heard.append(heard)
        return heard

    def audio(self) -> np.ndarray:
        """The buffer's audio as it came (24 kHz float32)."""
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)

    def speech_started(self, audio_ms: int) -> None:
        """The VAD heard the buffer's speech start at ``audio_ms`` (the first start counts)."""
        if self._speech_from_ms is None:
            self._speech_from_ms = audio_ms

    def flush(self) -> np.ndarray:
        """The resampler's tail at ``LISTEN_RATE_HZ``, kept with the rest (the audio ends here: a commit)."""
        return self._keep_heard(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True))

    def speech(self, flush: bool = False) -> np.ndarray:
        """The buffer's audio at ``LISTEN_RATE_HZ`` from where the speech started; ``flush``: with the resampler's
        tail (the audio ends here: a commit)."""
        if flush:
            self.flush()
        heard = np.concatenate(self._heard) if self._heard else np.zeros(0, np.float32)
        return heard[(self._speech_from_ms or 0) * LISTEN_RATE_HZ // 1000:]

    def buffered_ms(self) -> float:
        return self.size_bytes / 2 * 1000 / PCM16_RATE_HZ

    def arrival_of(self, audio_ms: int) -> float:
        """When the chunk holding the buffer's audio at ``audio_ms`` arrived (now, past the buffer's end)."""
        sample = audio_ms * PCM16_RATE_HZ // 1000
        return next((at for end, at in self._arrivals if end >= sample), time.perf_counter())
