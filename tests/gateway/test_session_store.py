"""Session store: id validation, path containment (symlinks included), tolerant reads, listing, zip and delete."""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path

import pytest

from omnipipe.gateway.recording.store import (
    SESSION_ID_PATTERN,
    InvalidSessionPath,
    SessionStore,
    session_size,
    validate_session_id,
)

SID = "20261122-024301_chat_3f9a1c2b7d"


def make_session(store: SessionStore, session_id: str = SID, *, meta: dict | None = None,
                 files: dict[str, bytes] | None = None) -> Path:
    """A session directory with ``meta.json`` (unless ``meta`` is None) and the given files."""
    directory = store.root / session_id
    directory.mkdir(parents=True)
    if meta is not None:
        (directory / "meta.json").write_text(json.dumps(meta))
    for relpath, data in (files or {}).items():
        (directory / relpath).parent.mkdir(parents=True, exist_ok=True)
        (directory / relpath).write_bytes(data)
    return directory


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "data")


@pytest.mark.parametrize("session_id", ["a", "A-b_9", "x" * 128, SID, "-", "_"])
def test_valid_session_ids(session_id: str) -> None:
    assert validate_session_id(session_id) == session_id


@pytest.mark.parametrize("session_id", ["", ".", "..", "a/b", "a\\b", "x" * 129, "é", "sessión", "a.b", " a",
                                        "a\x00", "a\n", "%2e%2e"])
def test_invalid_session_ids(session_id: str) -> None:
    with pytest.raises(InvalidSessionPath, match="not a session id"):
        validate_session_id(session_id)


def test_new_session_ids_are_unique_and_valid(store: SessionStore) -> None:
    ids = {store.new_session_id("chat") for _ in range(200)}
    assert len(ids) == 200
    for session_id in ids:
        assert SESSION_ID_PATTERN.fullmatch(session_id)
        assert re.fullmatch(r"\d{8}-\d{6}_chat_[0-9a-f]{10}", session_id)
    with pytest.raises(ValueError, match="kind"):
        store.new_session_id("../x")


def test_session_dir(store: SessionStore) -> None:
    assert store.session_dir(SID, must_exist=False) == store.root / SID
    with pytest.raises(FileNotFoundError):
        store.session_dir(SID)
    make_session(store)
    assert store.session_dir(SID) == store.root / SID
    with pytest.raises(InvalidSessionPath):
        store.session_dir("../data", must_exist=False)


@pytest.fixture
def session_with_outside_file(store: SessionStore, tmp_path: Path) -> Path:
    """A session with a WAV and meta.json, plus a secret file next to the data directory."""
    (tmp_path / "secret.txt").write_text("secret")
    return make_session(store, meta={"type": "chat"}, files={"user_audio/turn001.wav": b"RIFF"})


def test_resolve_file_inside(store: SessionStore, session_with_outside_file: Path) -> None:
    path = store.resolve_file(SID, "user_audio/turn001.wav")
    assert path == (session_with_outside_file / "user_audio/turn001.wav").resolve()
    assert store.resolve_file(SID, "meta.json").read_bytes() == b'{"type": "chat"}'


@pytest.mark.parametrize("relpath", ["", "../secret.txt", "../../secret.txt", "/etc/passwd",
                                     "user_audio/../../../secret.txt", "a/../../x", "user_audio/../meta.json",
                                     "user_audio\\turn001.wav", "..\\..\\secret.txt", "meta.json\x00.wav", ".."])
def test_resolve_file_refuses_escapes(store: SessionStore, session_with_outside_file: Path, relpath: str) -> None:
    with pytest.raises(InvalidSessionPath):
        store.resolve_file(SID, relpath)


def test_resolve_file_missing_or_not_a_file(store: SessionStore, session_with_outside_file: Path) -> None:
    with pytest.raises(FileNotFoundError):
        store.resolve_file(SID, "user_audio/turn002.wav")
    with pytest.raises(FileNotFoundError):
        store.resolve_file(SID, "user_audio")
    with pytest.raises(FileNotFoundError):
        store.resolve_file("20990101-000000_chat_0000000000", "meta.json")


def test_resolve_file_symlinks(store: SessionStore, session_with_outside_file: Path, tmp_path: Path) -> None:
    directory = session_with_outside_file
    (directory / "leak.txt").symlink_to(tmp_path / "secret.txt")
    (directory / "outside_dir").symlink_to(tmp_path, target_is_directory=True)
    (directory / "alias.wav").symlink_to(directory / "user_audio/turn001.wav")
    (directory / "relative_alias.wav").symlink_to("user_audio/turn001.wav")
    for relpath in ("leak.txt", "outside_dir/secret.txt"):
        with pytest.raises(InvalidSessionPath, match="outside"):
            store.resolve_file(SID, relpath)
    target = (directory / "user_audio/turn001.wav").resolve()
    assert store.resolve_file(SID, "alias.wav") == target
    assert store.resolve_file(SID, "relative_alias.wav") == target


def test_symlinked_session_dir_is_refused(store: SessionStore, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "meta.json").write_text("{}")
    store.root.mkdir(parents=True)
    (store.root / SID).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(InvalidSessionPath, match="symlink"):
        store.resolve_file(SID, "meta.json")
    assert store.list_sessions() == []


def test_read_session_tolerates_corrupt_json(store: SessionStore) -> None:
    directory = make_session(store, files={"user_audio/turn001.wav": b"1234", "ai_audio/turn001.wav": b"12"})
    (directory / "meta.json").write_text('{"session_id": "x", "type": "ch')  # cut short by a crash
    (directory / "recording.json").write_text("[1, 2]")
    (directory / "recording.json.1a2b3c4d.partial").write_text("{")
    session = store.read_session(SID)
    assert session["meta"] == {} and session["recording"] == {}
    assert len(session["errors"]) == 2
    assert "meta.json" in session["errors"][0] and "JSON" in session["errors"][0]
    assert "recording.json" in session["errors"][1] and "object" in session["errors"][1]
    assert session["files"] == ["ai_audio/turn001.wav", "meta.json", "recording.json", "user_audio/turn001.wav"]
    meta_size = (directory / "meta.json").stat().st_size
    assert session["size_bytes"] == 4 + 2 + meta_size + len("[1, 2]")


def test_read_session_ok(store: SessionStore) -> None:
    meta = {"session_id": SID, "type": "chat", "created_at": 1.0}
    make_session(store, meta=meta, files={"recording.json": b'{"turns": []}'})
    session = store.read_session(SID)
    assert session["session_id"] == SID and session["meta"] == meta and session["recording"] == {"turns": []}
    assert session["errors"] == []


def test_session_size_does_not_follow_symlinks(store: SessionStore, tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 10_000)
    directory = make_session(store, files={"a.bin": b"x" * 10})
    (directory / "big_link").symlink_to(tmp_path / "big")
    (directory / "dir_link").symlink_to(tmp_path, target_is_directory=True)
    assert session_size(directory) == 10


def test_list_sessions_newest_first_and_skips_junk(store: SessionStore, tmp_path: Path) -> None:
    make_session(store, "20260101-000000_voice_aaaaaaaaaa",
                 meta={"type": "voice", "created_at": 100.0, "ended_at": 160.0, "status": "completed"},
                 files={"user_audio/turn001.wav": b"x" * 100})
    make_session(store, "20260102-000000_chat_bbbbbbbbbb", meta={"type": "chat", "created_at": 300.0,
                                                                 "status": "recording"})
    no_meta = make_session(store, "20260103-000000_speech_cccccccccc")
    os.utime(no_meta, (200.0, 200.0))
    (store.root / "not a session").mkdir()
    (store.root / "file.txt").write_text("x")
    (tmp_path / "outside").mkdir()
    (store.root / "linked").symlink_to(tmp_path / "outside", target_is_directory=True)

    summaries = store.list_sessions()
    assert [s.session_id for s in summaries] == ["20260102-000000_chat_bbbbbbbbbb",
                                                 "20260103-000000_speech_cccccccccc",
                                                 "20260101-000000_voice_aaaaaaaaaa"]
    chat, speech, voice = summaries
    assert (chat.type, chat.created_at, chat.ended_at, chat.status) == ("chat", 300.0, None, "recording")
    assert (speech.type, speech.created_at, speech.status) == ("speech", 200.0, "unknown")
    assert voice.ended_at == 160.0 and voice.size_bytes == 100 + (store.root / voice.session_id / "meta.json").stat(
    ).st_size
    assert voice.path == store.root / voice.session_id


def test_list_sessions_without_root(store: SessionStore) -> None:
    assert store.list_sessions() == []


def test_zip_session(store: SessionStore, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("secret")
    directory = make_session(store, meta={"type": "voice"}, files={"user_audio/turn001.wav": b"wav-bytes",
                                                                   "merged_replay.wav": b"replay"})
    (directory / "leak.txt").symlink_to(tmp_path / "secret.txt")
    (directory / "meta.json.0badc0de.partial").write_text("{")
    archive = store.zip_session(SID, tmp_path / "out.zip")
    assert archive == tmp_path / "out.zip"
    with zipfile.ZipFile(archive) as zipped:
        assert sorted(zipped.namelist()) == [f"{SID}/merged_replay.wav", f"{SID}/meta.json",
                                             f"{SID}/user_audio/turn001.wav"]
        assert zipped.read(f"{SID}/user_audio/turn001.wav") == b"wav-bytes"
        assert json.loads(zipped.read(f"{SID}/meta.json")) == {"type": "voice"}
        assert zipped.getinfo(f"{SID}/meta.json").compress_type == zipfile.ZIP_DEFLATED


def test_delete_session_keeps_symlink_targets(store: SessionStore, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("secret")
    directory = make_session(store, meta={}, files={"a/b.txt": b"x"})
    (directory / "leak.txt").symlink_to(tmp_path / "secret.txt")
    store.delete_session(SID)
    assert not directory.exists()
    assert (tmp_path / "secret.txt").read_text() == "secret"
    with pytest.raises(FileNotFoundError):
        store.delete_session(SID)
    with pytest.raises(InvalidSessionPath):
        store.delete_session("..")
