"""``RealtimeTap``: a ``WS /v1/realtime`` session recorded turn by turn from the JSON frames both ends send.

Client frames are told by their ``ClientEvent`` type; the audio of ``input_audio_buffer.append`` is read with the
worker's own schema (``protocol.realtime.InputAudioBufferAppend``), so the recording buffers the audio the worker
buffers. The worker's frames are read by their ``ServerEvent`` names in either dialect (``ga_name``). Camera
frames (``input_video_frame.append``) are kept by the rules of ``user_frames``. A function call the model made
(a completed ``function_call`` output item) is kept in its turn's ``tool_calls``, and the client's
``function_call_output`` for it beside it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from omnipipe.gateway.recording.recorder import SESSION_STATUSES, TURN_STATUSES, SessionRecorder
from omnipipe.gateway.recording.taps.base import (
    MAX_BUFFERED_AUDIO_BYTES,
    Tap,
    b64decode,
    clipped,
    error_fields,
    known_status,
    never_raises,
    pcm16,
)
from omnipipe.gateway.recording.user_frames import FrameTimeline, read_frame
from omnipipe.protocol.audio import PCM16_RATE_HZ, PCM16_SAMPLE_BYTES
from omnipipe.protocol.realtime import (
    COMMIT_EMPTY,
    ClientEvent,
    InputAudioBufferAppend,
    ServerEvent,
    ga_name,
)
from omnipipe.util.field_error import FieldError

logger = logging.getLogger(__name__)


class RealtimeTap(Tap):
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
        self._frame_timeline = FrameTimeline()
        self._frame_limit_logged = False
        self._closed = False

    def _input_turn_index(self) -> int:
        """The turn that input arriving now belongs to (the next one while a barged-in response still runs)."""
        turn = self.recorder.current_turn
        if turn is None or (self._responding and self._next_turn_started_at is not None):
            return self.recorder.next_turn_index if turn is None else turn["index"] + 1
        return turn["index"]

    # ------------------------------------------------------------------ frames
    @never_raises
    def on_client_event(self, text: str) -> None:
        """A JSON text frame from the client."""
        event = json.loads(text)
        if not isinstance(event, dict) or self._closed:
            return
        kind = event.get("type")
        if kind == ClientEvent.INPUT_AUDIO_BUFFER_APPEND:
            self._append(pcm16(b64decode(InputAudioBufferAppend.model_validate(event).audio)))
        elif kind == ClientEvent.INPUT_VIDEO_FRAME_APPEND:
            self._frame(event)
        elif kind == ClientEvent.INPUT_AUDIO_BUFFER_COMMIT:
            self._client_commits_pending += 1
            self._commit()
        elif kind == ClientEvent.INPUT_AUDIO_BUFFER_CLEAR:
            self._clear()
        elif kind == ClientEvent.CONVERSATION_ITEM_CREATE:
            item = event.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                self._call_output(item)
            else:
                self._text_item(item)
        elif kind in (ClientEvent.SESSION_PAUSE, ClientEvent.SESSION_RESUME):
            self._paused = kind == ClientEvent.SESSION_PAUSE
            self.recorder.event(kind)
        elif kind == ClientEvent.SESSION_UPDATE:
            self.recorder.event(kind, session=clipped(event.get("session")))
        elif kind in (ClientEvent.RESPONSE_CREATE, ClientEvent.RESPONSE_CANCEL):
            self.recorder.event(kind)

    @never_raises
    def on_server_event(self, text: str) -> None:
        """A JSON text frame from the worker."""
        event = json.loads(text)
        if not isinstance(event, dict) or self._closed:
            return
        kind = ga_name(event["type"]) if isinstance(event.get("type"), str) else None  # either dialect
        response = event.get("response")
        response = response if isinstance(response, dict) else {}
        if kind in (ServerEvent.RESPONSE_OUTPUT_TEXT_DELTA, ServerEvent.RESPONSE_OUTPUT_AUDIO_TRANSCRIPT_DELTA):
            self._answer_text(event.get("delta"))
        elif kind == ServerEvent.RESPONSE_OUTPUT_AUDIO_DELTA:
            self._answer_audio(pcm16(b64decode(event.get("delta"))))
        elif kind == ServerEvent.RESPONSE_CREATED:
            self._response_created(response.get("id"))
        elif kind == ServerEvent.RESPONSE_OUTPUT_ITEM_DONE:
            self._output_item(event.get("item"))
        elif kind == ServerEvent.RESPONSE_DONE:
            self._response_done(response)
        elif kind == ServerEvent.ERROR:
            error = error_fields(event.get("error"))
            self.recorder.event(kind, **error)
            if error.get("code") == COMMIT_EMPTY and self._client_commits_pending:
                self._client_commits_pending -= 1  # that commit gets no committed event
        elif kind in (ServerEvent.SESSION_PAUSED, ServerEvent.SESSION_RESUMED):
            self._paused = kind == ServerEvent.SESSION_PAUSED
            self.recorder.event(kind)
        elif kind in (ServerEvent.SESSION_CREATED, ServerEvent.SESSION_UPDATED):
            self.recorder.event(kind, session=clipped(event.get("session")))
        elif kind is not None:
            self._input_event(kind, event)

    def _input_event(self, kind: str, event: dict[str, Any]) -> None:
        """A worker's event about the user's input: speech detected, the buffer committed or cleared, a
        transcript of committed audio."""
        if kind == ServerEvent.INPUT_AUDIO_BUFFER_SPEECH_STARTED:
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
        elif kind == ServerEvent.INPUT_AUDIO_BUFFER_SPEECH_STOPPED:
            self.recorder.event(kind)
        elif kind == ServerEvent.INPUT_AUDIO_TRANSCRIPTION_COMPLETED:
            turn_index = self._item_turns.pop(event.get("item_id"), None)
            if turn_index is not None and isinstance(event.get("transcript"), str):
                self.recorder.user_transcript(turn_index, event["transcript"])
        elif kind == ServerEvent.INPUT_AUDIO_TRANSCRIPTION_FAILED:
            self._item_turns.pop(event.get("item_id"), None)
            self.recorder.event(kind, **error_fields(event.get("error")))

    @never_raises
    def close(self, status: str = "completed", error: str | None = None) -> None:
        """The connection ended: close a running response as ``cancelled``, keep input waiting for a turn,
        drop uncommitted audio and finish the recorder with ``status``."""
        if self._closed:
            return
        status = known_status(status, SESSION_STATUSES, self.recorder)
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

    def _frame(self, event: dict[str, Any]) -> None:
        """A camera frame: kept unless paused or one the worker refuses (its ``error`` event is recorded)."""
        if self._paused:
            return  # the worker drops frames appended while paused, unread
        try:
            mime, data = read_frame(event.get("image"))
            t = self._frame_timeline.place(event.get("captured_at_ms"), self.recorder.elapsed())
        except FieldError as exc:
            logger.debug("session %s: camera frame not recorded (%s)", self.recorder.session_id, exc)
            return
        if self.recorder.user_frame(data, mime, t=t, captured_at_ms=event["captured_at_ms"]) is None \
                and not self._frame_limit_logged:
            self._frame_limit_logged = True
            logger.warning("session %s: camera frames beyond the recording's limit not recorded",
                           self.recorder.session_id)

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
        """The text of a ``conversation.item.create`` item. Read by hand: the worker's schema would refuse items
        the recording keeps (e.g. one without a ``role``)."""
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

    def _call_output(self, item: dict[str, Any]) -> None:
        """A ``function_call_output`` item: kept with its call (the worker refuses one for an unknown call)."""
        call_id, output = item.get("call_id"), item.get("output")
        if isinstance(call_id, str) and isinstance(output, str):
            self.recorder.tool_output(clipped(call_id), clipped(output))
            self.recorder.event("function_call_output", call_id=clipped(call_id))

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
        self.recorder.event("response.created", response_id=clipped(response_id))

    def _output_item(self, item: Any) -> None:
        """A response's finished output item: a completed function call is kept in the turn."""
        if not isinstance(item, dict) or item.get("type") != "function_call" or item.get("status") != "completed":
            return
        fields = [item.get(key) for key in ("call_id", "name", "arguments")]
        if all(isinstance(value, str) for value in fields):
            call_id, name, arguments = (clipped(value) for value in fields)
            self.recorder.tool_call(call_id, name, arguments)
            self.recorder.event("function_call", call_id=call_id, name=name)

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
        self.recorder.event("response.done", response_id=clipped(response.get("id")), status=status,
                            status_details=clipped(details))
        self._responding = False
        error = None
        if status == "failed" and isinstance(details, dict):
            error = str(error_fields(details.get("error")).get("code") or "failed")
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
