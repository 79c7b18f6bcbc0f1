"""``SpeechTap``: a ``/v1/audio/speech`` exchange recorded as one turn: the text read aloud and the audio answer,
whole or as ``speech.audio.delta`` events."""

from __future__ import annotations

import json
import logging
from typing import Any

from omnipipe.gateway.recording.recorder import SessionRecorder
from omnipipe.gateway.recording.taps.base import (
    MAX_BUFFERED_AUDIO_BYTES,
    HttpTap,
    b64decode,
    clipped,
    media_type,
    never_raises,
    pcm16,
)
from omnipipe.protocol.audio import PCM16_MEDIA_TYPE, PCM16_RATE_HZ

logger = logging.getLogger(__name__)

SPEECH_FORMATS_BY_MEDIA_TYPE = {"audio/wav": "wav", "audio/x-wav": "wav", PCM16_MEDIA_TYPE: "pcm",
                                "audio/flac": "flac", "audio/mpeg": "mp3", "audio/ogg": "opus"}
"""``response_format`` of a ``/v1/audio/speech`` answer by its media type."""


class SpeechTap(HttpTap):
    """``POST /v1/audio/speech``: the text read aloud and the audio bytes of the answer."""

    def __init__(self, recorder: SessionRecorder) -> None:
        super().__init__(recorder)
        self._format = "wav"
        self._body = bytearray()
        self._content_type = ""
        self._first_byte_at = 0.0
        self._overflow_logged = False

    @never_raises
    def on_request(self, body: dict[str, Any]) -> None:
        """Open a turn: ``input`` is the user's text; voice, format and speed go to the timeline. The body is read
        as it came (not with ``SpeechRequest``): what a refused request asked is recorded too."""
        self._open_turn()
        self._body.clear()
        self._overflow_logged = False
        self._format = str(body.get("response_format") or "wav")
        if isinstance(body.get("input"), str):
            self.recorder.user_text(body["input"])
        self.recorder.event("speech.request", **{key: clipped(body.get(key)) for key in (
            "model", "voice", "response_format", "speed", "stream_format")})

    @never_raises
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

    @never_raises
    def end(self, status: str = "completed") -> None:
        """Save the answer (pcm and wav as WAV, other formats as they came) and close the turn."""
        if not self._ended:
            self._save_answer()
        super().end(status)

    @never_raises
    def _save_answer(self) -> None:
        body, self._body = bytes(self._body), bytearray()
        answer_type = media_type(self._content_type)
        if answer_type == "text/event-stream":
            body, fmt = self._audio_from_events(body), self._format
        else:
            fmt = SPEECH_FORMATS_BY_MEDIA_TYPE.get(answer_type, self._format)
        if not body:
            return
        if fmt in ("pcm", "pcm16"):
            self.recorder.ai_audio(pcm16(body), PCM16_RATE_HZ, t_start=self._first_byte_at)
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
                pieces.append(b64decode(event.get("audio")))
            elif "error" in event:
                self._record_error(event["error"])
        return b"".join(pieces)
