"""What a proxied HTTP exchange feeds its session's recording: the tap for its endpoint, the uploaded form of a
transcription, and a sink that hands each chunk of the worker's answer to the tap (SSE payloads, speech bytes, a
whole JSON body, or an error). Recording never breaks serving: a tap that fails is logged and the bytes still flow.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol

from fastapi import Request
from starlette.datastructures import Headers
from starlette.formparsers import MultiPartException, MultiPartParser

from omnipipe.gateway.recording.taps import ChatTap, HttpTap, SpeechTap, TranscriptionTap, TurnTranscriptTap

if TYPE_CHECKING:
    from omnipipe.gateway.live_sessions import LiveSession

logger = logging.getLogger(__name__)

MAX_RECORDED_JSON = 64 << 20
"""A whole JSON answer larger than this is passed on but not recorded."""

Sink = Callable[[bytes | None], None]
"""Takes each chunk of the worker's body for the recording; ``None``: the body ended."""


class RecordedExchange(Protocol):
    """What recording reads and sets of a proxied exchange (``http.Exchange``)."""

    request_type: str
    session_id: str
    session: LiveSession | None
    transcript_for: LiveSession | None  # a chat session whose spoken question this transcribes
    tap: HttpTap | None
    error: str | None


class _SseSplitter:
    """Feeds the ``data:`` payloads of an SSE byte stream to ``on_data``."""

    def __init__(self, on_data: Callable[[str], None]) -> None:
        self._buffer = b""
        self._on_data = on_data

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk.replace(b"\r\n", b"\n")
        while b"\n\n" in self._buffer:
            event, self._buffer = self._buffer.split(b"\n\n", 1)
            data = [line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")]
            if data:
                self._on_data(b"\n".join(data).decode("utf-8", "replace"))


def make_tap(exchange: RecordedExchange, parsed: object) -> None:
    """Give ``exchange`` the tap of its endpoint (none when its session is not recorded) and hand it the request."""
    chat = exchange.transcript_for
    if chat is not None:
        if chat.recorder is not None:
            exchange.tap = TurnTranscriptTap(chat.recorder)
        return
    session = exchange.session
    if session is None or session.recorder is None:
        return
    recorder = session.recorder
    try:
        if exchange.request_type in ("chat", "speech"):
            tap = ChatTap(recorder) if exchange.request_type == "chat" else SpeechTap(recorder)
            exchange.tap = tap
            tap.on_request(parsed if isinstance(parsed, dict) else {})
        else:
            exchange.tap = TranscriptionTap(recorder)
    except Exception:  # noqa: BLE001 - recording never breaks serving
        logger.exception("recording the request of session %s failed", exchange.session_id)


async def record_upload(exchange: RecordedExchange, request: Request, body: bytes) -> None:
    """A transcription's uploaded file and its ``response_format``, read from the multipart ``body``."""
    if not isinstance(exchange.tap, TranscriptionTap):
        return
    audio, filename, fields = await _multipart_form(request.headers, body, "file")
    if audio is not None:
        exchange.tap.on_request(audio, filename or "audio", fields.get("response_format", "json"))


def recording_sink(exchange: RecordedExchange, status: int, content_type: str, is_sse: bool) -> Sink:
    """What to do with each chunk of the worker's body for the recording (``None``: the body ended)."""
    tap = exchange.tap
    if tap is None:
        return lambda chunk: None

    def safely(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - recording never breaks serving
            logger.exception("recording session %s failed", exchange.session_id)

    if status >= 400:
        return _error_sink(exchange, status, safely)
    if isinstance(tap, (ChatTap, TranscriptionTap)) and is_sse:
        sse_tap = tap
        splitter = _SseSplitter(lambda data: safely(lambda: sse_tap.on_sse_data(data)))
        return lambda chunk: splitter.feed(chunk) if chunk is not None else None
    if isinstance(tap, SpeechTap):
        speech_tap = tap
        return lambda chunk: safely(lambda: speech_tap.on_audio_bytes(chunk, content_type)) if chunk else None
    return _json_sink(exchange, safely)


def _error_sink(exchange: RecordedExchange, status: int, safely: Callable[[Callable[[], None]], None]) -> Sink:
    """An error answer: its message (the OpenAI error's, else the body's text) is the exchange's error."""
    buffered: list[bytes] = []

    def on_error(chunk: bytes | None) -> None:
        if chunk is not None:
            buffered.append(chunk)
            return
        text = b"".join(buffered).decode("utf-8", "replace")
        with contextlib.suppress(ValueError, KeyError, TypeError):
            text = json.loads(text)["error"]["message"]
        exchange.error = str(text)[:500]
        tap = exchange.tap
        if tap is not None:
            safely(lambda: tap.on_error(status, str(text)))

    return on_error


def _json_sink(exchange: RecordedExchange, safely: Callable[[Callable[[], None]], None]) -> Sink:
    """A whole answer (up to ``MAX_RECORDED_JSON``), handed to the tap once it has all come."""
    buffered: list[bytes] = []
    size = [0]

    def on_json(chunk: bytes | None) -> None:
        if chunk is not None:
            size[0] += len(chunk)
            if size[0] <= MAX_RECORDED_JSON:
                buffered.append(chunk)
            return
        if size[0] > MAX_RECORDED_JSON:
            return
        raw = b"".join(buffered)
        tap = exchange.tap
        if isinstance(tap, ChatTap):
            try:
                body = json.loads(raw)
            except ValueError:
                return
            if isinstance(body, dict):
                safely(lambda: tap.on_json_response(body))
        elif isinstance(tap, TranscriptionTap):
            safely(lambda: tap.on_response_body(raw))

    return on_json


async def _multipart_form(headers: Headers, body: bytes,
                          field: str) -> tuple[bytes | None, str | None, dict[str, str]]:
    """The bytes and file name of the multipart form field ``field`` in ``body``, and the form's text fields."""

    async def stream() -> AsyncIterator[bytes]:
        yield body

    try:
        form = await MultiPartParser(headers, stream(), max_files=4, max_fields=64).parse()
    except (MultiPartException, ValueError, KeyError):
        return None, None, {}
    try:
        fields = {name: value for name, value in form.multi_items() if isinstance(value, str)}
        upload = form.get(field)
        if upload is None or isinstance(upload, str):
            return None, None, fields
        return await upload.read(), upload.filename, fields
    finally:
        await form.close()
