"""Voxtral Realtime's prompt processor, run in the engine: the caller's one clip loaded once to a 16 kHz float
array."""

from __future__ import annotations

from typing import Any

from omnipipe.config.pipeline_spec import EntryInput
from omnipipe.util.field_error import FieldError


def transcription_prompt(prompt: dict[str, Any]) -> EntryInput:
    """One clip to transcribe."""
    from omnipipe.util.media import load_audio

    where = "prompt.multi_modal_data.audio"
    value = (prompt.get("multi_modal_data") or {}).get("audio")
    clips = [] if value is None else value if isinstance(value, list) else [value]  # a tuple: (samples, rate)
    if len(clips) != 1:
        raise FieldError(where, f"a transcription takes one clip, got {len(clips)}")
    return EntryInput("transcriber", {"audio": load_audio(clips[0], f"{where}[0]")})
