"""``TranscriptionTap``: a ``/v1/audio/transcriptions`` exchange recorded as one turn (the uploaded audio and its
transcript, from every answer format); ``TurnTranscriptTap``: a chat's spoken question transcribed into that chat's
turn."""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

from omnipipe.gateway.recording.recorder import SessionRecorder
from omnipipe.gateway.recording.taps.base import HttpTap, clipped, error_fields, never_raises

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


class TranscriptionTap(HttpTap):
    """``POST /v1/audio/transcriptions``: the uploaded audio and its transcript, from every format the worker gives
    (json, text, verbose_json, srt, vtt, or the ``transcript.text.delta``/``.done`` stream): the transcript's text is
    the turn's ``assistant_text``."""

    def __init__(self, recorder: SessionRecorder) -> None:
        super().__init__(recorder)
        self._format: str | None = None
        self._deltas: list[str] = []
        self._done_text: str | None = None
        self._streamed = False

    @never_raises
    def on_request(self, audio_bytes: bytes, filename: str, response_format: str | None = None) -> None:
        """Open a turn with the uploaded file (saved as WAV, or as it came if it does not decode); ``response_format``
        is the form's field (``None``: not given, or the form could not be read)."""
        self._format = response_format if isinstance(response_format, str) else None
        self._open_turn()
        self.recorder.event("transcription.request", filename=clipped(filename), size_bytes=len(audio_bytes))
        if audio_bytes:
            extension = PurePosixPath(filename or "").suffix.lstrip(".") or "bin"
            self.recorder.user_audio_encoded(audio_bytes, extension, t_start=self._response_started_at)

    @never_raises
    def on_response_body(self, body: bytes) -> None:
        """The whole answer (not streamed), in the request's ``response_format``."""
        self._transcript(transcript_text(body, self._format))

    @never_raises
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

    @never_raises
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

    @never_raises
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

    @never_raises
    def on_request(self, audio_bytes: bytes, filename: str, response_format: str | None = None) -> None:
        """The audio is the chat turn's own: not saved again."""
        self._format = response_format if isinstance(response_format, str) else None

    @never_raises
    def on_error(self, status: int, message: str) -> None:
        self.recorder.event("transcript.error", status=status, message=clipped(message))

    def _first_text(self) -> None:
        """The chat turn's latency is its answer's."""

    def _record_error(self, error: Any, status: int | None = None) -> None:
        fields = error_fields(error)
        self.recorder.event("transcript.error", status=status, message=clipped(str(fields.get("message") or "")))

    def _transcript(self, text: str) -> None:
        if self._turn_index >= 1 and isinstance(text, str) and text.strip():
            self.recorder.user_transcript(self._turn_index, text.strip())

    @never_raises
    def end(self, status: str = "completed") -> None:
        """The chat's turn is the chat request's to close; a streamed transcript is stored now."""
        self._flush_stream()
