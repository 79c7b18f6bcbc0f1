"""The event types of ``WS /v1/realtime`` (a subset of the OpenAI Realtime API, plus pause/resume).

The worker's session (``omnipipe.server.routes.realtime``) dispatches on ``ClientEvent`` and sends
``ServerEvent``; the gateway's recording tap (``omnipipe.gateway.recording.taps.RealtimeTap``) reads the same
frames both ways. Both take the names from here. Audio in these events is ``pcm16`` (``protocol.audio``).
Imports nothing.
"""

from __future__ import annotations


class ClientEvent:
    """``type`` of the events a client sends."""

    SESSION_UPDATE = "session.update"
    SESSION_PAUSE = "session.pause"  # extension
    SESSION_RESUME = "session.resume"  # extension
    INPUT_AUDIO_BUFFER_APPEND = "input_audio_buffer.append"
    INPUT_AUDIO_BUFFER_COMMIT = "input_audio_buffer.commit"
    INPUT_AUDIO_BUFFER_CLEAR = "input_audio_buffer.clear"
    CONVERSATION_ITEM_CREATE = "conversation.item.create"
    RESPONSE_CREATE = "response.create"
    RESPONSE_CANCEL = "response.cancel"


class ServerEvent:
    """``type`` of the events a worker sends."""

    ERROR = "error"
    SESSION_CREATED = "session.created"
    SESSION_UPDATED = "session.updated"
    SESSION_PAUSED = "session.paused"  # extension
    SESSION_RESUMED = "session.resumed"  # extension
    INPUT_AUDIO_BUFFER_COMMITTED = "input_audio_buffer.committed"
    INPUT_AUDIO_BUFFER_CLEARED = "input_audio_buffer.cleared"
    INPUT_AUDIO_BUFFER_SPEECH_STARTED = "input_audio_buffer.speech_started"
    INPUT_AUDIO_BUFFER_SPEECH_STOPPED = "input_audio_buffer.speech_stopped"
    CONVERSATION_ITEM_CREATED = "conversation.item.created"
    INPUT_AUDIO_TRANSCRIPTION_COMPLETED = "conversation.item.input_audio_transcription.completed"
    INPUT_AUDIO_TRANSCRIPTION_FAILED = "conversation.item.input_audio_transcription.failed"
    RESPONSE_CREATED = "response.created"
    RESPONSE_TEXT_DELTA = "response.text.delta"
    RESPONSE_TEXT_DONE = "response.text.done"
    RESPONSE_AUDIO_TRANSCRIPT_DELTA = "response.audio_transcript.delta"
    RESPONSE_AUDIO_TRANSCRIPT_DONE = "response.audio_transcript.done"
    RESPONSE_AUDIO_DELTA = "response.audio.delta"
    RESPONSE_AUDIO_DONE = "response.audio.done"
    RESPONSE_DONE = "response.done"


COMMIT_EMPTY = "input_audio_buffer_commit_empty"
"""``error`` code of a commit of an empty input buffer: that commit gets no ``input_audio_buffer.committed``."""
PAUSE_TIMEOUT = "pause_timeout"
"""``error`` code (and close reason) of a session paused past the worker's pause timeout."""
