"""Session cleanup: by age, then by size (oldest first), protected sessions, dry runs, reports, periodic runs."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from omnipipe.gateway.recording.cleanup import CleanupReport, PeriodicCleanup, cleanup_sessions
from omnipipe.gateway.recording.store import SessionStore
from tests.waiting import wait_for_async

DAY = 86_400.0
NOW = time.time()  # PeriodicCleanup measures ages from the real clock


def add_session(store: SessionStore, name: str, age_days: float, size: int = 1000, *, meta: bool = True) -> str:
    """A session created ``age_days`` before ``NOW`` holding ``size`` bytes (meta.json included)."""
    session_id = f"20260101-000000_chat_{name}"
    directory = store.root / session_id
    (directory / "user_audio").mkdir(parents=True)
    created_at = NOW - age_days * DAY
    meta_bytes = json.dumps({"session_id": session_id, "type": "chat", "created_at": created_at}).encode() if meta \
        else b""
    if meta:
        (directory / "meta.json").write_bytes(meta_bytes)
    (directory / "user_audio/turn001.wav").write_bytes(b"x" * (size - len(meta_bytes)))
    os.utime(directory, (created_at, created_at))
    return session_id


def remaining_ids(store: SessionStore) -> set[str]:
    return {s.session_id for s in store.list_sessions()}


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "data")


@pytest.fixture
def sessions(store: SessionStore) -> dict[str, str]:
    """Five 1000-byte sessions aged 1, 5, 10, 30 and 60 days; the 60-day one has no meta.json (mtime counts)."""
    return {name: add_session(store, name, age, meta=name != "d60")
            for name, age in [("d1", 1), ("d5", 5), ("d10", 10), ("d30", 30), ("d60", 60)]}


def test_by_age(store: SessionStore, sessions: dict[str, str]) -> None:
    report = cleanup_sessions(store, retention_days=7, max_storage_gb=None, now=NOW)
    assert remaining_ids(store) == {sessions["d1"], sessions["d5"]}
    assert (report.scanned, report.deleted_by_age, report.deleted_by_size) == (5, 3, 0)
    assert (report.remaining, report.remaining_bytes, report.freed_bytes) == (2, 2000, 3000)
    assert set(report.deleted) == {sessions["d10"], sessions["d30"], sessions["d60"]}
    assert report.errors == [] and not report.dry_run


def test_by_size_deletes_the_oldest_first(store: SessionStore, sessions: dict[str, str]) -> None:
    report = cleanup_sessions(store, retention_days=None, max_storage_gb=2500 / 1e9, now=NOW)
    assert remaining_ids(store) == {sessions["d1"], sessions["d5"]}
    assert report.deleted == [sessions["d60"], sessions["d30"], sessions["d10"]]
    assert (report.deleted_by_age, report.deleted_by_size, report.remaining_bytes) == (0, 3, 2000)


def test_age_then_size(store: SessionStore, sessions: dict[str, str]) -> None:
    report = cleanup_sessions(store, retention_days=20, max_storage_gb=1500 / 1e9, now=NOW)
    assert remaining_ids(store) == {sessions["d1"]}
    assert (report.deleted_by_age, report.deleted_by_size, report.freed_bytes) == (2, 2, 4000)


def test_protected_sessions_are_kept(store: SessionStore, sessions: dict[str, str]) -> None:
    protect = {sessions["d60"], sessions["d10"]}
    report = cleanup_sessions(store, retention_days=7, max_storage_gb=1500 / 1e9, now=NOW, protect=protect)
    assert remaining_ids(store) == protect  # d1 and d5 go for the size; the protected stay over it
    assert (report.deleted_by_age, report.deleted_by_size) == (1, 2)
    assert report.remaining_bytes == 2000


def test_dry_run_deletes_nothing(store: SessionStore, sessions: dict[str, str]) -> None:
    report = cleanup_sessions(store, retention_days=7, max_storage_gb=1500 / 1e9, now=NOW, dry_run=True)
    assert remaining_ids(store) == set(sessions.values())
    assert report.dry_run and (report.deleted_by_age, report.deleted_by_size, report.remaining) == (3, 1, 1)
    text = report.format()
    assert "would delete 3 past the retention period and 1 over the size limit" in text
    assert "freeing 0.0 MB" in text and "remaining: 1 session(s)" in text


def test_no_limits_and_empty_store(store: SessionStore, sessions: dict[str, str], tmp_path: Path) -> None:
    report = cleanup_sessions(store, retention_days=None, max_storage_gb=None, now=NOW)
    assert (report.scanned, report.remaining, report.deleted) == (5, 5, [])
    empty = cleanup_sessions(SessionStore(tmp_path / "nothing"), retention_days=0, max_storage_gb=0)
    assert (empty.scanned, empty.remaining, empty.errors) == (0, 0, [])


def test_failures_are_reported_not_raised(store: SessionStore, sessions: dict[str, str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    delete = store.delete_session

    def flaky(session_id: str) -> None:
        if session_id == sessions["d60"]:
            raise PermissionError(13, "Permission denied")
        delete(session_id)

    monkeypatch.setattr(store, "delete_session", flaky)
    report = cleanup_sessions(store, retention_days=None, max_storage_gb=3500 / 1e9, now=NOW)
    # d60 cannot go, so the next oldest go instead until the total fits
    assert remaining_ids(store) == {sessions["d1"], sessions["d5"], sessions["d60"]}
    assert report.deleted == [sessions["d30"], sessions["d10"]] and report.deleted_by_size == 2
    assert len(report.errors) == 1 and sessions["d60"] in report.errors[0]
    assert f"error: {sessions['d60']}" in report.format()
    as_dict = report.to_dict()
    assert as_dict["errors"] == report.errors and as_dict["remaining"] == 3 and as_dict["freed_bytes"] == 2000


@pytest.mark.parametrize(("name", "value"), [("retention_days", -1), ("max_storage_gb", -0.5),
                                             ("retention_days", float("nan")), ("max_storage_gb", "10")])
def test_invalid_limits(store: SessionStore, name: str, value: object) -> None:
    limits: dict[str, object] = {"retention_days": None, "max_storage_gb": None, name: value}
    with pytest.raises(ValueError, match=name):
        cleanup_sessions(store, **limits)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=name):
        PeriodicCleanup(store, **limits)  # type: ignore[arg-type]


def test_report_format_lines() -> None:
    report = CleanupReport(scanned=3, deleted_by_age=1, deleted_by_size=1, remaining=1, remaining_bytes=2_500_000,
                           freed_bytes=5_000_000)
    assert report.format().splitlines() == [
        "scanned 3 session(s)",
        "deleted 1 past the retention period and 1 over the size limit, freeing 5.0 MB",
        "remaining: 1 session(s), 2.5 MB",
    ]


def test_periodic_cleanup(store: SessionStore, sessions: dict[str, str]) -> None:
    protect_calls: list[int] = []

    def running() -> set[str]:
        protect_calls.append(1)
        return {sessions["d60"]}

    async def main() -> PeriodicCleanup:
        periodic = PeriodicCleanup(store, retention_days=7, max_storage_gb=None, interval_s=0.01, protect=running)
        await periodic.start()
        await periodic.start()  # already running: no second loop
        await wait_for_async(lambda: len(protect_calls) >= 2, 5, "two cleanup rounds")
        await periodic.stop()
        await periodic.stop()
        return periodic

    periodic = asyncio.run(main())
    assert len(protect_calls) >= 2
    assert periodic.last_report is not None and periodic.last_report.errors == []
    assert remaining_ids(store) == {sessions["d1"], sessions["d5"], sessions["d60"]}


def test_periodic_cleanup_without_limits_does_not_start(store: SessionStore) -> None:
    async def main() -> PeriodicCleanup:
        periodic = PeriodicCleanup(store, retention_days=None, max_storage_gb=None, interval_s=0.01)
        await periodic.start()
        await asyncio.sleep(0.05)  # stays: five intervals in which a started loop would have run
        await periodic.stop()
        return periodic

    assert asyncio.run(main()).last_report is None
