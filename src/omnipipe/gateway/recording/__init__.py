"""Session recording: the on-disk store, the recorder and its background writer, traffic taps, replay and cleanup.

See the "Sessions" section of ``docs/gateway.md`` for the layout of a recorded session.
"""

from omnipipe.gateway.recording.cleanup import CleanupReport, PeriodicCleanup, cleanup_sessions
from omnipipe.gateway.recording.recorder import SessionRecorder
from omnipipe.gateway.recording.replay import merged_replay, write_merged_replay
from omnipipe.gateway.recording.store import (
    SESSION_ID_PATTERN,
    InvalidSessionPath,
    SessionStore,
    SessionSummary,
    validate_session_id,
)
from omnipipe.gateway.recording.taps import ChatTap, RealtimeTap, SpeechTap, TranscriptionTap
from omnipipe.gateway.recording.writer import RecordingWriter

__all__ = [
    "SESSION_ID_PATTERN",
    "ChatTap",
    "CleanupReport",
    "InvalidSessionPath",
    "PeriodicCleanup",
    "RealtimeTap",
    "RecordingWriter",
    "SessionRecorder",
    "SessionStore",
    "SessionSummary",
    "SpeechTap",
    "TranscriptionTap",
    "cleanup_sessions",
    "merged_replay",
    "validate_session_id",
    "write_merged_replay",
]
