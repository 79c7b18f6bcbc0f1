"""Taps: the traffic the gateway proxies, turned into ``SessionRecorder`` calls.

The gateway hands a tap what passes through it: raw realtime frames, request bodies, SSE payloads, response
bytes. A tap never raises: input it cannot make sense of is logged and left out of the recording, so recording
can never break the session it records. Latency metrics are ``ttft_ms`` (first text) and ``ttfp_ms`` (first
audio), measured from the start of the response: ``response.created`` on the realtime socket, the call to
``on_request`` for HTTP.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any, TypeVar

import numpy as np

from omnipipe.gateway.recording.recorder import SESSION_STATUSES, TURN_STATUSES, SessionRecorder
from omnipipe.protocol.audio import PCM16_DTYPE, PCM16_MEDIA_TYPE, PCM16_RATE_HZ, PCM16_SAMPLE_BYTES
from omnipipe.protocol.realtime import COMMIT_EMPTY, ClientEvent, ServerEvent, ga_name

logger = logging.getLogger(__name__)

MAX_BUFFERED_AUDIO_BYTES = 64 * 1024 * 1024
"""Audio a tap holds in memory at once (uncommitted realtime input, one speech response); more is dropped."""
MAX_RECORDED_CHARS = 2000
"""Longer strings from requests (URLs, instructions, error messages) are cut before they are recorded."""

SPEECH_FORMATS_BY_MEDIA_TYPE = {"audio/wav": "wav", "audio/x-wav": "wav", PCM16_MEDIA_TYPE: "pcm",
                                "audio/flac": "flac", "audio/mpeg": "mp3", "audio/ogg": "opus"}
"""``response_format`` of a ``/v1/audio/speech`` answer by its media type."""

_Method = TypeVar("_Method", bound=Callable[..., None])


def _never_raises(method: _Method) -> _Method:
    """Log and swallow any exception of a tap method: recording must not break the proxied session."""

    @functools.wraps(method)
    def guarded(self: _Tap, *args: Any, **kwargs: Any) -> None:
        try:
            method(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - odd traffic is left out of the recording, never raised
            logger.warning("session %s: %s.%s could not record its input (%s: %s)", self.recorder.session_id,
                           type(self).__name__, method.__name__, type(exc).__name__, exc)
            logger.debug("traceback of the recording failure above", exc_info=True)

    return guarded  # type: ignore[return-value]


def _b64decode(text: Any) -> bytes:
    if not isinstance(text, str):
        raise TypeError(f"expected base64 text, got {type(text).__name__}")
    return base64.b64decode(text, validate=True)


def _pcm16(data: bytes) -> np.ndarray:
    """Little-endian int16 samples (a trailing odd byte is dropped)."""
    return np.frombuffer(data, dtype=PCM16_DTYPE, count=len(data) // PCM16_SAMPLE_BYTES)


def _clipped(value: Any) -> Any:
    """``value`` with every string cut to ``MAX_RECORDED_CHARS``."""
    if isinstance(value, str):
        return value if len(value) <= MAX_RECORDED_CHARS else value[:MAX_RECORDED_CHARS] + "..."
    if isinstance(value, dict):
        return {str(k): _clipped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clipped(v) for v in value]
    return value


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _known_status(status: str, known: tuple[str, ...], recorder: SessionRecorder) -> str:
    """``status`` if it is one of ``known``, else ``failed`` (logged)."""
    if status in known:
        return status
    logger.warning("session %s: unknown status %r recorded as failed", recorder.session_id, status)
    return "failed"


def _error_fields(error: Any) -> dict[str, Any]:
    """``code``/``type``/``message``/``param`` of an OpenAI error object (or its message if it is a string)."""
    if isinstance(error, dict):
        return {key: _clipped(error[key]) for key in ("code", "type", "message", "param") if key in error}
    return {"message": _clipped(str(error))}


class _Tap:
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


class _HttpTap(_Tap):
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
        fields = _error_fields(error)
        message = str(fields.get("message") or fields.get("code") or "error")
        self._error = f"HTTP {status}: {message}" if status is not None else message
        self.recorder.event("error", status=status, **fields)

    @_never_raises
    def on_error(self, status: int, message: str) -> None:
        """The worker (or the gateway) answered ``status`` with ``message`` instead of a result."""
        self._record_error(message, status)

    @_never_raises
    def end(self, status: str = "completed") -> None:
        """Close the turn: ``completed``, ``cancelled`` or ``failed`` (``completed`` after an error is
        ``failed``). The session stays open; the gateway finishes the recorder."""
        if self._ended:
            return
        self._ended = True
        status = _known_status(status, TURN_STATUSES, self.recorder)
        if self._error is not None and status == "completed":
            status = "failed"
        self.recorder.end_turn(status, self._error)


class ChatTap(_HttpTap):
    """``POST /v1/chat/completions``: the last user message and the answer, streamed (SSE) or whole (JSON): its
    text, its audio and the finished images it drew (previews of an image being drawn are not recorded)."""

    def __init__(self, recorder: SessionRecorder) -> None:
        super().__init__(recorder)
        self._audio_format = "wav"

    @_never_raises
    def on_request(self, body: dict[str, Any]) -> None:
        """Open a turn with the request's last user message: text parts, audio (``input_audio``, ``audio_url``),
        images, videos (an event each)."""
        self._open_turn()
        audio_options = body.get("audio") if isinstance(body.get("audio"), dict) else {}
        self._audio_format = str(audio_options.get("format") or "wav")
        self.recorder.event("chat.request", model=_clipped(body.get("model")), stream=bool(body.get("stream")),
                            modalities=_clipped(body.get("modalities")), audio=_clipped(body.get("audio")))
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        message = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), None)
        if message is None:
            return
        content = message.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        texts: list[str] = []
        for part in parts if isinstance(parts, list) else []:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif part.get("type") == "input_audio":
                self._input_audio(part.get("input_audio"))
            elif part.get("type") == "image_url":
                self._image(part.get("image_url"))
            elif part.get("type") == "audio_url":
                self._audio_url(part.get("audio_url"))
            elif part.get("type") == "video_url":
                self._video_url(part.get("video_url"))
        text = " ".join(t.strip() for t in texts if t.strip())
        if text:
            self.recorder.user_text(text)

    @_never_raises
    def _input_audio(self, audio: Any) -> None:
        if not isinstance(audio, dict):
            raise TypeError("input_audio: expected an object")
        data = _b64decode(audio.get("data"))
        self.recorder.user_audio_encoded(data, str(audio.get("format") or "bin"), t_start=self._response_started_at)

    @_never_raises
    def _image(self, image: Any) -> None:
        url = image.get("url") if isinstance(image, dict) else None
        if not isinstance(url, str):
            raise TypeError("image_url.url: expected a string")
        header, comma, payload = url.partition(",")
        if not (url.startswith("data:") and comma and header.endswith(";base64")):
            self.recorder.event("image_url", url=_clipped(url))
            return
        self.recorder.user_image(_b64decode(payload), header[len("data:"):].split(";", 1)[0])

    @_never_raises
    def _audio_url(self, audio: Any) -> None:
        """An ``audio_url`` part: a base64 data URL is saved like ``input_audio`` (its type names the format);
        another URL is recorded as an event."""
        url = audio.get("url") if isinstance(audio, dict) else None
        if not isinstance(url, str):
            raise TypeError("audio_url.url: expected a string")
        header, comma, payload = url.partition(",")
        if not (url.startswith("data:") and comma and header.endswith(";base64")):
            self.recorder.event("audio_url", url=_clipped(url))
            return
        mime = header[len("data:"):].split(";", 1)[0]
        self.recorder.user_audio_encoded(_b64decode(payload), mime.rpartition("/")[2] or "bin",
                                         t_start=self._response_started_at)

    @_never_raises
    def _video_url(self, video: Any) -> None:
        """A ``video_url`` part: a base64 data URL of a video type the recorder keeps is saved like an image;
        another URL (or a type it does not keep) is recorded as an event."""
        url = video.get("url") if isinstance(video, dict) else None
        if not isinstance(url, str):
            raise TypeError("video_url.url: expected a string")
        header, comma, payload = url.partition(",")
        if not (url.startswith("data:") and comma and header.endswith(";base64")):
            self.recorder.event("video_url", url=_clipped(url))
            return
        mime, data = header[len("data:"):].split(";", 1)[0], _b64decode(payload)
        try:
            self.recorder.user_video(data, mime)
        except ValueError as exc:
            self.recorder.event("video_url", mime=mime, size_bytes=len(data), not_kept=str(exc))

    @_never_raises
    def _answer_image(self, image: Any) -> None:
        """An image of ``message.images`` / ``delta.images``: the finished one (a PNG data URL) is saved; a
        preview (it has the denoising ``step``) is not."""
        if not isinstance(image, dict):
            raise TypeError("images[]: expected an object")
        if image.get("step") is not None:
            return
        url = image.get("image_url").get("url") if isinstance(image.get("image_url"), dict) else None
        if not isinstance(url, str):
            raise TypeError("images[].image_url.url: expected a string")
        header, comma, payload = url.partition(",")
        if not (url.startswith("data:") and comma and header.endswith(";base64")):
            raise ValueError(f"images[].image_url.url: expected a base64 data URL, got {_clipped(url[:80])!r}")
        self.recorder.ai_image(_b64decode(payload), header[len("data:"):].split(";", 1)[0])

    def _answer_images(self, images: Any) -> None:
        for image in images if isinstance(images, list) else []:
            self._answer_image(image)

    @_never_raises
    def on_sse_data(self, data: str) -> None:
        """One ``data:`` payload of a streamed completion: a chunk, an error object or ``[DONE]``."""
        payload = data.strip()
        if not payload or payload == "[DONE]":
            return
        chunk = json.loads(payload)
        if not isinstance(chunk, dict):
            return
        if "error" in chunk:
            self._record_error(chunk["error"])
            return
        if isinstance(chunk.get("usage"), dict):
            self.recorder.metric("usage", chunk["usage"])
        choice = self._first_choice(chunk)
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        audio = delta.get("audio") if isinstance(delta.get("audio"), dict) else {}
        # A spoken answer carries its text both as content and as audio.transcript: record it once.
        text = delta.get("content") if isinstance(delta.get("content"), str) else audio.get("transcript")
        self._answer_text(text)
        if audio.get("data"):
            samples = _pcm16(_b64decode(audio["data"]))
            if samples.size:
                self._note_first_audio()
                self.recorder.ai_audio(samples, PCM16_RATE_HZ)
        self._answer_images(delta.get("images"))
        if choice.get("finish_reason"):
            self.recorder.metric("finish_reason", _clipped(choice["finish_reason"]))

    @_never_raises
    def on_json_response(self, body: dict[str, Any]) -> None:
        """A whole completion: ``message.content``, ``message.audio.data`` (a file in the requested
        ``audio.format``; ``pcm16`` is headerless 24 kHz) and the drawn ``message.images``."""
        if "error" in body:
            self._record_error(body["error"])
            return
        if isinstance(body.get("usage"), dict):
            self.recorder.metric("usage", body["usage"])
        choice = self._first_choice(body)
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        audio = message.get("audio") if isinstance(message.get("audio"), dict) else {}
        text = message.get("content") if isinstance(message.get("content"), str) else audio.get("transcript")
        self._answer_text(text)
        if audio.get("data"):
            data = _b64decode(audio["data"])
            self._note_first_audio()
            if self._audio_format == "pcm16":
                self.recorder.ai_audio(_pcm16(data), PCM16_RATE_HZ)
            else:
                self.recorder.ai_audio_encoded(data, self._audio_format)
        self._answer_images(message.get("images"))
        if choice.get("finish_reason"):
            self.recorder.metric("finish_reason", _clipped(choice["finish_reason"]))

    @staticmethod
    def _first_choice(body: dict[str, Any]) -> dict[str, Any]:
        choices = body.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            return choices[0]
        return {}


class SpeechTap(_HttpTap):
    """``POST /v1/audio/speech``: the text read aloud and the audio bytes of the answer."""

    def __init__(self, recorder: SessionRecorder) -> None:
        super().__init__(recorder)
        self._format = "wav"
        self._body = bytearray()
        self._content_type = ""
        self._first_byte_at = 0.0
        self._overflow_logged = False

    @_never_raises
    def on_request(self, body: dict[str, Any]) -> None:
        """Open a turn: ``input`` is the user's text; voice, format and speed go to the timeline."""
        self._open_turn()
        self._body.clear()
        self._overflow_logged = False
        self._format = str(body.get("response_format") or "wav")
        if isinstance(body.get("input"), str):
            self.recorder.user_text(body["input"])
        self.recorder.event("speech.request", **{key: _clipped(body.get(key)) for key in (
            "model", "voice", "response_format", "speed", "stream_format")})

    @_never_raises
    def on_audio_bytes(self, chunk: bytes, content_type: str) -> None:
        """A piece of the response body (audio, or server-sent events with ``stream_format: sse``)."""
        if self._ended or not chunk:
            return
        if not self._body:
            self._first_byte_at = self.recorder.elapsed()
            self._note_first_audio()
        if len(self._body) + len(chunk) > MAX_BUFFERED_AUDIO_BYTES:
            if not self._overflow_logged:
                self._overflow_logged = True
                logger.warning("session %s: speech answer beyond %d bytes not recorded", self.recorder.session_id,
                               MAX_BUFFERED_AUDIO_BYTES)
            return
        self._body += chunk
        self._content_type = content_type

    @_never_raises
    def end(self, status: str = "completed") -> None:
        """Save the answer (pcm and wav as WAV, other formats as they came) and close the turn."""
        if not self._ended:
            self._save_answer()
        super().end(status)

    @_never_raises
    def _save_answer(self) -> None:
        body, self._body = bytes(self._body), bytearray()
        media_type = _media_type(self._content_type)
        if media_type == "text/event-stream":
            body, fmt = self._audio_from_events(body), self._format
        else:
            fmt = SPEECH_FORMATS_BY_MEDIA_TYPE.get(media_type, self._format)
        if not body:
            return
        if fmt in ("pcm", "pcm16"):
            self.recorder.ai_audio(_pcm16(body), PCM16_RATE_HZ, t_start=self._first_byte_at)
        elif fmt == "wav":
            self.recorder.ai_audio_encoded(body, "wav", t_start=self._first_byte_at)
        else:
            self.recorder.ai_audio_file(body, fmt, t_start=self._first_byte_at)

    def _audio_from_events(self, body: bytes) -> bytes:
        """The audio carried by ``speech.audio.delta`` events; an error event is recorded."""
        pieces: list[bytes] = []
        for line in body.decode("utf-8", "replace").splitlines():
            if not line.startswith("data:"):
                continue
            try:
                event = json.loads(line[len("data:"):])
            except json.JSONDecodeError:
                continue
            if not isinstance(event, dict):
                continue
            if event.get("type") == "speech.audio.delta":
                pieces.append(_b64decode(event.get("audio")))
            elif "error" in event:
                self._record_error(event["error"])
        return b"".join(pieces)


TRANSCRIPT_DELTA = "transcript.text.delta"
TRANSCRIPT_DONE = "transcript.text.done"
"""The events of a streamed transcription (``stream=true``)."""


def _subtitle_text(text: str) -> str:
    """The words of SubRip (``srt``) or WebVTT (``vtt``) subtitles: each cue's text lines (after its timing line), cues
    joined by spaces; numbers, timings, the ``WEBVTT`` header and ``NOTE``/``STYLE``/``REGION`` blocks left out."""
    cues = []
    for block in text.replace("\r\n", "\n").replace("\r", "\n").split("\n\n"):
        lines = [line.strip() for line in block.split("\n") if line.strip()]
        timing = next((i for i, line in enumerate(lines) if "-->" in line), None)
        if timing is None:
            continue  # the header, a note, a style or region block, or nothing
        words = " ".join(lines[timing + 1:])
        if words:
            cues.append(words)
    return " ".join(cues)


def transcript_text(body: bytes, response_format: str | None) -> str:
    """The transcript in a whole (not streamed) ``/v1/audio/transcriptions`` answer of ``response_format``: ``json``
    and ``verbose_json`` carry it as ``text``; ``text`` is the transcript itself; ``srt`` and ``vtt`` are subtitles.
    An unknown format (the form could not be read) is told by the body."""
    raw = body.decode("utf-8", "replace")
    fmt = response_format
    if fmt is None:
        stripped = raw.lstrip()
        if stripped.startswith("{"):
            fmt = "json"
        elif stripped.startswith("WEBVTT"):
            fmt = "vtt"
        elif "-->" in stripped.split("\n\n", 1)[0]:
            fmt = "srt"
        else:
            fmt = "text"
    if fmt in ("json", "verbose_json"):
        try:
            parsed = json.loads(raw)
        except ValueError:
            return ""
        text = parsed.get("text") if isinstance(parsed, dict) else None
        return text.strip() if isinstance(text, str) else ""
    if fmt in ("srt", "vtt"):
        return _subtitle_text(raw)
    return raw.strip()


class TranscriptionTap(_HttpTap):
    """``POST /v1/audio/transcriptions``: the uploaded audio and its transcript, from every format the worker gives
    (json, text, verbose_json, srt, vtt, or the ``transcript.text.delta``/``.done`` stream): the transcript's text is
    the turn's ``assistant_text``."""

    def __init__(self, recorder: SessionRecorder) -> None:
        super().__init__(recorder)
        self._format: str | None = None
        self._deltas: list[str] = []
        self._done_text: str | None = None
        self._streamed = False

    @_never_raises
    def on_request(self, audio_bytes: bytes, filename: str, response_format: str | None = None) -> None:
        """Open a turn with the uploaded file (saved as WAV, or as it came if it does not decode); ``response_format``
        is the form's field (``None``: not given, or the form could not be read)."""
        self._format = response_format if isinstance(response_format, str) else None
        self._open_turn()
        self.recorder.event("transcription.request", filename=_clipped(filename), size_bytes=len(audio_bytes))
        if audio_bytes:
            extension = PurePosixPath(filename or "").suffix.lstrip(".") or "bin"
            self.recorder.user_audio_encoded(audio_bytes, extension, t_start=self._response_started_at)

    @_never_raises
    def on_response_body(self, body: bytes) -> None:
        """The whole answer (not streamed), in the request's ``response_format``."""
        self._transcript(transcript_text(body, self._format))

    @_never_raises
    def on_sse_data(self, data: str) -> None:
        """One event of a streamed answer: a delta (its time is the first text's), the done event with the whole
        text, or an error. The transcript is stored when the stream ends (``end``)."""
        self._streamed = True
        event = json.loads(data)
        if not isinstance(event, dict):
            return
        if "error" in event:
            self._record_error(event["error"])
        elif event.get("type") == TRANSCRIPT_DELTA and isinstance(event.get("delta"), str) and event["delta"]:
            if not self._deltas:
                self._first_text()
            self._deltas.append(event["delta"])
        elif event.get("type") == TRANSCRIPT_DONE and isinstance(event.get("text"), str):
            self._done_text = event["text"]

    @_never_raises
    def on_response_text(self, text: str) -> None:
        """The transcript."""
        self._transcript(text)

    def _first_text(self) -> None:
        if not self._first_text_seen:
            self._first_text_seen = True
            self.recorder.metric("ttft_ms", self._ms_since_response_start())

    def _transcript(self, text: str) -> None:
        self._answer_text(text)

    def _flush_stream(self) -> None:
        """A streamed transcript: the done event's text, else (a stream cut short) the deltas that came."""
        if not self._streamed:
            return
        self._streamed = False
        text = self._done_text if self._done_text is not None else "".join(self._deltas)
        self._transcript(text.strip())

    @_never_raises
    def end(self, status: str = "completed") -> None:
        self._flush_stream()
        super().end(status)


class TurnTranscriptTap(TranscriptionTap):
    """``POST /v1/audio/transcriptions`` of a chat's spoken question (the chat page asks for it beside the answer):
    the transcript becomes the ``user_transcript`` of the chat turn open when the request came (else the last
    one); the audio is already in that turn, so nothing else is recorded."""

    def __init__(self, recorder: SessionRecorder) -> None:
        super().__init__(recorder)
        turn = recorder.current_turn
        self._turn_index = turn["index"] if turn is not None else recorder.next_turn_index - 1

    @_never_raises
    def on_request(self, audio_bytes: bytes, filename: str, response_format: str | None = None) -> None:
        """The audio is the chat turn's own: not saved again."""
        self._format = response_format if isinstance(response_format, str) else None

    @_never_raises
    def on_error(self, status: int, message: str) -> None:
        self.recorder.event("transcript.error", status=status, message=_clipped(message))

    def _first_text(self) -> None:
        """The chat turn's latency is its answer's."""

    def _record_error(self, error: Any, status: int | None = None) -> None:
        fields = _error_fields(error)
        self.recorder.event("transcript.error", status=status, message=_clipped(str(fields.get("message") or "")))

    def _transcript(self, text: str) -> None:
        if self._turn_index >= 1 and isinstance(text, str) and text.strip():
            self.recorder.user_transcript(self._turn_index, text.strip())

    @_never_raises
    def end(self, status: str = "completed") -> None:
        """The chat's turn is the chat request's to close; a streamed transcript is stored now."""
        self._flush_stream()


class RealtimeTap(_Tap):
    """``WS /v1/realtime``: the client's and the worker's JSON frames (see ``server/routes/realtime.py``).

    User audio is appended until a commit (the client's ``input_audio_buffer.commit`` or, with server VAD, the
    worker's ``input_audio_buffer.committed``) and saved as one clip starting at its first append. A turn opens
    with speech (``speech_started``), a text item or a commit, and closes at ``response.done``. Speech that starts
    while a response runs (a barge-in) opens the next turn as soon as that response is done; input committed
    meanwhile goes to that next turn, as the worker does.
    """

    def __init__(self, recorder: SessionRecorder) -> None:
        super().__init__(recorder)
        self._audio: list[np.ndarray] = []
        self._audio_bytes = 0
        self._audio_started_at = 0.0
        self._overflow_logged = False
        self._paused = False
        self._client_commits_pending = 0
        self._responding = False
        self._next_turn_started_at: float | None = None
        self._next_turn_audio: list[tuple[np.ndarray, float]] = []
        self._next_turn_texts: list[str] = []
        self._item_turns: dict[str, int] = {}  # committed audio item -> the turn it belongs to
        self._closed = False

    def _input_turn_index(self) -> int:
        """The turn that input arriving now belongs to (the next one while a barged-in response still runs)."""
        turn = self.recorder.current_turn
        if turn is None or (self._responding and self._next_turn_started_at is not None):
            return self.recorder.next_turn_index if turn is None else turn["index"] + 1
        return turn["index"]

    # ------------------------------------------------------------------ frames
    @_never_raises
    def on_client_event(self, text: str) -> None:
        """A JSON text frame from the client."""
        event = json.loads(text)
        if not isinstance(event, dict) or self._closed:
            return
        kind = event.get("type")
        if kind == ClientEvent.INPUT_AUDIO_BUFFER_APPEND:
            self._append(_pcm16(_b64decode(event.get("audio"))))
        elif kind == ClientEvent.INPUT_AUDIO_BUFFER_COMMIT:
            self._client_commits_pending += 1
            self._commit()
        elif kind == ClientEvent.INPUT_AUDIO_BUFFER_CLEAR:
            self._clear()
        elif kind == ClientEvent.CONVERSATION_ITEM_CREATE:
            self._text_item(event.get("item"))
        elif kind in (ClientEvent.SESSION_PAUSE, ClientEvent.SESSION_RESUME):
            self._paused = kind == ClientEvent.SESSION_PAUSE
            self.recorder.event(kind)
        elif kind == ClientEvent.SESSION_UPDATE:
            self.recorder.event(kind, session=_clipped(event.get("session")))
        elif kind in (ClientEvent.RESPONSE_CREATE, ClientEvent.RESPONSE_CANCEL):
            self.recorder.event(kind)

    @_never_raises
    def on_server_event(self, text: str) -> None:
        """A JSON text frame from the worker."""
        event = json.loads(text)
        if not isinstance(event, dict) or self._closed:
            return
        kind = ga_name(event["type"]) if isinstance(event.get("type"), str) else None  # either dialect
        response = event.get("response") if isinstance(event.get("response"), dict) else {}
        if kind in (ServerEvent.RESPONSE_OUTPUT_TEXT_DELTA, ServerEvent.RESPONSE_OUTPUT_AUDIO_TRANSCRIPT_DELTA):
            self._answer_text(event.get("delta"))
        elif kind == ServerEvent.RESPONSE_OUTPUT_AUDIO_DELTA:
            self._answer_audio(_pcm16(_b64decode(event.get("delta"))))
        elif kind == ServerEvent.INPUT_AUDIO_BUFFER_SPEECH_STARTED:
            self.recorder.event(kind)
            self._speech_started()
        elif kind == ServerEvent.INPUT_AUDIO_BUFFER_COMMITTED:
            self.recorder.event(kind)
            if isinstance(event.get("item_id"), str):
                self._item_turns[event["item_id"]] = self._input_turn_index()
            if self._client_commits_pending:
                self._client_commits_pending -= 1  # the echo of a commit already saved
            else:
                self._commit()
        elif kind == ServerEvent.INPUT_AUDIO_BUFFER_CLEARED:
            self._clear()
        elif kind == ServerEvent.RESPONSE_CREATED:
            self._response_created(response.get("id"))
        elif kind == ServerEvent.RESPONSE_DONE:
            self._response_done(response)
        elif kind == ServerEvent.ERROR:
            error = _error_fields(event.get("error"))
            self.recorder.event(kind, **error)
            if error.get("code") == COMMIT_EMPTY and self._client_commits_pending:
                self._client_commits_pending -= 1  # that commit gets no committed event
        elif kind in (ServerEvent.SESSION_PAUSED, ServerEvent.SESSION_RESUMED):
            self._paused = kind == ServerEvent.SESSION_PAUSED
            self.recorder.event(kind)
        elif kind in (ServerEvent.SESSION_CREATED, ServerEvent.SESSION_UPDATED):
            self.recorder.event(kind, session=_clipped(event.get("session")))
        elif kind == ServerEvent.INPUT_AUDIO_BUFFER_SPEECH_STOPPED:
            self.recorder.event(kind)
        elif kind == ServerEvent.INPUT_AUDIO_TRANSCRIPTION_COMPLETED:
            turn_index = self._item_turns.pop(event.get("item_id"), None)
            if turn_index is not None and isinstance(event.get("transcript"), str):
                self.recorder.user_transcript(turn_index, event["transcript"])
        elif kind == ServerEvent.INPUT_AUDIO_TRANSCRIPTION_FAILED:
            self._item_turns.pop(event.get("item_id"), None)
            self.recorder.event(kind, **_error_fields(event.get("error")))

    @_never_raises
    def close(self, status: str = "completed", error: str | None = None) -> None:
        """The connection ended: close a running response as ``cancelled``, keep input waiting for a turn,
        drop uncommitted audio and finish the recorder with ``status``."""
        if self._closed:
            return
        status = _known_status(status, SESSION_STATUSES, self.recorder)
        if self._responding:
            self._responding = False
            self.recorder.end_turn("cancelled")
            self._open_next_turn()
        if self._audio_bytes:
            duration_s = round(self._audio_bytes / PCM16_SAMPLE_BYTES / PCM16_RATE_HZ, 3)
            self.recorder.event("input_audio_buffer.discarded", duration_s=duration_s)
        self._closed = True
        self.recorder.finish(status, error)

    # ------------------------------------------------------------------ user input
    def _append(self, samples: np.ndarray) -> None:
        if self._paused or not samples.size:
            return  # the worker drops audio appended while paused
        if self._audio_bytes + samples.nbytes > MAX_BUFFERED_AUDIO_BYTES:
            if not self._overflow_logged:
                self._overflow_logged = True
                logger.warning("session %s: uncommitted user audio beyond %d bytes not recorded",
                               self.recorder.session_id, MAX_BUFFERED_AUDIO_BYTES)
            return
        if not self._audio:
            self._audio_started_at = self.recorder.elapsed()
        self._audio.append(samples)
        self._audio_bytes += samples.nbytes

    def _clear(self) -> None:
        self._audio, self._audio_bytes, self._overflow_logged = [], 0, False

    def _commit(self) -> None:
        if not self._audio:
            return
        samples, started_at = np.concatenate(self._audio), self._audio_started_at
        self._clear()
        if self._responding:
            self._next_turn_audio.append((samples, started_at))
        else:
            self.recorder.user_audio(samples, PCM16_RATE_HZ, t_start=started_at)

    def _text_item(self, item: Any) -> None:
        content = item.get("content") if isinstance(item, dict) else None
        texts = [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
                 and part.get("type") in ("input_text", "text")] if isinstance(content, list) else []
        text = " ".join(t.strip() for t in texts if t.strip())
        if not text:
            return
        if self._responding:
            self._next_turn_texts.append(text)
        else:
            self.recorder.user_text(text)

    def _speech_started(self) -> None:
        if self._responding:
            if self._next_turn_started_at is None:
                self._next_turn_started_at = self.recorder.elapsed()
        elif self.recorder.current_turn is None:
            self.recorder.begin_turn()

    # ------------------------------------------------------------------ responses
    def _response_created(self, response_id: Any) -> None:
        if self.recorder.current_turn is None:
            self.recorder.begin_turn()
        self._responding = True
        self._response_starts()
        self.recorder.event("response.created", response_id=_clipped(response_id))

    def _answer_audio(self, samples: np.ndarray) -> None:
        if samples.size:
            self._note_first_audio()
            self.recorder.ai_audio(samples, PCM16_RATE_HZ)

    def _response_done(self, response: dict[str, Any]) -> None:
        status = response.get("status")
        status = status if status in TURN_STATUSES else "failed"
        details = response.get("status_details")
        if isinstance(response.get("usage"), dict):
            self.recorder.metric("usage", response["usage"])
        self.recorder.event("response.done", response_id=_clipped(response.get("id")), status=status,
                            status_details=_clipped(details))
        self._responding = False
        error = None
        if status == "failed" and isinstance(details, dict):
            error = str(_error_fields(details.get("error")).get("code") or "failed")
        self.recorder.end_turn(status, error)
        self._open_next_turn()

    def _open_next_turn(self) -> None:
        """Open the turn that input received during the response belongs to, if there was any."""
        started_at = self._next_turn_started_at
        if started_at is None and not self._next_turn_audio and not self._next_turn_texts:
            return
        if started_at is None:
            started_at = min((t for _, t in self._next_turn_audio), default=self.recorder.elapsed())
        self.recorder.begin_turn(started_at=started_at)
        for samples, audio_started_at in self._next_turn_audio:
            self.recorder.user_audio(samples, PCM16_RATE_HZ, t_start=audio_started_at)
        for text in self._next_turn_texts:
            self.recorder.user_text(text)
        self._next_turn_started_at, self._next_turn_audio, self._next_turn_texts = None, [], []
