"""CSM's prompt processor, run in the engine: the text to say, and the caller's context clips loaded once to 24 kHz
float arrays (their speakers and transcripts come in the backbone's ``SamplingParams.extra["context"]``)."""

from __future__ import annotations

from typing import Any

from omnipipe.config.pipeline_spec import EntryInput
from omnipipe.models.csm.options import MAX_CONTEXT_TURNS
from omnipipe.models.csm.prompting import SAMPLE_RATE_HZ
from omnipipe.util.field_error import FieldError


def _audios(mm: dict[str, Any]) -> list[Any]:
    from omnipipe.util.media import load_audio

    where = "prompt.multi_modal_data.audio"
    value = mm.get("audio")
    if value is None:
        return []
    clips = value if isinstance(value, list) else [value]  # a tuple is one clip: (samples, sample_rate)
    if not 1 <= len(clips) <= MAX_CONTEXT_TURNS:
        raise FieldError(where, f"give 1 to {MAX_CONTEXT_TURNS} context clips, got {len(clips)}")
    return [load_audio(clip, f"{where}[{i}]", SAMPLE_RATE_HZ) for i, clip in enumerate(clips)]


def prompt(prompt: dict[str, Any]) -> EntryInput:
    """The text to say and the clips heard before it."""
    return EntryInput("backbone", {"text": prompt.get("prompt", ""),
                                   "audios": _audios(prompt.get("multi_modal_data") or {})})
