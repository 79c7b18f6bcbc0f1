"""Deleting old recordings: first those past the retention period, then the oldest while over the size limit.

Between the two, sessions a crash cut are finished (``cut_sessions``: their replays written), so the size limit
counts their replays. Running sessions are never deleted nor finished (the caller passes their ids as
``protect``; a recorder's lock keeps its session from another process's cleanup too). Failures are collected in
the report, never raised, so one unreadable directory does not stop the cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from omnipipe.gateway.recording.cut_sessions import finish_cut_session
from omnipipe.gateway.recording.store import SessionStore, SessionSummary, session_size
from omnipipe.util.field_error import FieldError

logger = logging.getLogger(__name__)

SECONDS_PER_DAY = 86_400
BYTES_PER_GB = 1_000_000_000


@dataclass
class CleanupReport:
    """What one cleanup did (or, with ``dry_run``, would do); ``deleted`` lists the session ids; ``finished``,
    those a crash cut whose replays it wrote (never in a dry run)."""

    scanned: int = 0
    deleted_by_age: int = 0
    deleted_by_size: int = 0
    remaining: int = 0
    remaining_bytes: int = 0
    freed_bytes: int = 0
    errors: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    dry_run: bool = False

    def format(self) -> str:
        """A few human-readable lines."""
        verb = "would delete" if self.dry_run else "deleted"
        lines = [
            f"scanned {self.scanned} session(s)",
            (f"{verb} {self.deleted_by_age} past the retention period and {self.deleted_by_size} over the size "
             f"limit, freeing {_megabytes(self.freed_bytes)}"),
            f"remaining: {self.remaining} session(s), {_megabytes(self.remaining_bytes)}",
        ]
        if self.finished:
            lines.insert(1, f"finished {len(self.finished)} session(s) cut by a crash (replays written)")
        lines += [f"error: {error}" for error in self.errors]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


def _megabytes(size: int) -> str:
    return f"{size / 1_000_000:.1f} MB"


def _check_limit(value: float | None, name: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise FieldError(name, f"must be a number >= 0 or None, got {value!r}")


def cleanup_sessions(store: SessionStore, *, retention_days: float | None, max_storage_gb: float | None,
                     now: float | None = None, dry_run: bool = False,
                     protect: Collection[str] = frozenset()) -> CleanupReport:
    """Delete sessions created more than ``retention_days`` ago, then the oldest while the total size exceeds
    ``max_storage_gb`` (1 GB = 10**9 bytes). ``None`` disables a limit; ids in ``protect`` are never deleted.

    A session's age comes from ``meta.json`` ``created_at``, else from its directory's mtime. Protected sessions
    count towards the total size, so the total may stay above the limit. Kept sessions a crash cut are finished
    before the size is counted (not in a dry run).
    """
    _check_limit(retention_days, "retention_days")
    _check_limit(max_storage_gb, "max_storage_gb")
    now = time.time() if now is None else now
    report = CleanupReport(dry_run=dry_run)
    try:
        sessions = store.list_sessions()
    except OSError as exc:
        report.errors.append(f"cannot list {store.root}: {exc}")
        return report
    report.scanned = len(sessions)

    def delete(summary: SessionSummary) -> bool:
        if not dry_run:
            try:
                store.delete_session(summary.session_id)
            except (OSError, ValueError) as exc:
                report.errors.append(f"{summary.session_id}: {exc}")
                return False
        report.deleted.append(summary.session_id)
        report.freed_bytes += summary.size_bytes
        return True

    remaining: list[SessionSummary] = []  # newest first, like list_sessions
    for summary in sessions:
        expired = retention_days is not None and now - summary.created_at > retention_days * SECONDS_PER_DAY
        if expired and summary.session_id not in protect and delete(summary):
            report.deleted_by_age += 1
        else:
            remaining.append(summary)
    if not dry_run:
        remaining = [_finish_if_cut(store, summary, report) if summary.session_id not in protect else summary
                     for summary in remaining]

    if max_storage_gb is not None:
        limit = max_storage_gb * BYTES_PER_GB
        total = sum(s.size_bytes for s in remaining)
        deleted_by_size: set[str] = set()
        for summary in reversed(remaining):
            if total <= limit:
                break
            if summary.session_id not in protect and delete(summary):
                deleted_by_size.add(summary.session_id)
                total -= summary.size_bytes
        report.deleted_by_size = len(deleted_by_size)
        remaining = [s for s in remaining if s.session_id not in deleted_by_size]

    report.remaining = len(remaining)
    report.remaining_bytes = sum(s.size_bytes for s in remaining)
    return report


def _finish_if_cut(store: SessionStore, summary: SessionSummary, report: CleanupReport) -> SessionSummary:
    """``summary``, re-measured if the session was cut by a crash and is now finished."""
    if summary.status != "recording":
        return summary
    try:
        if not finish_cut_session(store, summary.session_id):
            return summary
    except Exception as exc:  # noqa: BLE001 - one session that cannot be finished must not stop the cleanup
        report.errors.append(f"{summary.session_id}: its replay could not be written ({exc})")
        return summary
    report.finished.append(summary.session_id)
    return replace(summary, status="interrupted", size_bytes=session_size(summary.path))


class PeriodicCleanup:
    """Runs ``cleanup_sessions`` in a thread now and then every ``interval_s`` seconds while started.

    ``protect`` is called on the event loop before each run and returns the ids of running sessions.
    ``last_report`` holds the latest report; ``run_now`` runs one cleanup on demand (never two at once).
    """

    def __init__(self, store: SessionStore, retention_days: float | None, max_storage_gb: float | None,
                 interval_s: float = 3600.0, protect: Callable[[], Collection[str]] = frozenset) -> None:
        _check_limit(retention_days, "retention_days")
        _check_limit(max_storage_gb, "max_storage_gb")
        if not interval_s > 0:
            raise FieldError("interval_s", f"must be > 0, got {interval_s!r}")
        self.store = store
        self.retention_days = retention_days
        self.max_storage_gb = max_storage_gb
        self.interval_s = interval_s
        self.protect = protect
        self.last_report: CleanupReport | None = None
        self._task: asyncio.Task[None] | None = None
        self._running = asyncio.Lock()

    async def run_now(self, *, dry_run: bool = False) -> CleanupReport:
        """One cleanup with the configured limits, in a worker thread."""
        async with self._running:
            protected = frozenset(self.protect())
            report = await asyncio.to_thread(cleanup_sessions, self.store, retention_days=self.retention_days,
                                             max_storage_gb=self.max_storage_gb, dry_run=dry_run,
                                             protect=protected)
        if not dry_run:
            self.last_report = report
        if report.deleted or report.errors:
            logger.info("session cleanup:\n%s", report.format())
        return report

    async def start(self) -> None:
        """Start the periodic runs (the first one at once); no-op if running or if no limit is set."""
        if self._task is not None and not self._task.done():
            return
        if self.retention_days is None and self.max_storage_gb is None:
            logger.info("session cleanup disabled: neither retention_days nor max_storage_gb is set")
            return
        self._task = asyncio.create_task(self._run_periodically(), name="omnipipe-session-cleanup")

    async def stop(self) -> None:
        """Stop the periodic runs (a cleanup already in its thread finishes in the background)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run_periodically(self) -> None:
        while True:
            try:
                await self.run_now()
            except Exception:  # noqa: BLE001 - a failed run must not end the periodic cleanup
                logger.exception("session cleanup failed")
            await asyncio.sleep(self.interval_s)
