"""Server VAD for the realtime endpoint: Silero VAD (the ONNX model that ships inside faster-whisper).

Audio arrives at 16 kHz (the session's one 16 kHz stream of its input: ``audio_buffer.py``) and is cut into 32 ms
windows of 512 samples, each scored by the model (its LSTM state carried from window to window) with the
probability that it holds speech.
``threshold`` has OpenAI's meaning: a probability in 0..1 (default 0.5; higher needs louder, clearer speech). Speech
starts at the first window at or above it and stops after ``silence_duration_ms`` of windows below
``threshold - 0.15`` (Silero's own hysteresis, so a word's soft ending does not end the turn). Positions are
milliseconds of input audio since the detector was (re)started, i.e. since the start of the current input audio
buffer; ``speech_started`` is moved ``prefix_padding_ms`` earlier, as OpenAI's is.

Between them, two events the server keeps to itself: ``pause_started`` once speech has been quiet for
``pause_ms`` (the turn may be ending: a realtime session starts its answer tentatively) and ``pause_ended`` when
speech comes back before ``silence_duration_ms`` (the user goes on: the tentative answer is dropped).

With a ``TurnEnd`` (``semantic_vad``), how long the quiet must last depends on what was said: once speech has been
quiet for ``check_ms``, the end-of-turn model (``end_of_turn.py``) hears the turn's last 8 s and says how likely it
is complete; the turn then ends after ``complete_ms`` of quiet if it is at least ``threshold``, else after
``unfinished_ms`` (the speaker may be pausing mid-sentence). Speech that comes back first resets it all.

One model session is shared by every connection of the process (the model is stateless; the state is per
detector). A window costs ~0.1 ms of CPU; an end-of-turn judgement ~31 ms, once per pause.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from omnipipe.util.onnx_session import shared_cpu_session

MODEL_RATE_HZ = 16_000  # the rate the detector is fed at
WINDOW = 512  # samples at 16 kHz: 32 ms
CONTEXT = 64  # samples of the previous window the model sees before each window
WINDOW_MS = WINDOW * 1000 // MODEL_RATE_HZ
HYSTERESIS = 0.15
_TURN_WINDOWS = 8 * MODEL_RATE_HZ // WINDOW  # the end-of-turn model hears the last 8 s



def silero_model_path() -> Path:
    """The Silero VAD ONNX file faster-whisper ships."""
    assets = resources.files("faster_whisper") / "assets"
    found = sorted(p for p in assets.iterdir() if p.name.startswith("silero") and p.name.endswith(".onnx"))
    if not found:
        raise RuntimeError("faster-whisper's package holds no silero_vad*.onnx; reinstall faster-whisper")
    return Path(str(found[-1]))


def _model() -> Any:
    return shared_cpu_session(silero_model_path())


@dataclass(frozen=True)
class VadEvent:
    kind: str  # "speech_started" | "speech_stopped" | "pause_started" | "pause_ended"
    # speech_started: audio_start_ms (after prefix padding); speech_stopped and pause_started: where the quiet
    # began; pause_ended: where speech came back
    audio_ms: int


@dataclass(frozen=True)
class TurnEnd:
    """``semantic_vad``'s end of a turn: the model that judges it, when it is asked, and how long the quiet then
    lasts before the turn ends (heard complete, or unfinished)."""

    model: Any  # an EndOfTurnModel: probability(audio at 16 kHz) -> float
    complete_ms: int
    unfinished_ms: int
    check_ms: int = 96
    threshold: float = 0.5


class SileroVAD:
    def __init__(self, threshold: float = 0.5, silence_duration_ms: int = 500, prefix_padding_ms: int = 300,
                 pause_ms: int | None = None, turn_end: TurnEnd | None = None) -> None:
        """``pause_ms``: quiet after which ``pause_started`` is reported (None: never; at least one window and
        less than ``silence_duration_ms``, else no pause is reported). ``turn_end``: the end-of-turn model decides
        how long the quiet must last (``silence_duration_ms`` is then unused)."""
        if not 0 < threshold <= 1:
            raise ValueError("threshold: must be in (0, 1]")
        self.pause_ms = None if pause_ms is None or pause_ms >= silence_duration_ms else max(WINDOW_MS, pause_ms)
        self.threshold = float(threshold)
        self.off_threshold = max(self.threshold - HYSTERESIS, 0.01)
        self.silence_duration_ms = int(silence_duration_ms)
        self.prefix_padding_ms = int(prefix_padding_ms)
        self.turn_end = turn_end
        if turn_end is not None:
            self.silence_duration_ms = turn_end.unfinished_ms
            if pause_ms is not None and pause_ms >= turn_end.complete_ms:
                self.pause_ms = None
        self._session = _model()
        self.reset()

    def reset(self) -> None:
        self._pending = np.zeros(0, dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._h = np.zeros((1, 1, 128), dtype=np.float32)
        self._c = np.zeros((1, 1, 128), dtype=np.float32)
        self._windows = 0  # windows scored since the reset
        self.speaking = False
        self._quiet_ms = 0
        self._heard: deque[np.ndarray] = deque(maxlen=_TURN_WINDOWS)  # the last 8 s, for the end-of-turn model
        self._needed_ms: int | None = None  # the quiet this pause needs, once the end-of-turn model has judged it
        self.last_judgement: float | None = None  # the end-of-turn model's latest probability (for the session)

    def probability(self, window: np.ndarray) -> float:
        """Score one 512-sample 16 kHz window (the detector's state moves on)."""
        chunk = np.concatenate([self._context, window]).reshape(1, -1)
        out, self._h, self._c = self._session.run(None, {"input": chunk, "h": self._h, "c": self._c})
        self._context = window[-CONTEXT:]
        return float(np.asarray(out).reshape(-1)[0])

    def feed(self, samples: np.ndarray) -> list[VadEvent]:
        """Float32 mono samples at 16 kHz (``MODEL_RATE_HZ``) -> the events they cause."""
        audio = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32).reshape(-1)])
        whole = len(audio) // WINDOW
        self._pending = audio[whole * WINDOW:]
        events: list[VadEvent] = []
        for i in range(whole):
            start_ms = self._windows * WINDOW_MS
            self._windows += 1
            window = audio[i * WINDOW:(i + 1) * WINDOW]
            self._heard.append(window)
            p = self.probability(window)
            if p >= self.threshold:
                self._end_quiet(start_ms, events)
                if not self.speaking:
                    self.speaking = True
                    events.append(VadEvent("speech_started", max(0, start_ms - self.prefix_padding_ms)))
            elif self.speaking:
                if p < self.off_threshold:
                    self._quiet_ms += WINDOW_MS
                else:
                    self._end_quiet(start_ms, events)
                quiet_from = start_ms + WINDOW_MS - self._quiet_ms
                if self.pause_ms is not None and self._quiet_ms - WINDOW_MS < self.pause_ms <= self._quiet_ms:
                    events.append(VadEvent("pause_started", quiet_from))
                if self._quiet_ms >= self._quiet_needed_ms():
                    self.speaking = False
                    events.append(VadEvent("speech_stopped", quiet_from))
                    self._quiet_ms = 0
                    self._needed_ms = None
        return events

    def _quiet_needed_ms(self) -> int:
        """How long this pause must last to end the turn (asking the end-of-turn model once it is due)."""
        end = self.turn_end
        if end is None:
            return self.silence_duration_ms
        if self._needed_ms is None:
            if self._quiet_ms < end.check_ms:
                return end.check_ms
            self.last_judgement = end.model.probability(np.concatenate(list(self._heard)))
            self._needed_ms = end.complete_ms if self.last_judgement >= end.threshold else end.unfinished_ms
        return self._needed_ms

    def _end_quiet(self, at_ms: int, events: list[VadEvent]) -> None:
        """Speech (or sound near it) again: a pause reported in the quiet so far has ended."""
        if self.pause_ms is not None and self._quiet_ms >= self.pause_ms:
            events.append(VadEvent("pause_ended", at_ms))
        self._quiet_ms = 0
        self._needed_ms = None
