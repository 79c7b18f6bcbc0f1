"""Prepare and check every weight the default family needs (thinker, voice, whisper)."""

from __future__ import annotations

from omnipipe.models.default.weights.thinker import prepare_thinker, thinker_ready
from omnipipe.models.default.weights.voice import prepare_voice, voice_ready, whisper_model_dir
from omnipipe.models.preparation import ModelPreparationError


def prepare_all(progress: bool = True) -> None:
    prepare_thinker(progress=progress)
    prepare_voice(progress=progress)
    whisper_model_dir()


def status() -> tuple[bool, str]:
    missing = []
    if not thinker_ready():
        missing.append("thinker (Gemma 3 270M: run `omnipipe download`)")
    if not voice_ready():
        missing.append("voice (Piper joe: run `omnipipe download`)")
    try:
        whisper_model_dir()
    except ModelPreparationError as exc:
        missing.append(str(exc))
    return not missing, "; ".join(missing)
