"""What every tap shares: the guard that keeps a tap from ever raising, the readers of the values traffic carries
(base64, pcm16, data URLs, error objects) and the bases that time a response's first text and first audio."""

from __future__ import annotations

import base64
import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from pydantic import ValidationError

from omnipipe.gateway.recording.recorder import TURN_STATUSES, SessionRecorder
from omnipipe.protocol.audio import PCM16_DTYPE, PCM16_SAMPLE_BYTES
from omnipipe.util.data_url import DataUrlError, parse_data_url

logger = logging.getLogger(__name__)

MAX_BUFFERED_AUDIO_BYTES = 64 * 1024 * 1024
"""Audio a tap holds in memory at once (uncommitted realtime input, one speech response); more is dropped."""
MAX_RECORDED_CHARS = 2000
"""Longer strings from requests (URLs, instructions, error messages) are cut before they are recorded."""

_Method = TypeVar("_Method", bound=Callable[..., None])


def _reason(exc: Exception) -> str:
    """``exc`` on one line: a pydantic error as ``field: message`` pairs, anything else as its text."""
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
    return str(exc)


def never_raises(method: _Method) -> _Method:
    """Log and swallow any exception of a tap method: recording must not break the proxied session."""

    @functools.wraps(method)
    def guarded(self: Tap, *args: Any, **kwargs: Any) -> None:
        try:
            method(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - odd traffic is left out of the recording, never raised
            logger.warning("session %s: %s.%s could not record its input (%s: %s)", self.recorder.session_id,
                           type(self).__name__, method.__name__, type(exc).__name__, _reason(exc))
            logger.debug("traceback of the recording failure above", exc_info=True)

    return guarded  # type: ignore[return-value]


def b64decode(text: Any) -> bytes:
    if not isinstance(text, str):
        raise TypeError(f"expected base64 text, got {type(text).__name__}")
    return base64.b64decode(text, validate=True)


def inline_data(url: str, field: str) -> tuple[str, bytes] | None:
    """``(media type, bytes)`` of a base64 data URL; ``None`` for any other URL (remote, or a data URL not in base64),
    which a tap records as it came. A base64 data URL whose data does not decode raises."""
    try:
        return parse_data_url(url, field=field)
    except DataUrlError as exc:
        if exc.problem == "form":
            return None
        raise


def pcm16(data: bytes) -> np.ndarray:
    """Little-endian int16 samples (a trailing odd byte is dropped)."""
    return np.frombuffer(data, dtype=PCM16_DTYPE, count=len(data) // PCM16_SAMPLE_BYTES)


def clipped(value: Any) -> Any:
    """``value`` with every string cut to ``MAX_RECORDED_CHARS``."""
    if isinstance(value, str):
        return value if len(value) <= MAX_RECORDED_CHARS else value[:MAX_RECORDED_CHARS] + "..."
    if isinstance(value, dict):
        return {str(k): clipped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clipped(v) for v in value]
    return value


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def known_status(status: str, known: tuple[str, ...], recorder: SessionRecorder) -> str:
    """``status`` if it is one of ``known``, else ``failed`` (logged)."""
    if status in known:
        return status
    logger.warning("session %s: unknown status %r recorded as failed", recorder.session_id, status)
    return "failed"


def error_fields(error: Any) -> dict[str, Any]:
    """``code``/``type``/``message``/``param`` of an OpenAI error object (or its message if it is a string)."""
    if isinstance(error, dict):
        return {key: clipped(error[key]) for key in ("code", "type", "message", "param") if key in error}
    return {"message": clipped(str(error))}


class Tap:
    """Holds the recorder and measures the latency of each response's first text and first audio."""

    def __init__(self, recorder: SessionRecorder) -> None:
        self.recorder = recorder
        self._response_started_at = 0.0
        self._first_text_seen = False
        self._first_audio_seen = False

    def _response_starts(self) -> None:
        self._response_started_at = self.recorder.elapsed()
        self._first_text_seen = self._first_audio_seen = False

    def _ms_since_response_start(self) -> float:
        return round((self.recorder.elapsed() - self._response_started_at) * 1000.0, 1)

    def _answer_text(self, text: Any) -> None:
        if not isinstance(text, str) or not text:
            return
        if not self._first_text_seen:
            self._first_text_seen = True
            self.recorder.metric("ttft_ms", self._ms_since_response_start())
        self.recorder.assistant_text(text)

    def _note_first_audio(self) -> None:
        if not self._first_audio_seen:
            self._first_audio_seen = True
            self.recorder.metric("ttfp_ms", self._ms_since_response_start())


class HttpTap(Tap):
    """One HTTP request and its response are one turn: ``on_request`` opens it, ``end`` closes it."""

    def __init__(self, recorder: SessionRecorder) -> None:
        super().__init__(recorder)
        self._ended = True
        self._error: str | None = None

    def _open_turn(self) -> None:
        self._ended = False
        self._error = None
        self.recorder.begin_turn()
        self._response_starts()

    def _record_error(self, error: Any, status: int | None = None) -> None:
        fields = error_fields(error)
        message = str(fields.get("message") or fields.get("code") or "error")
        self._error = f"HTTP {status}: {message}" if status is not None else message
        self.recorder.event("error", status=status, **fields)

    @never_raises
    def on_error(self, status: int, message: str) -> None:
        """The worker (or the gateway) answered ``status`` with ``message`` instead of a result."""
        self._record_error(message, status)

    @never_raises
    def end(self, status: str = "completed") -> None:
        """Close the turn: ``completed``, ``cancelled`` or ``failed`` (``completed`` after an error is
        ``failed``). The session stays open; the gateway finishes the recorder."""
        if self._ended:
            return
        self._ended = True
        status = known_status(status, TURN_STATUSES, self.recorder)
        if self._error is not None and status == "completed":
            status = "failed"
        self.recorder.end_turn(status, self._error)
