"""Prepare and check the weights the default family's pipelines need: ``default`` its thinkers, the voice and
whisper; ``tts`` and ``asr`` the voice and whisper."""

from __future__ import annotations

from omnipipe.models.default.pipeline import THINKER
from omnipipe.models.default.weights.thinker import THINKER_MODELS, prepare_thinker, thinker_ready
from omnipipe.models.default.weights.voice import prepare_voice, voice_ready, whisper_model_dir
from omnipipe.models.preparation import ModelPreparationError


def _thinkers() -> list[str]:
    """Every selectable thinker, the default first."""
    default = THINKER.default_options["model"]
    return [default, *(name for name in THINKER_MODELS if name != default)]


def prepare_all(progress: bool = True) -> None:
    """Every selectable thinker (so a deploy file can switch without a conversion at start), the voice, whisper."""
    for model in _thinkers():
        prepare_thinker(model, progress=progress)
    prepare_speech(progress)


def prepare_speech(progress: bool = True) -> None:
    """The voice and whisper (no thinker)."""
    prepare_voice(progress=progress)
    whisper_model_dir()


def status() -> tuple[bool, str]:
    """Whether everything is prepared, and a line naming the thinkers (the default first) and what is missing."""
    thinkers = _thinkers()
    missing = [f"thinker {model} ({THINKER_MODELS[model].title}): run `omnipipe download`"
               for model in thinkers if not thinker_ready(model)]
    named = ", ".join(f"{model}{' (default)' if i == 0 else ''}" for i, model in enumerate(thinkers))
    missing += _speech_missing()
    return not missing, "; ".join([f"thinkers: {named}", *missing])


def speech_status() -> tuple[bool, str]:
    """Whether the voice and whisper are prepared, and what is missing."""
    missing = _speech_missing()
    return not missing, "; ".join(missing)


def _speech_missing() -> list[str]:
    missing = []
    if not voice_ready():
        missing.append("voice (Piper joe: run `omnipipe download`)")
    try:
        whisper_model_dir()
    except ModelPreparationError as exc:
        missing.append(str(exc))
    return missing
