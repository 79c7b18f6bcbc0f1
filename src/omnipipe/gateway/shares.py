"""Read-only share links to recorded sessions: ``/shared/{token}`` opens one session, and nothing else.

A session's own id is a capability: who knows it may open ``/s/{id}`` and continue an open chat (the chat page
sends it back with each turn). A share link therefore never reveals it: the token names the session only through
this store, the shared view leaves the id out (``shared_view``), and revoking the token ends the access. Tokens are
``secrets.token_urlsafe(24)`` (192 random bits); the store keeps only their SHA-256, so the file does not hold
working links. Each share also has a short public ``share_id``, by which the admin lists and revokes it.

The shares live in ``{data_dir}/shares.json``, rewritten atomically on every change (a restart keeps them). A
revoked share stays listed, so its link answers 410 (revoked) rather than 404 (unknown).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omnipipe.gateway.recording.store import META_FILENAME, RECORDING_FILENAME, atomic_write_bytes
from omnipipe.util.field_error import FieldError

SHARES_FILENAME = "shares.json"
TOKEN_BYTES = 24
SHARED_PATH = "/shared/"
HIDDEN_FILES = (META_FILENAME, RECORDING_FILENAME)
"""Files a shared view does not serve: they name the session; their content comes, without the id, in the view."""


class ShareNotFound(LookupError):
    """No share has this token or id."""


class ShareRevoked(LookupError):
    """The share was revoked by the admin."""


@dataclass(frozen=True)
class Share:
    """One share link; ``revoked_at`` is ``None`` while it works. Times are epoch seconds."""

    share_id: str
    session_id: str
    token_sha256: str
    created_at: float
    revoked_at: float | None = None

    def summary(self) -> dict[str, Any]:
        """What the admin sees (never the token's hash)."""
        return {"share_id": self.share_id, "session_id": self.session_id, "created_at": self.created_at,
                "revoked_at": self.revoked_at, "status": "revoked" if self.revoked_at is not None else "active"}


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class ShareStore:
    """The share links of one gateway, kept in ``{data_dir}/shares.json``; safe to use from several threads."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / SHARES_FILENAME
        self._lock = threading.Lock()
        self._shares: dict[str, Share] = {share.share_id: share for share in self._read()}

    def _read(self) -> list[Share]:
        """The stored shares; a file that cannot be read is an error naming it (never silently emptied)."""
        try:
            data = json.loads(self.path.read_bytes())
            return [Share(**entry) for entry in data["shares"]]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise FieldError("data_dir", f"{self.path}: the share links cannot be read ({exc}); fix or move the "
                             "file (moving it drops every share link)") from None

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        shares = [asdict(share) for share in sorted(self._shares.values(), key=lambda s: s.created_at)]
        atomic_write_bytes(self.path, json.dumps({"shares": shares}, indent=1).encode())

    def create(self, session_id: str) -> tuple[Share, str]:
        """A new share of ``session_id`` and its token (the only time the token is known)."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        with self._lock:
            share_id = secrets.token_hex(6)
            while share_id in self._shares:
                share_id = secrets.token_hex(6)
            share = Share(share_id, session_id, _digest(token), time.time())
            self._shares[share_id] = share
            try:
                self._write()
            except BaseException:
                del self._shares[share_id]
                raise
        return share, token

    def resolve(self, token: str) -> Share:
        """The working share with ``token``: ``ShareNotFound`` if none has it, ``ShareRevoked`` if revoked."""
        digest = _digest(token)
        with self._lock:
            found = next((s for s in self._shares.values() if secrets.compare_digest(s.token_sha256, digest)), None)
        if found is None:
            raise ShareNotFound("no share link has this token")
        if found.revoked_at is not None:
            raise ShareRevoked("this share link was revoked")
        return found

    def revoke(self, share_id: str) -> Share:
        """Revoke ``share_id`` (again is fine: the first time stays); ``ShareNotFound`` if unknown."""
        with self._lock:
            share = self._shares.get(share_id)
            if share is None:
                raise ShareNotFound(f"no share {share_id!r}")
            if share.revoked_at is None:
                revoked = Share(share.share_id, share.session_id, share.token_sha256, share.created_at, time.time())
                self._shares[share_id] = revoked
                try:
                    self._write()
                except BaseException:
                    self._shares[share_id] = share
                    raise
            return self._shares[share_id]

    def list_shares(self) -> list[Share]:
        """Every share, newest first."""
        with self._lock:
            return sorted(self._shares.values(), key=lambda s: s.created_at, reverse=True)


def shared_view(session: dict[str, Any]) -> dict[str, Any]:
    """``SessionStore.read_session``'s answer as a share link shows it: the session id is left out everywhere it
    appears (the top level, meta.json, recording.json), and so are the files that hold it."""
    session_id = session["session_id"]

    def without_id(document: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in document.items() if not (key == "session_id" and value == session_id)}

    return {**without_id(session), "meta": without_id(session["meta"]),
            "recording": without_id(session["recording"]),
            "files": [name for name in session["files"] if name not in HIDDEN_FILES]}
