"""What ``omnipipe bench serve`` sends: its datasets.

- ``random``: the built-in questions (``bench/prompts.py``) in a seeded random order, repeated as needed.
- a file: one prompt per line, or JSON lines with a ``prompt`` (or ``text``) field, used in order and repeated.
- ``spoken``: the built-in questions in the same seeded order, each also as speech. The speech is the server's own
  ``/v1/audio/speech`` reading the question (24 kHz pcm16, the ``default`` voice), made once per question and
  model and kept in a cache directory (``$OMNIPIPE_CACHE/bench-spoken`` by default), so later runs send the same
  audio.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from omnipipe.bench.prompts import QUESTIONS
from omnipipe.protocol.audio import PCM16_RATE_HZ, PCM16_SAMPLE_BYTES
from omnipipe.protocol.worker import SPEECH_PATH
from omnipipe.util.audio import encode_audio
from omnipipe.util.cache import cache_root

SPOKEN = "spoken"
SPOKEN_VOICE = "default"


@dataclass(frozen=True)
class BenchPrompt:
    """One request's input: the question's text (the speech endpoint's input; the reference a transcript is
    scored against) and, in the spoken dataset, the question spoken (24 kHz mono pcm16)."""

    text: str
    pcm16: bytes | None = None

    @property
    def audio_s(self) -> float:
        return len(self.pcm16) / PCM16_SAMPLE_BYTES / PCM16_RATE_HZ if self.pcm16 else 0.0

    def wav(self) -> bytes:
        """The spoken question as a WAV file (pcm16 at 24 kHz)."""
        if self.pcm16 is None:
            raise ValueError(f"prompt {self.text!r} has no audio")
        samples = np.frombuffer(self.pcm16, "<i2").astype(np.float32) / 32768.0
        return encode_audio(samples, PCM16_RATE_HZ, "wav")


def load_prompts(dataset: str, num_prompts: int, seed: int) -> list[str]:
    """The texts of ``random`` (and ``spoken``) or of a file; ValueError naming ``--dataset`` when it is wrong."""
    if dataset in ("random", SPOKEN):
        rng = random.Random(seed)
        return [rng.choice(QUESTIONS) for _ in range(num_prompts)]
    path = Path(dataset)
    if not path.is_file():
        raise ValueError(f"--dataset: 'random', 'spoken' or a file, and {dataset!r} is not a file")
    prompts: list[str] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"--dataset: {path}:{number}: invalid JSON: {exc}") from None
            text = record.get("prompt", record.get("text")) if isinstance(record, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"--dataset: {path}:{number}: a JSON line needs a 'prompt' or 'text' string")
            line = text.strip()
        prompts.append(line)
    if not prompts:
        raise ValueError(f"--dataset: {path} has no prompts")
    return [prompts[i % len(prompts)] for i in range(num_prompts)]


def default_spoken_cache() -> Path:
    return cache_root() / "bench-spoken"


def _cache_path(cache_dir: Path, model: str, text: str) -> Path:
    digest = hashlib.sha256(json.dumps([model, SPOKEN_VOICE, text]).encode()).hexdigest()[:24]
    return cache_dir / f"{digest}.pcm"


def speak(client: httpx.Client, model: str, text: str, cache_dir: Path) -> bytes:
    """``text`` read by the server (24 kHz pcm16), from the cache when it was read before; RuntimeError naming
    ``--dataset spoken`` when the server cannot read it."""
    path = _cache_path(cache_dir, model, text)
    if path.is_file() and path.stat().st_size:
        return path.read_bytes()
    body = {"model": model, "input": text, "voice": SPOKEN_VOICE, "response_format": "pcm"}
    try:
        response = client.post(SPEECH_PATH, json=body)
    except httpx.HTTPError as exc:
        raise RuntimeError(f"--dataset spoken: reading {text!r} aloud with {SPEECH_PATH} failed: {exc}") from None
    if response.status_code != 200 or not response.content:
        raise RuntimeError(f"--dataset spoken: the server could not read {text!r} aloud ({SPEECH_PATH}: HTTP "
                           f"{response.status_code}: {response.text[:300]}); the spoken questions are made by a "
                           "server that speaks")
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_bytes(response.content)
    partial.replace(path)
    return response.content


def load_dataset(dataset: str, num_prompts: int, seed: int, client: httpx.Client | None = None,
                 model: str = "", cache_dir: Path | None = None) -> list[BenchPrompt]:
    """``num_prompts`` prompts of ``dataset``; the spoken one needs the server's ``client`` and ``model``."""
    texts = load_prompts(dataset, num_prompts, seed)
    if dataset != SPOKEN:
        return [BenchPrompt(text) for text in texts]
    if client is None:
        raise ValueError("--dataset spoken: needs a server to read the questions aloud")
    cache = cache_dir or default_spoken_cache()
    spoken = {text: speak(client, model, text, cache) for text in dict.fromkeys(texts)}
    return [BenchPrompt(text, spoken[text]) for text in texts]

