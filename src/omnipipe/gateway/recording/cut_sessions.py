"""Finishing a session a crash cut: ``meta.json`` still says ``recording`` but no recorder holds its lock
(``session_lock``). The cleanup does it for every such session it keeps: the replays the recorder would have
written at the end (``session_replay``), turns still in progress closed as ``cancelled``, and the session marked
``interrupted``, ended at the last moment its recording mentions.
"""

from __future__ import annotations

import json
from typing import Any

from omnipipe.gateway.recording.recorder import DEFAULT_MAX_REPLAY_S
from omnipipe.gateway.recording.session_lock import unless_recording
from omnipipe.gateway.recording.session_replay import timeline_end, write_session_replays
from omnipipe.gateway.recording.store import META_FILENAME, RECORDING_FILENAME, SessionStore, atomic_write_bytes

CUT_SESSION_ERROR = "the gateway stopped during the session; the cleanup wrote its replay"


def _write_json(path: Any, value: dict[str, Any]) -> None:
    atomic_write_bytes(path, json.dumps(value, indent=2, ensure_ascii=False).encode())


def finish_cut_session(store: SessionStore, session_id: str, *, max_duration_s: float = DEFAULT_MAX_REPLAY_S) -> bool:
    """Finish ``session_id`` if a crash cut it; ``False`` (nothing done) while a recorder holds it or when it is
    not ``recording``. Raises ``OSError`` (and what replays raise) when it cannot be finished."""
    directory = store.session_dir(session_id)
    with unless_recording(directory) as free:
        if not free:
            return False
        session = store.read_session(session_id)
        meta, recording = session["meta"], session["recording"]
        if meta.get("status") != "recording" or not isinstance(meta.get("created_at"), (int, float)):
            return False
        end_s = timeline_end(recording)
        write_session_replays(directory, recording, duration_s=end_s, max_duration_s=max_duration_s,
                              session_id=session_id)
        open_turns = [turn for turn in recording.get("turns", []) if turn.get("status") == "in_progress"]
        for turn in open_turns:
            turn.update(status="cancelled", ended_at=end_s)
        if open_turns:
            _write_json(directory / RECORDING_FILENAME, recording)
        meta.update(status="interrupted", ended_at=meta["created_at"] + end_s, error=CUT_SESSION_ERROR)
        _write_json(directory / META_FILENAME, meta)
    return True
