"""Durable schedules: Focal wake-ups and the heartbeat (C2, FO6, FO7).

The table is the truth; APScheduler only decides *when* to look. Firing is
a compare-and-set on ``next_run_at`` inside a transaction, so a due job
fires once even when several runtime processes share the database.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import firing
from .conflicts import unless_present
from .database import is_postgres
from .errors import RowNotFound
from .models import ScheduledJob, Tables
from .writer import GroupCommitWriter


@dataclass(frozen=True)
class JobRecord:
    """A scheduled job."""

    id: str
    chat_id: str
    kind: str
    note: str
    cron: str | None
    interval_seconds: float | None
    run_at: float | None
    next_run_at: float | None
    last_run_at: float | None
    active: bool
    created_at: float

    def to_dict(self) -> dict[str, Any]:
        """The job as the API shows it."""
        return {"job_id": self.id, "chat_id": self.chat_id, "kind": self.kind,
                "note": self.note, "cron": self.cron, "interval_seconds": self.interval_seconds,
                "run_at": self.run_at, "next_run_at": self.next_run_at,
                "last_run_at": self.last_run_at, "active": self.active}


def _record(j: ScheduledJob) -> JobRecord:
    return JobRecord(j.id, j.chat_id, j.kind, j.note, j.cron, j.interval_seconds, j.run_at,
                     j.next_run_at, j.last_run_at, bool(j.active), j.created_at)


def _insert(j: Any, job: JobRecord) -> Any:
    """The INSERT of ``job`` (not yet executed)."""
    return j.insert(id=job.id, chat_id=job.chat_id, kind=job.kind, note=job.note,
                    cron=job.cron, interval_seconds=job.interval_seconds, run_at=job.run_at,
                    next_run_at=job.next_run_at, last_run_at=job.last_run_at,
                    active=job.active, created_at=job.created_at)


class JobStore:
    """Scheduled jobs on one database."""

    def __init__(self, tables: Tables, writer: GroupCommitWriter) -> None:
        self.t = tables
        self.writer = writer

    def create_now(self, job: JobRecord, *, limit_kinds: tuple[str, ...] = (),
                   limit: int | None = None) -> JobRecord | None:
        """Insert a job inside the caller's transaction; None when ``limit`` active jobs of
        ``limit_kinds`` already exist for its chat (which must exist then:
        :class:`RowNotFound` if not).

        The count and the insert are one admission only if no other admission for the chat
        runs between them. SQLite's writes are serial; on PostgreSQL (READ COMMITTED) two
        processes each counted 19 of a limit of 20, neither seeing the other's row, and
        both inserted. So an admission first locks the chat's session row: the second waits
        for the first's commit, and its count (a statement after the lock) sees that row."""
        j = self.t.job
        if limit is not None:
            if is_postgres(self.t.db):
                s = self.t.session
                if s.select(s.id).where(s.id == job.chat_id).for_update().first() is None:
                    raise RowNotFound("session", job.chat_id)
            count = j.select().where(j.chat_id == job.chat_id, j.active == True,  # noqa: E712
                                     j.kind.in_(limit_kinds)).count()
            if count >= limit:
                return None
        _insert(j, job).execute()
        return job

    def ensure(self, job: JobRecord) -> JobRecord:
        """Insert ``job`` unless a job of its id exists; the stored job either way. For a
        job of a fixed id (the heartbeat) that two processes may make at once: both read
        none, and the second plain insert failed on the first's row."""
        j = self.t.job

        def op() -> JobRecord:
            unless_present(_insert(j, job), j.id).execute()
            return _record(j.get(j.id == job.id))
        return self.writer.call(op)

    def reschedule_now(self, job: JobRecord) -> None:
        """Give the job of ``job.id`` its interval, next run and active flag, inside the
        caller's transaction; inserted whole when there is none yet. An insert, not an
        update alone: another process that is making the job at the same moment (its
        :meth:`ensure` keeps whatever row exists) would otherwise write its own over a
        change that found no row to change."""
        j = self.t.job
        _insert(j, job).on_conflict(conflict_target=[j.id], update={
            j.interval_seconds: job.interval_seconds, j.next_run_at: job.next_run_at,
            j.active: job.active}).execute()

    def create(self, job: JobRecord, *, limit_kinds: tuple[str, ...] = (),
               limit: int | None = None) -> JobRecord | None:
        """Insert a job; None when ``limit`` active jobs of ``limit_kinds`` already exist."""
        return self.writer.call(lambda: self.create_now(job, limit_kinds=limit_kinds,
                                                        limit=limit))

    def get(self, job_id: str) -> JobRecord | None:
        """The job with this id, or None."""
        j = self.t.job
        row = j.get_or_none(j.id == job_id)
        return _record(row) if row else None

    def active(self, chat_id: str | None = None) -> list[JobRecord]:
        """Active jobs, soonest first."""
        j = self.t.job
        q = j.select().where(j.active == True).order_by(j.next_run_at, j.id)  # noqa: E712
        if chat_id is not None:
            q = q.where(j.chat_id == chat_id)
        return [_record(r) for r in q]

    def deactivate(self, job_id: str) -> bool:
        """Stop a job; False if there was no active job with that id."""
        return bool(self.writer.call(lambda: self.deactivate_now(job_id)))

    def deactivate_now(self, job_id: str) -> bool:
        """:meth:`deactivate` inside the caller's transaction (a writer operation)."""
        j = self.t.job
        return bool(j.update(active=False).where(
            j.id == job_id, j.active == True).execute())  # noqa: E712

    def move_due(self, written_after: float, moved_to: Callable[[JobRecord], float | None]
                 ) -> list[JobRecord]:
        """Move the next run of the active jobs created or last run after ``written_after``
        (by a clock that read later than this one) to ``moved_to(job)`` (None: keep it);
        the jobs moved."""
        j = self.t.job
        late = (j.created_at > written_after) | (j.last_run_at > written_after)
        if not firing.has_due_moves(j, late, _record, moved_to):
            return []  # the usual case (and every look after a move): no write to queue
        return self.writer.call(lambda: firing.move_due(j, late, _record, moved_to, {}))

    def fire_due(self, now: float, next_after: Callable[[JobRecord, float], float | None],
                 on_fire: Callable[[JobRecord, float], None]) -> list[JobRecord]:
        """Advance every due job once (compare-and-set) and run ``on_fire`` in the same
        transaction; a job fired by another process in between is skipped."""
        if not firing.has_due(self.t.job, now):
            return []  # the usual look: nothing due, no write to queue

        def advance(job: JobRecord) -> dict[str, Any]:
            upcoming = next_after(job, now)
            return {"next_run_at": upcoming, "last_run_at": now, "active": upcoming is not None}

        return self.writer.call(lambda: firing.fire_due(
            self.t.job, now, _record, advance, lambda job: on_fire(job, now)))
