"""Speech recognition with the packaged whisper tiny.en (faster-whisper, CTranslate2).

Two ways to decode a clip: ``start`` runs faster-whisper's own decoding (30 s windows, segments with timestamps),
and ``start_fitted`` decodes a short clip (a realtime session's turn) in one encoder window fitted
to its length, optionally continuing from words already settled (``prefix``). Whisper's encoder costs the same for
any clip in its 30 s window (measured on the 2-core box, 1 thread, int8: 380-430 ms of a ~490 ms pass over a 2 s
question); a window of 10 s costs 53 ms and the whole pass ~100 ms, with the same words on 6 of the 8 spoken
questions of ``bench voice`` (the others: "Rome, O." for "Romeo", "colors this sky" for "color is the sky").
Windows under 10 s made tiny.en repeat the sentence (no timestamps to end it). A window under 20 s hears worse than
the whole clip, the more so the shorter (``omnipipe bench hearing``, 96 spoken questions without a prefix, word
errors / ms a decode on the loaded 2-core box: 10 s 4.0% / 115, 15 s 3.9% / 140, 20 s 3.6% / 178, a 30 s window
3.4% / 362; faster-whisper's own decoding 3.7%): ``FITTED_MIN_WINDOW_S``.

A fitted decode keeps whisper's timestamps (the prompt ends in ``<|0.00|>``, not ``<|notimestamps|>``): without
them tiny.en ends the transcript at a pause in the speech, as if the window held one segment, and drops what
follows ("What is the capital of, um, ... Italy?" heard as "What is the capital of", with or without settled
words); with them it closes a segment at the pause and goes on. Only the words are kept (``omnipipe bench
hearing``, docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omnipipe.models.default.weights.voice import ModelPreparationError, whisper_model_dir
from omnipipe.util.audio import load_audio

logger = logging.getLogger(__name__)

WHISPER_SAMPLE_RATE_HZ = 16_000
WHISPER_WINDOW_S = 30
FRAMES_PER_S = 100  # log-mel frames per second of audio
FITTED_MIN_WINDOW_S = 20
FITTED_WINDOW_STEP_S = 5  # fitted windows come in a few sizes (each size's first encode costs a warm-up)
FITTED_QUIET_S = 1.0  # at least this much silence after the clip in its window (whisper hears where speech ends)
MAX_FITTED_AUDIO_S = WHISPER_WINDOW_S - FITTED_QUIET_S
NO_SPEECH_PROB = 0.6  # a fitted pass (no forced words) this sure the window holds no speech gives ""
_SENTENCE = re.compile(r"[^.?!]+[.?!]*")


def fitted_window_s(duration_s: float) -> int:
    """The encoder window, in seconds, a fitted decode of a ``duration_s`` clip uses."""
    needed = math.ceil((duration_s + FITTED_QUIET_S) / FITTED_WINDOW_STEP_S) * FITTED_WINDOW_STEP_S
    return int(min(WHISPER_WINDOW_S, max(FITTED_MIN_WINDOW_S, needed)))


def without_repeats(text: str) -> str:
    """``text`` with each sentence said again right after itself dropped (a short window's decoding may loop)."""
    kept: list[str] = []
    for sentence in _SENTENCE.findall(text):
        if kept and _words(sentence) == _words(kept[-1]):
            continue
        kept.append(sentence)
    return "".join(kept).strip()


def _words(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


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

    def start_fitted(self, audio: np.ndarray, sample_rate_hz: int, prefix: str = "",
                     temperature: float = 0.0) -> Decoding:
        """Decode a clip of at most ``MAX_FITTED_AUDIO_S`` in one encoder window fitted to its length (see the
        module's docstring), as one segment. ``prefix``: words the transcript starts with (settled by an earlier
        pass over the start of the same speech); the decoding goes on from them. ValueError for a longer clip."""
        samples, _ = load_audio(np.asarray(audio), WHISPER_SAMPLE_RATE_HZ, source_rate_hz=sample_rate_hz)
        duration_s = samples.size / WHISPER_SAMPLE_RATE_HZ
        if duration_s > MAX_FITTED_AUDIO_S:
            raise ValueError(f"a fitted window takes at most {MAX_FITTED_AUDIO_S:g} s of audio, got {duration_s:.1f} s")
        if samples.size == 0:
            return Decoding(self._lock, iter(()), self.language, 0.0)
        segment = self._decode_fitted(samples, prefix.strip(), temperature)
        return Decoding(self._lock, iter([segment] if segment.text else []), self.language, duration_s)

    def _decode_fitted(self, samples: np.ndarray, prefix: str, temperature: float) -> Any:
        import ctranslate2
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import Segment  # the segment faster-whisper's own decoding yields

        duration_s = samples.size / WHISPER_SAMPLE_RATE_HZ
        window_s = fitted_window_s(duration_s)
        padded = np.zeros(window_s * WHISPER_SAMPLE_RATE_HZ, np.float32)
        padded[:samples.size] = samples
        model = self._model
        tokenizer = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe",
                              language=self.language)
        forced = tokenizer.encode(" " + prefix) if prefix else []
        prompt = [*tokenizer.sot_sequence, tokenizer.timestamp_begin, *forced]  # <|0.00|>: segments may close
        with self._lock:
            features = model.feature_extractor(padded)[:, :window_s * FRAMES_PER_S]
            encoded = model.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None])),
                                         to_cpu=False)
            result = model.model.generate(
                encoded, [prompt], beam_size=1, sampling_topk=0 if temperature > 0 else 1,  # 1: greedy
                sampling_temperature=float(temperature) if temperature > 0 else 1.0,
                # speech is 3-4 tokens a second; a segment's two timestamps ~1 more
                max_length=len(prompt) + 10 + int(8 * duration_s),
                return_scores=True, return_no_speech_prob=True, suppress_blank=not forced)[0]
        tokens = [t for t in result.sequences_ids[0] if t < tokenizer.eot]  # the words (timestamps dropped)
        text = without_repeats(tokenizer.decode(tokens))
        if not forced and result.no_speech_prob > NO_SPEECH_PROB:
            text = ""
        raw = text.encode()
        return Segment(id=1, seek=0, start=0.0, end=duration_s, text=" " + text if text else "", tokens=tokens,
                       temperature=float(temperature), avg_logprob=float(result.scores[0]),
                       compression_ratio=len(raw) / max(1, len(zlib.compress(raw))),
                       no_speech_prob=float(result.no_speech_prob), words=None)


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
