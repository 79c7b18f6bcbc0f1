"""Where recorded sessions live on disk, and every safe way to reach them.

Layout: ``{data_dir}/sessions/{session_id}/`` with ``meta.json``, ``recording.json``, ``user_audio/``,
``ai_audio/``, ``user_images/``, ``user_videos/``, ``ai_images/`` (the images answers drew), ``user_frames/``
(camera frames of a live session), ``merged_replay.wav`` and ``merged_replay.mp4``. Session ids match
``SESSION_ID_PATTERN``; a relative path taken from a request is resolved (symlinks followed) and refused unless it
stays inside its session directory. Nothing here follows a symlink when listing, sizing, zipping or deleting.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""A session id, matched with ``fullmatch``."""

SESSIONS_DIRNAME = "sessions"
META_FILENAME = "meta.json"
RECORDING_FILENAME = "recording.json"
REPLAY_FILENAME = "merged_replay.wav"
VIDEO_REPLAY_FILENAME = "merged_replay.mp4"
TEMP_SUFFIX = ".partial"
"""Files being written end in this suffix until they are renamed into place; listings skip them."""


class InvalidSessionPath(ValueError):
    """A session id or a path inside a session is malformed or would leave the session directory."""


def validate_session_id(session_id: str) -> str:
    """Return ``session_id`` if it fully matches ``SESSION_ID_PATTERN``, else raise ``InvalidSessionPath``."""
    if not isinstance(session_id, str):
        raise InvalidSessionPath(f"a session id must be a string, got {type(session_id).__name__}")
    if not SESSION_ID_PATTERN.fullmatch(session_id):
        shown = session_id if len(session_id) <= 40 else session_id[:40] + "..."
        raise InvalidSessionPath(f"{shown!r} is not a session id (1-128 characters of A-Z, a-z, 0-9, '_' or '-')")
    return session_id


def temporary_path(path: Path) -> Path:
    """A unique name next to ``path`` for writing it before the rename; listings skip such names."""
    return path.with_name(f"{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file next to ``path``, then rename it over ``path``.

    Readers see either the old file or the complete new one, never a partial write.
    """
    temp = temporary_path(path)
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _read_json_object(path: Path) -> tuple[dict[str, Any], str | None]:
    """``(object, None)`` for a readable JSON object file, ``({}, None)`` if it is missing, else ``({}, error)``."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return {}, f"{path.name}: cannot be read ({exc.strerror or exc})"
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return {}, f"{path.name}: not valid JSON ({exc})"
    if not isinstance(value, dict):
        return {}, f"{path.name}: expected a JSON object, got {type(value).__name__}"
    return value, None


def _regular_files(directory: Path) -> list[tuple[str, int]]:
    """``(relative posix path, size)`` of every regular file below ``directory``; symlinks are not followed."""
    found: list[tuple[str, int]] = []
    for current, _, filenames in os.walk(directory, followlinks=False):
        for name in filenames:
            if name.endswith(TEMP_SUFFIX):
                continue
            full = Path(current, name)
            try:
                info = full.lstat()
            except OSError:
                continue  # deleted while walking
            if stat.S_ISREG(info.st_mode):
                found.append((full.relative_to(directory).as_posix(), info.st_size))
    return sorted(found)


def session_size(path: Path) -> int:
    """Total bytes of the regular files below ``path``, without following symlinks."""
    return sum(size for _, size in _regular_files(path))


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class SessionSummary:
    """One recorded session as listed: ``created_at``/``ended_at`` are epoch seconds."""

    session_id: str
    type: str
    created_at: float
    ended_at: float | None
    status: str
    size_bytes: int
    path: Path


class SessionStore:
    """The recorded sessions below ``data_dir/sessions`` (created on demand)."""

    def __init__(self, data_dir: Path | str) -> None:
        self.data_dir = Path(data_dir)
        self.root = self.data_dir / SESSIONS_DIRNAME

    def new_session_id(self, kind: str) -> str:
        """A fresh id such as ``20261122-024301_chat_3f9a1c2b7d`` (UTC time, ``kind``, 40 random bits).

        The id is not taken by an existing directory; the recorder creates the directory.
        """
        if not re.fullmatch(r"[A-Za-z0-9-]{1,32}", kind or ""):
            raise ValueError(f"kind: {kind!r} must be 1-32 characters of A-Z, a-z, 0-9 or '-'")
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        while True:
            session_id = f"{stamp}_{kind}_{secrets.token_hex(5)}"
            if not (self.root / session_id).exists():
                return session_id

    def session_dir(self, session_id: str, *, must_exist: bool = True) -> Path:
        """The directory of ``session_id``; ``FileNotFoundError`` if ``must_exist`` and it is not there.

        A session directory that is a symlink is refused (``InvalidSessionPath``).
        """
        path = self.root / validate_session_id(session_id)
        if path.is_symlink():
            raise InvalidSessionPath(f"session {session_id!r} is a symlink, not a directory")
        if must_exist and not path.is_dir():
            raise FileNotFoundError(f"session {session_id!r} not found")
        return path

    def resolve_file(self, session_id: str, relpath: str) -> Path:
        """The regular file ``relpath`` inside the session, resolved; refused unless it stays inside.

        Refused (``InvalidSessionPath``): an empty or absolute path, ``..`` parts, backslashes, NUL, and any
        path whose resolved target (symlinks followed) is outside the session directory. ``FileNotFoundError``
        if the target does not exist or is not a regular file.
        """
        if not isinstance(relpath, str) or not relpath:
            raise InvalidSessionPath("the file path is empty")
        if "\x00" in relpath:
            raise InvalidSessionPath("NUL characters are not allowed in a file path")
        if "\\" in relpath:
            raise InvalidSessionPath("backslashes are not allowed in a file path (use '/')")
        if relpath.startswith("/"):
            raise InvalidSessionPath("the file path must be relative to the session directory")
        if ".." in relpath.split("/"):
            raise InvalidSessionPath("'..' is not allowed in a file path")
        base = self.session_dir(session_id).resolve(strict=True)
        target = (base / relpath).resolve(strict=False)
        if not target.is_relative_to(base):
            raise InvalidSessionPath("the file path leads outside the session directory")
        if not target.is_file():
            raise FileNotFoundError(f"session {session_id!r} has no file {relpath!r}")
        return target

    def read_session(self, session_id: str) -> dict[str, Any]:
        """``{"session_id", "meta", "recording", "files", "size_bytes", "errors"}`` of one session.

        A missing, partial or corrupt JSON file reads as ``{}`` with a message in ``errors``; this never raises
        for file contents. ``files`` are the sorted relative paths of the session's regular files.
        """
        directory = self.session_dir(session_id)
        errors: list[str] = []
        documents: dict[str, dict[str, Any]] = {}
        for key, filename in (("meta", META_FILENAME), ("recording", RECORDING_FILENAME)):
            documents[key], error = _read_json_object(directory / filename)
            if error:
                errors.append(error)
        files = _regular_files(directory)
        return {"session_id": session_id, "meta": documents["meta"], "recording": documents["recording"],
                "files": [name for name, _ in files], "size_bytes": sum(size for _, size in files),
                "errors": errors}

    def list_sessions(self) -> list[SessionSummary]:
        """Every session, newest first; entries that are not valid session directories are skipped."""
        if not self.root.is_dir():
            return []
        summaries: list[SessionSummary] = []
        for entry in self.root.iterdir():
            if not SESSION_ID_PATTERN.fullmatch(entry.name) or entry.is_symlink() or not entry.is_dir():
                continue
            summary = self._summary(entry)
            if summary is not None:
                summaries.append(summary)
        summaries.sort(key=lambda s: (s.created_at, s.session_id), reverse=True)
        return summaries

    def _summary(self, directory: Path) -> SessionSummary | None:
        meta, _ = _read_json_object(directory / META_FILENAME)
        try:
            mtime = directory.stat().st_mtime
        except OSError:
            return None  # deleted meanwhile
        created_at = _float_or_none(meta.get("created_at"))
        kind = meta.get("type")
        status = meta.get("status")
        return SessionSummary(
            session_id=directory.name,
            type=kind if isinstance(kind, str) else _kind_from_id(directory.name),
            created_at=created_at if created_at is not None else mtime,
            ended_at=_float_or_none(meta.get("ended_at")),
            status=status if isinstance(status, str) else "unknown",
            size_bytes=session_size(directory),
            path=directory,
        )

    def zip_session(self, session_id: str, dest: Path | str) -> Path:
        """Write a zip of the session's regular files to ``dest`` (entries ``{session_id}/{relpath}``).

        JSON is compressed; audio and images, which barely shrink, are stored as they are.
        """
        directory = self.session_dir(session_id)
        dest = Path(dest)
        with zipfile.ZipFile(dest, "w") as archive:
            for relpath, _ in _regular_files(directory):
                compression = zipfile.ZIP_DEFLATED if relpath.endswith(".json") else zipfile.ZIP_STORED
                archive.write(directory / relpath, f"{session_id}/{relpath}", compress_type=compression)
        return dest

    def delete_session(self, session_id: str) -> None:
        """Remove the session directory and everything in it (symlinks inside are removed, not followed)."""
        shutil.rmtree(self.session_dir(session_id))


def _kind_from_id(session_id: str) -> str:
    """The kind embedded in ids made by ``new_session_id`` (``{stamp}_{kind}_{random}``), else ``"unknown"``."""
    parts = session_id.split("_")
    return parts[1] if len(parts) == 3 and parts[1] else "unknown"
