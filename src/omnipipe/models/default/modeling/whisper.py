"""Speech recognition with the packaged whisper tiny.en (faster-whisper, CTranslate2)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

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
            device="cpu",
            compute_type=compute_type,
            cpu_threads=max(1, int(num_threads)),
            local_files_only=True,
        )
        # One model instance decodes one request at a time.
        self._lock = threading.Lock()
        logger.info("loaded whisper from %s in %.2f s", directory, time.perf_counter() - started_s)

    def transcribe(self, audio: np.ndarray, sample_rate_hz: int) -> str:
        """Text of mono ``audio`` (any rate; resampled to 16 kHz). Empty audio gives ``""``."""
        samples, _ = load_audio(np.asarray(audio), WHISPER_SAMPLE_RATE_HZ, source_rate_hz=sample_rate_hz)
        if samples.size == 0:
            return ""
        started_s = time.perf_counter()
        with self._lock:
            segments, _info = self._model.transcribe(
                samples,
                language=self.language,
                beam_size=1,
                best_of=1,
                temperature=0.0,
                condition_on_previous_text=False,
                without_timestamps=True,
                vad_filter=False,
            )
            text = " ".join(segment.text.strip() for segment in segments).strip()
        logger.debug(
            "whisper: %.2f s of audio in %.2f s", samples.size / WHISPER_SAMPLE_RATE_HZ, time.perf_counter() - started_s
        )
        return text
