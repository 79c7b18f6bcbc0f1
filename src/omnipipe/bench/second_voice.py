"""The second packaged voice the benchmarks speak questions in: ``heart``, the voice bundled in the ``hibari-tts``
package (a woman's, Kokoro-distilled, 24 kHz; Apache-2.0), beside the tts pipeline's Piper voice ``joe`` (a man's).
It is run as that package runs it, in this process, not through a pipeline: only its bundled voice is ever selected
(its others would be downloaded on first use)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

SECOND_VOICE = "heart"


@functools.cache
def _model() -> Any:
    from hibari import Hibari

    return Hibari(voice=SECOND_VOICE, threads=1)


def second_voice_pcm16(text: str, speed: float = 1.0, seed: int | None = 0) -> bytes:
    """``text`` said by the second voice at ``speed``: 24 kHz mono pcm16 (``seed``: its noise fixed, None: drawn)."""
    audio = _model()(text, speed=speed, seed=seed)
    if not audio.size:
        raise RuntimeError(f"the {SECOND_VOICE} voice gave no audio for {text!r}")
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
