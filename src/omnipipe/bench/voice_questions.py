"""What ``omnipipe bench voice`` asks and how it checks the answers.

The questions are short factual ones of ``bench quality`` whose answer has a key word ("Paris"). Each is spoken by
the server's tts pipeline (``/v1/audio/speech``, 24 kHz pcm16, made once and cached as ``bench serve``'s spoken
dataset is), or in the second packaged voice (``second_voice.py``: ``--question-voice heart``, cached beside them),
and its trailing quiet is cut, so the clip ends at its last speech sample: the moment the bench times
the turn from. An answer is right when its audio, transcribed by the server's ``/v1/audio/transcriptions``, holds
the key word.

With a thinking pause (``--pause-s``) each question is spoken in two parts, a head ending in a filler and the
rest (``PAUSED``: "What is the capital of, um," ... "Italy?"), joined by that much silence: a person who stops to
think mid-sentence, the case a VAD cuts and an end-of-turn model should wait through.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from omnipipe.bench.quality import QUESTIONS, Question, is_correct
from omnipipe.bench.second_voice import SECOND_VOICE, second_voice_pcm16
from omnipipe.bench.serve_datasets import default_spoken_cache, speak
from omnipipe.protocol.audio import PCM16_RATE_HZ, PCM16_SAMPLE_BYTES
from omnipipe.protocol.worker import TRANSCRIPTION_PATH
from omnipipe.util.audio import encode_audio

_TEXTS = (
    "What is the capital of France?", "What is the largest planet in our solar system?",
    "Who wrote Romeo and Juliet?", "What color is the sky on a clear day?", "What is the capital of Italy?",
    "Which planet is known as the Red Planet?", "What is the capital of Germany?",
    "In which country are the pyramids of Giza?",
)
VOICE_QUESTIONS: tuple[Question, ...] = tuple(next(q for q in QUESTIONS if q.text == text) for text in _TEXTS)
# ``--question-set``: the short set above (its questions have ``PAUSED`` forms), or all of ``bench quality``'s, to
# set what a session hears against what ``bench quality`` is answered when typed
QUESTION_SETS: dict[str, tuple[Question, ...]] = {"voice": VOICE_QUESTIONS, "quality": tuple(QUESTIONS)}
# each question of ``_TEXTS`` as a head ending in a filler and its rest, in the same order
PAUSED: tuple[tuple[str, str], ...] = (
    ("What is the capital of, um,", "France?"), ("What is the largest planet in, um,", "our solar system?"),
    ("Who wrote, um,", "Romeo and Juliet?"), ("What color is the sky on, uh,", "a clear day?"),
    ("What is the capital of, um,", "Italy?"), ("Which planet is known as, uh,", "the Red Planet?"),
    ("What is the capital of, uh,", "Germany?"), ("In which country are, um,", "the pyramids of Giza?"),
)

QUIET_FRAME_S = 0.01
QUIET_DB = -40.0  # a frame this far below the clip's loudest frame is quiet


@dataclass(frozen=True)
class SpokenQuestion:
    question: Question
    pcm16: bytes  # 24 kHz mono, ending at its last speech sample


def cut_trailing_quiet(pcm16: bytes) -> bytes:
    """``pcm16`` up to the end of its last frame louder than ``QUIET_DB`` below the loudest (all of it if silent)."""
    samples = np.frombuffer(pcm16, "<i2").astype(np.float32)
    frame = int(QUIET_FRAME_S * PCM16_RATE_HZ)
    frames = len(samples) // frame
    if frames == 0:
        return pcm16
    rms = np.sqrt(np.mean(samples[:frames * frame].reshape(frames, frame) ** 2, axis=1))
    loud = np.flatnonzero(rms > rms.max() * 10 ** (QUIET_DB / 20))
    if rms.max() == 0 or loud.size == 0:
        return pcm16
    return pcm16[:(int(loud[-1]) + 1) * frame * PCM16_SAMPLE_BYTES]


QUESTION_VOICES = ("server", SECOND_VOICE)  # ``--question-voice``: the server's tts, or the second packaged voice


def spoken_questions(client: httpx.Client, model: str, cache_dir: Path | None = None, pause_s: float = 0.0,
                     questions: tuple[Question, ...] = VOICE_QUESTIONS, voice: str = "server") -> list[SpokenQuestion]:
    """Every question of ``questions`` spoken by the server (RuntimeError when it cannot speak) or, with ``voice``
    ``heart``, by the second packaged voice; with ``pause_s``, each of ``VOICE_QUESTIONS`` as its ``PAUSED`` head,
    that much silence, and the rest."""
    cache = cache_dir or default_spoken_cache()

    def said(text: str) -> bytes:
        if voice == "server":
            return cut_trailing_quiet(speak(client, model, text, cache))
        path = cache / f"{hashlib.sha256(json.dumps([voice, text]).encode()).hexdigest()[:24]}.pcm"
        if not path.is_file():
            cache.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")
            partial.write_bytes(second_voice_pcm16(text))
            partial.replace(path)
        return cut_trailing_quiet(path.read_bytes())

    if not pause_s:
        return [SpokenQuestion(q, said(q.text)) for q in questions]
    silence = bytes(round(pause_s * PCM16_RATE_HZ) * PCM16_SAMPLE_BYTES)
    return [SpokenQuestion(q, said(head) + silence + said(tail))
            for q, (head, tail) in zip(VOICE_QUESTIONS, PAUSED, strict=True)]


def wav(pcm16: bytes) -> bytes:
    return encode_audio(np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768.0, PCM16_RATE_HZ, "wav")


async def transcribe(client: httpx.AsyncClient, model: str, pcm16: bytes) -> str:
    """What the server hears in ``pcm16`` (24 kHz); RuntimeError naming the status when it cannot transcribe."""
    response = await client.post(TRANSCRIPTION_PATH, files={"file": ("answer.wav", wav(pcm16), "audio/wav")},
                                 data={"model": model, "response_format": "json"})
    if response.status_code != 200:
        raise RuntimeError(f"{TRANSCRIPTION_PATH}: HTTP {response.status_code}: {response.text[:200]}")
    return str(response.json().get("text") or "")


def answered_right(question: Question, heard: str) -> bool:
    return is_correct(heard, question.accept)
