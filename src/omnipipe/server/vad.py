"""An energy voice-activity detector for the realtime endpoint's ``server_vad`` turn detection.

The audio is cut into 20 ms frames; a frame whose RMS (of float samples in [-1, 1]) reaches ``threshold`` is
speech. Speech starts at the first loud frame and stops after ``silence_duration_ms`` of quiet frames. Positions are
milliseconds since the detector was (re)started, i.e. since the start of the current input audio buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omnipipe.protocol.audio import PCM16_RATE_HZ

FRAME_MS = 20


@dataclass(frozen=True)
class VadEvent:
    kind: str  # "speech_started" | "speech_stopped"
    audio_ms: int  # speech_started: audio_start_ms (after prefix padding); speech_stopped: audio_end_ms


class EnergyVAD:
    def __init__(self, threshold: float, silence_duration_ms: int, prefix_padding_ms: int = 0,
                 sample_rate_hz: int = PCM16_RATE_HZ, frame_ms: int = FRAME_MS) -> None:
        if not threshold > 0:
            raise ValueError("threshold: must be > 0")
        self.threshold = float(threshold)
        self.silence_duration_ms = int(silence_duration_ms)
        self.prefix_padding_ms = int(prefix_padding_ms)
        self.frame_ms = frame_ms
        self.frame_samples = sample_rate_hz * frame_ms // 1000
        self.reset()

    def reset(self) -> None:
        self._pending = np.zeros(0, dtype=np.float32)
        self._frames = 0  # whole frames seen since the reset
        self.speaking = False
        self._quiet_ms = 0

    def feed(self, samples: np.ndarray) -> list[VadEvent]:
        """Float32 mono samples -> the speech_started / speech_stopped events they cause, in order."""
        audio = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32).reshape(-1)])
        whole = len(audio) // self.frame_samples
        self._pending = audio[whole * self.frame_samples:]
        events: list[VadEvent] = []
        if not whole:
            return events
        frames = audio[: whole * self.frame_samples].reshape(whole, self.frame_samples).astype(np.float64)
        rms = np.sqrt(np.mean(frames * frames, axis=1))
        for loud in rms >= self.threshold:
            start_ms = self._frames * self.frame_ms
            self._frames += 1
            if loud:
                self._quiet_ms = 0
                if not self.speaking:
                    self.speaking = True
                    events.append(VadEvent("speech_started", max(0, start_ms - self.prefix_padding_ms)))
            elif self.speaking:
                self._quiet_ms += self.frame_ms
                if self._quiet_ms >= self.silence_duration_ms:
                    self.speaking = False
                    events.append(VadEvent("speech_stopped", start_ms + self.frame_ms - self._quiet_ms))
                    self._quiet_ms = 0
        return events
