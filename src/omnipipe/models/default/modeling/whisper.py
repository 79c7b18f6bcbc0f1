"""Speech recognition with the packaged whisper tiny.en (faster-whisper, CTranslate2)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omnipipe.models.default.weights.voice import ModelPreparationError, whisper_model_dir
from omnipipe.util.audio import load_audio

logger = logging.getLogger(__name__)

WHISPER_SAMPLE_RATE_HZ = 16_000


class WhisperASR:
    """English transcription with greedy decoding (beam 1), on CPU."""

    def __init__(
        self,
        model_dir: str | Path | None = None,
        num_threads: int = 1,
        compute_type: str = "int8",
        language: str = "en",
        device: str = "cpu",
    ) -> None:
        try:
            from faster_whisper import WhisperModel
        except ImportError as exc:
            raise ModelPreparationError("WhisperASR needs faster-whisper: pip install faster-whisper") from exc
        directory = Path(model_dir) if model_dir is not None else whisper_model_dir()
        if not (directory / "model.bin").is_file():
            raise ModelPreparationError(f"no CTranslate2 whisper model (model.bin) in {directory}")
        started_s = time.perf_counter()
        self.model_dir = directory
        self.language = language
        self._model = WhisperModel(
            str(directory),
            device="cuda" if device.startswith("cuda") else "cpu",
            device_index=int(device.partition(":")[2] or 0),
            compute_type=compute_type,
            cpu_threads=max(1, int(num_threads)),
            local_files_only=True,
        )
        # One model instance decodes one request at a time.
        self._lock = threading.Lock()
        logger.info("loaded whisper from %s in %.2f s", directory, time.perf_counter() - started_s)

    def transcribe(self, audio: np.ndarray, sample_rate_hz: int) -> str:
        """Text of mono ``audio`` (any rate; resampled to 16 kHz). Empty audio gives ``""``."""
        started_s = time.perf_counter()
        decoding = self.start(audio, sample_rate_hz)
        texts = []
        while (segment := decoding.next_segment()) is not None:
            texts.append(segment.text.strip())
        logger.debug("whisper: %.2f s of audio in %.2f s", decoding.duration_s, time.perf_counter() - started_s)
        return " ".join(t for t in texts if t)

    def start(self, audio: np.ndarray, sample_rate_hz: int, options: DecodeOptions | None = None) -> Decoding:
        """Begin decoding mono ``audio`` (any rate; resampled to 16 kHz): segments come one at a time from the
        returned :class:`Decoding`, each decoded when asked for (a 30 s window at a time)."""
        options = options or DecodeOptions()
        samples, _ = load_audio(np.asarray(audio), WHISPER_SAMPLE_RATE_HZ, source_rate_hz=sample_rate_hz)
        duration_s = samples.size / WHISPER_SAMPLE_RATE_HZ
        if samples.size == 0:
            return Decoding(self._lock, iter(()), self.language, 0.0)
        with self._lock:
            segments, info = self._model.transcribe(
                samples,
                language=self.language,
                beam_size=1,
                best_of=1,
                temperature=float(options.temperature),
                initial_prompt=options.initial_prompt or None,
                condition_on_previous_text=False,
                word_timestamps=options.word_timestamps,
                vad_filter=False,
            )
        return Decoding(self._lock, segments, info.language or self.language, float(info.duration or duration_s))


@dataclass(frozen=True)
class DecodeOptions:
    word_timestamps: bool = False  # each segment's words with their start and end
    initial_prompt: str = ""  # text the decoding continues from
    temperature: float = 0.0  # 0: greedy


@dataclass(frozen=True)
class TranscriptWord:
    word: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class TranscriptSegment:
    """One decoded segment, with whisper's own scores (the fields OpenAI's ``verbose_json`` returns)."""

    id: int
    seek: int
    start_s: float
    end_s: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[TranscriptWord] | None


class Decoding:
    """One clip being decoded: its language and duration at once, its segments one per :meth:`next_segment`."""

    def __init__(self, lock: threading.Lock, segments: Iterator[Any], language: str, duration_s: float) -> None:
        self._lock = lock
        self._segments = segments
        self.language = language
        self.duration_s = duration_s
        self._count = 0  # OpenAI numbers segments from 0 (faster-whisper from 1)

    def next_segment(self) -> TranscriptSegment | None:
        """The next segment (decoding the next window when the current one is used up); None after the last."""
        with self._lock:
            segment = next(self._segments, None)
        if segment is None:
            return None
        self._count += 1
        words = None if segment.words is None else [
            TranscriptWord(w.word.strip(), round(float(w.start), 3), round(float(w.end), 3)) for w in segment.words]
        return TranscriptSegment(
            id=self._count - 1, seek=int(segment.seek), start_s=round(float(segment.start), 3),
            end_s=round(float(segment.end), 3), text=segment.text, tokens=[int(t) for t in segment.tokens],
            temperature=float(segment.temperature or 0.0), avg_logprob=float(segment.avg_logprob),
            compression_ratio=float(segment.compression_ratio), no_speech_prob=float(segment.no_speech_prob),
            words=words)
