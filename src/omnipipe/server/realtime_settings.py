"""A realtime session's settings, read from a ``session.update`` and shown in ``session.created/updated`` in the
connection's dialect (GA or beta, ``omnipipe.protocol.realtime``).

``Settings`` holds one form of both: ``modalities`` is ``["text"]`` or ``["text", "audio"]`` (a spoken answer
always brings its transcript), ``turn_detection`` the server VAD's knobs or ``None``. ``changes`` turns an update
into ``Change``s naming the API field each came from (so the worker's checks name it in the dialect the client
speaks); ``session_object`` renders the settings back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from omnipipe.protocol.realtime import GA, PCM_RATE, BetaSessionConfig, ServerVad, SessionConfig

VAD_DEFAULTS: dict[str, Any] = ServerVad().model_dump(exclude={"type", "idle_timeout_ms"})


@dataclass
class Settings:
    modalities: list[str]
    voice: str = "default"
    speed: float = 1.0
    instructions: str = ""
    turn_detection: dict[str, Any] | None = field(default_factory=lambda: dict(VAD_DEFAULTS))
    max_output_tokens: int | str = "inf"
    temperature: float | None = None
    transcription: dict[str, Any] | None = None  # {model, language}
    live_transcription: bool = True  # spoken turns transcribed while they arrive (where the pipeline can)
    tool_choice: str = "auto"
    truncation: str = "auto"


@dataclass(frozen=True)
class Change:
    key: str  # a Settings field
    value: Any
    param: str  # the API field it came from


def _given(model: BaseModel | None, name: str) -> bool:
    return model is not None and name in model.model_fields_set


def _vad(value: ServerVad | None, current: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    return {**(current or VAD_DEFAULTS),
            **value.model_dump(include=value.model_fields_set - {"type", "idle_timeout_ms"})}


def _transcription(value: Any) -> dict[str, Any] | None:
    return None if value is None else {"model": value.model, "language": value.language}


def _voice(value: Any) -> str:
    return value if isinstance(value, str) else value.id


def changes(update: SessionConfig | BetaSessionConfig, current: Settings) -> list[Change]:
    """The settings an update changes: only the fields it gives, at every level."""
    out = _ga_changes(update, current) if isinstance(update, SessionConfig) else _beta_changes(update, current)
    for key in ("instructions", "tool_choice", "truncation"):
        if _given(update, key):
            out.append(Change(key, getattr(update, key), f"session.{key}"))
    return out


def _ga_changes(update: SessionConfig, current: Settings) -> list[Change]:
    """What a GA update changes, but the fields both dialects share."""
    out: list[Change] = []
    if _given(update, "output_modalities"):
        modalities = ["text", "audio"] if "audio" in update.output_modalities else ["text"]
        out.append(Change("modalities", modalities, "session.output_modalities"))
    audio = update.audio if _given(update, "audio") else None
    audio_in = audio.input if _given(audio, "input") else None
    audio_out = audio.output if _given(audio, "output") else None
    if _given(audio_in, "turn_detection"):
        out.append(Change("turn_detection", _vad(audio_in.turn_detection, current.turn_detection),  # type: ignore[union-attr]
                          "session.audio.input.turn_detection"))
    if _given(audio_in, "transcription"):
        out.append(Change("transcription", _transcription(audio_in.transcription),  # type: ignore[union-attr]
                          "session.audio.input.transcription"))
    if _given(audio_in, "live_transcription"):
        out.append(Change("live_transcription", audio_in.live_transcription,  # type: ignore[union-attr]
                          "session.audio.input.live_transcription"))
    if _given(audio_out, "voice"):
        out.append(Change("voice", _voice(audio_out.voice), "session.audio.output.voice"))  # type: ignore[union-attr]
    if _given(audio_out, "speed"):
        out.append(Change("speed", audio_out.speed, "session.audio.output.speed"))  # type: ignore[union-attr]
    if _given(update, "max_output_tokens"):
        out.append(Change("max_output_tokens", update.max_output_tokens, "session.max_output_tokens"))
    return out


def _beta_changes(update: BetaSessionConfig, current: Settings) -> list[Change]:
    """What a beta update changes, but the fields both dialects share."""
    out: list[Change] = []
    if _given(update, "modalities"):
        modalities = ["text", "audio"] if "audio" in update.modalities else ["text"]
        out.append(Change("modalities", modalities, "session.modalities"))
    if _given(update, "turn_detection"):
        out.append(Change("turn_detection", _vad(update.turn_detection, current.turn_detection),
                          "session.turn_detection"))
    if _given(update, "input_audio_transcription"):
        out.append(Change("transcription", _transcription(update.input_audio_transcription),
                          "session.input_audio_transcription"))
    if _given(update, "voice"):
        out.append(Change("voice", update.voice, "session.voice"))
    if _given(update, "speed"):
        out.append(Change("speed", update.speed, "session.speed"))
    if _given(update, "max_response_output_tokens"):
        out.append(Change("max_output_tokens", update.max_response_output_tokens,
                          "session.max_response_output_tokens"))
    if _given(update, "temperature"):
        out.append(Change("temperature", update.temperature, "session.temperature"))
    return out


def _pcm() -> dict[str, Any]:
    return {"type": "audio/pcm", "rate": PCM_RATE}


def session_object(settings: Settings, dialect: str, session_id: str, model: str) -> dict[str, Any]:
    """The session as ``session.created`` / ``session.updated`` show it in ``dialect``."""
    detection = None if settings.turn_detection is None else {"type": "server_vad", **settings.turn_detection}
    transcription = None if settings.transcription is None else {**settings.transcription, "prompt": None}
    if dialect == GA:
        return {
            "type": "realtime", "object": "realtime.session", "id": session_id, "model": model,
            "output_modalities": ["audio"] if "audio" in settings.modalities else ["text"],
            "instructions": settings.instructions,
            "audio": {
                "input": {"format": _pcm(), "transcription": transcription, "noise_reduction": None,
                          "live_transcription": settings.live_transcription,
                          "turn_detection": None if detection is None else {**detection, "idle_timeout_ms": None}},
                "output": {"format": _pcm(), "voice": settings.voice, "speed": settings.speed},
            },
            "max_output_tokens": settings.max_output_tokens, "tools": [], "tool_choice": settings.tool_choice,
            "truncation": settings.truncation, "tracing": None, "include": None, "prompt": None,
        }
    return {
        "object": "realtime.session", "id": session_id, "model": model, "modalities": list(settings.modalities),
        "voice": settings.voice, "speed": settings.speed, "instructions": settings.instructions,
        "input_audio_format": "pcm16", "output_audio_format": "pcm16", "turn_detection": detection,
        "input_audio_transcription": transcription, "max_response_output_tokens": settings.max_output_tokens,
        "temperature": settings.temperature, "tools": [], "tool_choice": settings.tool_choice,
    }


def output_modalities_field(dialect: str) -> str:
    return "output_modalities" if dialect == GA else "modalities"


def response_object(dialect: str, response_id: str, status: str, modalities: list[str],
                    output: list[dict[str, Any]], details: dict[str, Any] | None = None,
                    usage: dict[str, Any] | None = None, voice: str = "default",
                    max_output_tokens: int | str = "inf") -> dict[str, Any]:
    """A ``realtime.response`` in ``dialect``'s shape."""
    body: dict[str, Any] = {"id": response_id, "object": "realtime.response", "status": status,
                            "status_details": details, "output": output, "usage": usage}
    if dialect == GA:
        body.update(output_modalities=["audio"] if "audio" in modalities else ["text"], conversation_id=None,
                    max_output_tokens=max_output_tokens, metadata=None,
                    audio={"output": {"format": _pcm(), "voice": voice}})
    else:
        body.update(modalities=list(modalities))
    return body


def part_type(dialect: str, spoken: bool) -> str:
    """An assistant content part's type in an item."""
    if dialect == GA:
        return "output_audio" if spoken else "output_text"
    return "audio" if spoken else "text"
