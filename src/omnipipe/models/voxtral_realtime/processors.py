"""Voxtral Realtime's prompt processor, run in the engine: the caller's one clip loaded once to a 16 kHz float
array, or one live stream (``[{"stream": id}]``, appended to with ``AsyncOmni.append_audio`` before and while the
session runs; passed on as ``{"stream": id}``, not taken from the engine, since the user goes on speaking into it:
dropping it ends the transcript)."""

from __future__ import annotations

from typing import Any

from omnipipe.config.pipeline_spec import EntryInput
from omnipipe.stage.streaming_audio import checked_stream_audio
from omnipipe.util.field_error import FieldError


def transcription_prompt(prompt: dict[str, Any]) -> EntryInput:
    """One clip to transcribe, or one live stream."""
    from omnipipe.util.media import load_audio

    where = "prompt.multi_modal_data.audio"
    value = (prompt.get("multi_modal_data") or {}).get("audio")
    clips = [] if value is None else value if isinstance(value, list) else [value]  # a tuple: (samples, rate)
    if len(clips) != 1:
        raise FieldError(where, f"a transcription takes one clip or one live stream, got {len(clips)}")
    streamed = checked_stream_audio(clips, where)
    if streamed:
        return EntryInput("transcriber", {"stream": streamed[0]["stream"]})
    return EntryInput("transcriber", {"audio": load_audio(clips[0], where)})  # the one clip: named as the field
