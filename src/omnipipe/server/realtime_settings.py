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

from omnipipe.protocol.realtime import (
    GA,
    PCM_RATE,
    SEMANTIC_TURN_END_MS,
    BetaSessionConfig,
    NamedFunction,
    ServerVad,
    SessionConfig,
)

VAD_DEFAULTS: dict[str, Any] = ServerVad().model_dump(exclude={"type", "eagerness"})
SEMANTIC_FIELDS = ("type", "eagerness", "create_response", "interrupt_response", "speculative_start")


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
    live_transcription: bool = True  # spoken turns transcribed by the session as they end (where the pipeline can)
    tools: list[dict[str, Any]] = field(default_factory=list)  # {name, description?, parameters?}, checked
    tool_choice: str | dict[str, str] = "auto"  # auto | none | required | {"type": "function", "name"}
    parallel_tool_calls: bool = True
    truncation: Any = "auto"  # accepted and echoed; no effect
    tracing: Any = None  # accepted and echoed; no effect
    include: list[str] | None = None  # accepted and echoed; no effect
    noise_reduction: dict[str, str] | None = None  # accepted and echoed; no effect


@dataclass(frozen=True)
class Change:
    key: str  # a Settings field
    value: Any
    param: str  # the API field it came from


def _given(model: BaseModel | None, name: str) -> bool:
    return model is not None and name in model.model_fields_set


def _vad(value: ServerVad | None, current: dict[str, Any] | None) -> dict[str, Any] | None:
    """The VAD's knobs after an update (``type`` kept only for ``semantic_vad``: its ``eagerness`` sets the longest
    silence window, the one for a turn heard unfinished)."""
    if value is None:
        return None
    given = value.model_dump(include=value.model_fields_set - {"type", "eagerness"})
    base = {key: val for key, val in (current or VAD_DEFAULTS).items() if key not in ("type", "eagerness")}
    kind = value.type if "type" in value.model_fields_set else (current or {}).get("type", "server_vad")
    if kind == "semantic_vad":
        eagerness = value.eagerness if "eagerness" in value.model_fields_set else \
            (current or {}).get("eagerness", "auto")
        base.update(type="semantic_vad", eagerness=eagerness, silence_duration_ms=SEMANTIC_TURN_END_MS[eagerness][1],
                    idle_timeout_ms=None)
    return {**base, **given}


def _tools(tools: list[Any]) -> list[dict[str, Any]]:
    return [tool.model_dump(include={"name", "description", "parameters"}, exclude_none=True) for tool in tools]


def _tool_choice(value: Any) -> str | dict[str, str]:
    if isinstance(value, NamedFunction):
        return {"type": "function", "name": value.name}
    if value in ("auto", "none", "required"):
        return str(value)
    return {"type": "function", "name": str(value)}  # beta: a function's name


def _transcription(value: Any) -> dict[str, Any] | None:
    return None if value is None else {"model": value.model, "language": value.language}


def _voice(value: Any) -> str:
    return value if isinstance(value, str) else value.id


def changes(update: SessionConfig | BetaSessionConfig, current: Settings) -> list[Change]:
    """The settings an update changes: only the fields it gives, at every level."""
    out = _ga_changes(update, current) if isinstance(update, SessionConfig) else _beta_changes(update, current)
    if _given(update, "instructions"):
        out.append(Change("instructions", update.instructions, "session.instructions"))
    if _given(update, "tracing"):
        tracing = update.tracing
        out.append(Change("tracing", tracing.model_dump(exclude_none=True) if isinstance(tracing, BaseModel)
                          else tracing, "session.tracing"))
    if _given(update, "tools"):
        out.append(Change("tools", _tools(update.tools), "session.tools"))
    if _given(update, "tool_choice"):
        out.append(Change("tool_choice", _tool_choice(update.tool_choice), "session.tool_choice"))
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
    if _given(audio_in, "noise_reduction"):
        reduction = audio_in.noise_reduction  # type: ignore[union-attr]
        out.append(Change("noise_reduction", None if reduction is None else reduction.model_dump(),
                          "session.audio.input.noise_reduction"))
    if _given(update, "max_output_tokens"):
        out.append(Change("max_output_tokens", update.max_output_tokens, "session.max_output_tokens"))
    if _given(update, "truncation"):
        truncation = update.truncation
        out.append(Change("truncation", truncation if isinstance(truncation, str)
                          else truncation.model_dump(exclude_none=True), "session.truncation"))
    for key in ("parallel_tool_calls", "include"):
        if _given(update, key):
            out.append(Change(key, getattr(update, key), f"session.{key}"))
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
    if _given(update, "input_audio_noise_reduction"):
        reduction = update.input_audio_noise_reduction
        out.append(Change("noise_reduction", None if reduction is None else reduction.model_dump(),
                          "session.input_audio_noise_reduction"))
    return out


def _detection(settings: Settings) -> dict[str, Any] | None:
    """The VAD as the session shows it: ``server_vad`` with its knobs, or ``semantic_vad`` with OpenAI's."""
    detection = settings.turn_detection
    if detection is None:
        return None
    if detection.get("type") == "semantic_vad":
        return {key: detection[key] for key in SEMANTIC_FIELDS if key in detection}
    return {"type": "server_vad", **detection}


def _wire_tools(settings: Settings) -> list[dict[str, Any]]:
    return [{"type": "function", **tool} for tool in settings.tools]


def _pcm() -> dict[str, Any]:
    return {"type": "audio/pcm", "rate": PCM_RATE}


def session_object(settings: Settings, dialect: str, session_id: str, model: str) -> dict[str, Any]:
    """The session as ``session.created`` / ``session.updated`` show it in ``dialect``."""
    detection = _detection(settings)
    transcription = None if settings.transcription is None else {**settings.transcription, "prompt": None}
    if dialect == GA:
        return {
            "type": "realtime", "object": "realtime.session", "id": session_id, "model": model,
            "output_modalities": ["audio"] if "audio" in settings.modalities else ["text"],
            "instructions": settings.instructions,
            "audio": {
                "input": {"format": _pcm(), "transcription": transcription,
                          "noise_reduction": settings.noise_reduction,
                          "live_transcription": settings.live_transcription,
                          "turn_detection": detection},
                "output": {"format": _pcm(), "voice": settings.voice, "speed": settings.speed},
            },
            "max_output_tokens": settings.max_output_tokens, "tools": _wire_tools(settings),
            "tool_choice": settings.tool_choice, "parallel_tool_calls": settings.parallel_tool_calls,
            "truncation": settings.truncation, "tracing": settings.tracing, "include": settings.include,
            "prompt": None,
        }
    return {
        "object": "realtime.session", "id": session_id, "model": model, "modalities": list(settings.modalities),
        "voice": settings.voice, "speed": settings.speed, "instructions": settings.instructions,
        "input_audio_format": "pcm16", "output_audio_format": "pcm16", "turn_detection": detection,
        "input_audio_transcription": transcription, "max_response_output_tokens": settings.max_output_tokens,
        "temperature": settings.temperature, "tools": _wire_tools(settings),
        "tool_choice": settings.tool_choice if isinstance(settings.tool_choice, str) else settings.tool_choice["name"],
        "input_audio_noise_reduction": settings.noise_reduction, "tracing": settings.tracing,
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


@dataclass
class TranscriptionSettings:
    """A transcription session's settings (GA ``session.type`` ``transcription``): what ``session.update`` sets,
    echoed in ``session.created/updated``. The turns are committed by the client (no turn detection)."""

    model: str  # echoed: the server's pipeline transcribes whatever the client names
    language: str | None = None  # checked against the pipeline's languages, as its ISO 639-1 code
    noise_reduction: dict[str, str] | None = None  # accepted and echoed; no effect
    include: list[str] | None = None  # accepted and echoed; no effect


def transcription_session_object(settings: TranscriptionSettings, session_id: str) -> dict[str, Any]:
    """A transcription session as ``session.created`` / ``session.updated`` show it (GA)."""
    return {
        "type": "transcription", "object": "realtime.transcription_session", "id": session_id,
        "audio": {"input": {"format": _pcm(), "noise_reduction": settings.noise_reduction, "turn_detection": None,
                            "transcription": {"model": settings.model, "language": settings.language,
                                              "prompt": None}}},
        "include": settings.include,
    }
