"""Sessions the gateway is serving now, each with its recorder (when recording is on).

A chat session outlives one request: later turns that send its id back are added to the same recording, and
the recording is finished once the session has been idle for ``chat_idle_s``. Every other session ends with
its request or WebSocket.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from omnipipe.gateway.recording.recorder import SessionRecorder
from omnipipe.gateway.recording.store import SessionStore
from omnipipe.gateway.recording.writer import RecordingWriter

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class LiveSession:
    session_id: str
    type: str
    worker: str | None
    client: str | None
    recorder: SessionRecorder | None
    started_at: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)
    requests_in_flight: int = 0

    def summary(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "type": self.type, "worker": self.worker,
                "started_at": self.started_at, "client": self.client, "recording": self.recorder is not None,
                "in_flight": self.requests_in_flight}


class LiveSessions:
    def __init__(self, store: SessionStore, *, record: bool, chat_idle_s: float = 300.0) -> None:
        self.store = store
        self.record = record
        self.chat_idle_s = chat_idle_s
        self.writer = RecordingWriter() if record else None
        self._sessions: dict[str, LiveSession] = {}

    def open(self, kind: str, *, worker: str | None, client: str | None, config: dict[str, Any] | None = None,
             session_id: str | None = None) -> LiveSession:
        """Start a session (and its recording); ``session_id`` may be reserved earlier with ``new_id``."""
        session_id = session_id or self.new_id(kind)
        recorder = None
        if self.writer is not None:
            try:
                recorder = SessionRecorder(self.store, session_id, kind, writer=self.writer, worker=worker,
                                           config=config)
            except OSError:  # a full disk or a broken data dir loses the recording, never the session
                logger.exception("cannot record session %s", session_id)
        session = LiveSession(session_id, kind, worker, client, recorder)
        session.requests_in_flight = 1
        self._sessions[session_id] = session
        return session

    def new_id(self, kind: str) -> str:
        return self.store.new_session_id(kind)

    def resume_chat(self, session_id: str) -> LiveSession | None:
        """The open chat session ``session_id`` if it can take one more turn now, else ``None``."""
        session = self._sessions.get(session_id)
        if session is None or session.type != "chat" or session.requests_in_flight:
            return None
        session.requests_in_flight += 1
        session.last_active = time.monotonic()
        return session

    def open_chat(self, session_id: str) -> LiveSession | None:
        """The open chat session ``session_id`` (with a request in flight or not), else ``None``."""
        session = self._sessions.get(session_id)
        return session if session is not None and session.type == "chat" else None

    def discard(self, session: LiveSession) -> None:
        """Forget ``session`` and delete what was recorded of it (a request the worker refused is no session)."""
        self._sessions.pop(session.session_id, None)
        if session.recorder is not None:
            try:
                session.recorder.discard()
            except Exception:  # noqa: BLE001 - a recording problem never breaks serving
                logger.exception("discarding the recording of %s failed", session.session_id)

    def request_done(self, session: LiveSession, status: str = "completed", error: str | None = None) -> None:
        """One request of ``session`` ended; every type but chat ends the session with it."""
        session.requests_in_flight = max(0, session.requests_in_flight - 1)
        session.last_active = time.monotonic()
        if session.type != "chat" or self.writer is None:
            self.close(session.session_id, status, error)

    def close(self, session_id: str, status: str = "completed", error: str | None = None) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None and session.recorder is not None:
            try:
                session.recorder.finish(status, error)
            except Exception:  # noqa: BLE001 - a recording problem never breaks serving
                logger.exception("finishing the recording of %s failed", session_id)

    def sweep_idle(self, now: float | None = None) -> int:
        """Finish chat sessions idle for longer than ``chat_idle_s``; returns how many."""
        now = time.monotonic() if now is None else now
        idle = [s.session_id for s in self._sessions.values()
                if s.type == "chat" and not s.requests_in_flight and now - s.last_active > self.chat_idle_s]
        for session_id in idle:
            self.close(session_id)
        return len(idle)

    def running(self) -> list[LiveSession]:
        """Sessions with a request or WebSocket being served now (an idle open chat is not running)."""
        return sorted((s for s in self._sessions.values() if s.requests_in_flight), key=lambda s: s.started_at)

    def ids(self) -> set[str]:
        """Every open session, idle chats included (cleanup must not delete what is still being written)."""
        return set(self._sessions)

    def close_all(self) -> None:
        """Finish every session as the gateway stops: one with a request in flight was interrupted; an open chat
        whose last answer was complete ended as it would have after its idle time."""
        for session_id, session in list(self._sessions.items()):
            if session.requests_in_flight:
                self.close(session_id, "interrupted", "the gateway stopped")
            else:
                self.close(session_id)
        if self.writer is not None:
            self.writer.flush(timeout=30)
            self.writer.close()
