"""Voxtral's prompt processors, run in the engine: the caller's audio loaded once to 16 kHz float arrays, beside
the question's text and the earlier turns (``prompt``), or a clip alone marked for transcription
(``transcription_prompt``)."""

from __future__ import annotations

from typing import Any

from omnipipe.config.pipeline_spec import EntryInput
from omnipipe.models.voxtral.prompting import TRANSCRIBE_TASK
from omnipipe.util.field_error import FieldError

MAX_CLIPS = 8  # audio clips in one prompt
AUDIO_FIELD = "prompt.multi_modal_data.audio"


def _clips(mm: dict[str, Any]) -> list[Any]:
    value = mm.get("audio")
    if value is None:
        return []
    clips = value if isinstance(value, list) else [value]  # a tuple is one clip: (samples, sample_rate)
    if not 1 <= len(clips) <= MAX_CLIPS:
        raise FieldError(AUDIO_FIELD, f"give 1 to {MAX_CLIPS} clips, got {len(clips)}")
    return clips


def _audios(mm: dict[str, Any]) -> list[Any]:
    from omnipipe.util.media import load_audio

    return [load_audio(clip, f"{AUDIO_FIELD}[{i}]") for i, clip in enumerate(_clips(mm))]


def prompt(prompt: dict[str, Any]) -> EntryInput:
    """A chat turn: the question's text, its clips and the conversation before it."""
    item = {"text": prompt.get("prompt", ""), "history": prompt.get("history", []),
            "audios": _audios(prompt.get("multi_modal_data") or {})}
    return EntryInput("thinker", item)


def transcription_prompt(prompt: dict[str, Any]) -> EntryInput:
    """One clip to transcribe (Voxtral's transcription prompt, the language left to the model)."""
    from omnipipe.util.media import load_audio

    clips = _clips(prompt.get("multi_modal_data") or {})
    if len(clips) != 1:
        raise FieldError(AUDIO_FIELD, f"a transcription takes one clip, got {len(clips)}")
    # named as the one clip it is (the transcription endpoint's ``file``), not as the first of several
    return EntryInput("thinker", {"audios": [load_audio(clips[0], AUDIO_FIELD)], "task": TRANSCRIBE_TASK})
