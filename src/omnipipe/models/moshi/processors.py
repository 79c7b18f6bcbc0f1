"""Moshi's prompt processor, run in the engine: a session hears one audio source, a live stream (``[{"stream":
id}]``, appended to with ``AsyncOmni.append_audio`` before and while the session runs) or a clip loaded once to a
16 kHz float array (heard as if it streamed in, then the end). Moshi takes no text.

A live stream goes to the stage as ``{"stream": id}``, not as a prompt's audio item: the session does not take the
stream from the engine when it starts (as a turn's finished clip is taken), since the user goes on speaking into it;
it stays open, its appends counted, until the caller drops it, which ends the session."""

from __future__ import annotations

from typing import Any

from omnipipe.config.pipeline_spec import EntryInput
from omnipipe.stage.streaming_audio import AUDIO_FIELD, checked_stream_audio
from omnipipe.util.field_error import FieldError


def prompt(prompt: dict[str, Any]) -> EntryInput:
    from omnipipe.util.media import load_audio

    if prompt.get("prompt"):
        raise FieldError("prompt.prompt", "Moshi hears the user's audio only: give no text")
    audio = (prompt.get("multi_modal_data") or {}).get("audio")
    if audio is None:
        raise FieldError(AUDIO_FIELD, "give the user's audio: a live stream [{'stream': id}] (appended to with "
                         "append_audio) or one clip")
    items = audio if isinstance(audio, list) else [audio]  # a tuple is one clip: (samples, sample_rate)
    if len(items) != 1:
        raise FieldError(AUDIO_FIELD, f"a session hears one audio source, got {len(items)}")
    streamed = checked_stream_audio(items, AUDIO_FIELD)
    if streamed:
        return EntryInput("duplex", {"stream": streamed[0]["stream"]})
    return EntryInput("duplex", {"audio": load_audio(items[0], f"{AUDIO_FIELD}[0]")})
