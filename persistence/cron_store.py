"""Durable cron jobs and their run records (C1, C2).

The tables are the truth; this module only applies decisions made by the
actors' cron rules. Firing a due job is the shared compare-and-set of
:mod:`.firing`, and the occurrence's run record is inserted in the same
transaction under an id naming the occurrence, so a job fires once however
many runtimes share the database. A run is leased to the runtime that
fired it: only that owner may finish it, and a run whose owner died is
taken over once its lease runs out, so no run is lost to a crash and none
finishes twice; a takeover may end the run instead, failed, when the caller's
rules say it was taken over too often (its turn kills its runtime). While a run
taken over still runs, its job's next occurrence waits, due, for it to end: not
fired beside it, nor lost to the crash.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, NamedTuple

import peewee as pw

from . import firing, paging, retention
from .conflicts import unless_present
from .database import is_postgres
from .errors import DuplicateError, LeaseLost
from .inbox_notify import SCHEDULES_NOTIFY_SQL
from .models import CronJob, CronRun, Tables
from .writer import GroupCommitWriter

RUN_STATES = ("running", "success", "error")
"""A run is ``running`` until its owner records ``success`` or ``error``."""


class CronRunLost(LeaseLost):
    """A runtime tried to finish a run it no longer owns (taken over, or removed)."""

    def __init__(self, run_id: str, owner: str) -> None:
        super().__init__(run_id, owner)
        self.run_id = run_id


@dataclass(frozen=True)
class CronJobRecord:
    """A cron job as stored."""

    id: str
    name: str
    cron: str
    timezone: str
    prompt: str
    active: bool
    delivery: str
    retry_count: int
    next_run_at: float | None
    last_run_at: float | None
    last_result: str | None
    last_error: str | None
    created_at: float
    updated_at: float
    triggered_at: float | None = None
    """When a trigger made the job due (None: no trigger waits)."""
    idempotency_key: str | None = None
    """The key of the request that added it (None: none given); not shown."""
    trigger_key: str | None = None
    """The key of its last keyed trigger (None: none yet); not shown."""

    def to_dict(self) -> dict[str, Any]:
        """The job as the CLI and HTTP API show it (its idempotency key left out: it is
        the adding client's, as a request's header is)."""
        data = asdict(self)
        data["job_id"] = data.pop("id")
        del data["idempotency_key"], data["trigger_key"]
        return data


@dataclass(frozen=True)
class CronRunRecord:
    """One run of a job."""

    id: str
    job_id: str
    scheduled_for: float
    started_at: float
    finished_at: float | None
    status: str
    result: str | None
    error: str | None
    owner: str | None
    lease_until: float | None
    attempts: int
    takeovers: int = 0
    """How many times the run was taken over (its runtime died, or stalled past its lease,
    inside it)."""

    def to_dict(self) -> dict[str, Any]:
        """The run as the CLI and HTTP API show it (the owner's lease left out)."""
        data = asdict(self)
        data["run_id"] = data.pop("id")
        del data["owner"], data["lease_until"]
        return data


@dataclass(frozen=True)
class Occurrence:
    """What firing one due job does, as the cron rules decided it."""

    job_changes: dict[str, Any]
    """Columns of the job to set (``next_run_at`` at least)."""
    run_status: str | None
    """``running`` (the firing runtime runs it now), ``error`` (recorded failed at once),
    or None (no run: a missed occurrence skipped)."""
    run_error: str | None = None
    """The error of a run recorded as failed at once."""


class Removal(NamedTuple):
    """What a job's removal (:meth:`CronStore.delete`) did."""

    removed: bool
    """The job was there, and is gone with its runs."""
    live_run: str | None
    """The run in progress that kept the job (nothing removed); None otherwise."""


class _RunStarted(Exception):
    """Inside a removal: a run of the job started meanwhile (undoes the removal)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


@dataclass(frozen=True)
class RunEnd:
    """A run ended at its takeover instead of being run again, as the cron rules decided."""

    error: str
    """The run's error."""
    job_changes: dict[str, Any]
    """Columns of its job to set (its failure counted)."""


def run_cursor(run: CronRunRecord) -> str:
    """The cursor of the runs older than ``run`` (:meth:`CronStore.runs`' ``before``)."""
    return paging.Keyset(run.started_at, run.id).token()


def _job(r: CronJob) -> CronJobRecord:
    return CronJobRecord(r.id, r.name, r.cron, r.timezone, r.prompt, bool(r.active), r.delivery,
                         r.retry_count, r.next_run_at, r.last_run_at, r.last_result,
                         r.last_error, r.created_at, r.updated_at, r.triggered_at,
                         r.idempotency_key, r.trigger_key)


def _run(r: CronRun) -> CronRunRecord:
    return CronRunRecord(r.id, r.job_id, r.scheduled_for, r.started_at, r.finished_at, r.status,
                         r.result, r.error, r.owner, r.lease_until, r.attempts, r.takeovers)


class CronStore:
    """Cron jobs and runs on one database; writes go through the group-commit writer."""

    def __init__(self, tables: Tables, writer: GroupCommitWriter) -> None:
        self.t = tables
        self.writer = writer

    # -- jobs ------------------------------------------------------------------------------

    def create(self, job: CronJobRecord, also: Callable[[], object] | None = None
               ) -> CronJobRecord:
        """Insert a job (the caller validated it); ``also``, the caller's writes of it (its
        session), in the same transaction: both commit or neither does. A job whose
        ``idempotency_key`` another job has already is not inserted: that job is returned
        (its id not ``job.id``), nothing written; a request committing that key meanwhile
        is waited for (PostgreSQL) or came first (SQLite's one writer). A taken id is a
        :class:`DuplicateError`; any other refusal of the row (a NOT NULL value missing)
        a :class:`DatabaseFailed`, nothing written.

        Only the key's conflict is ignored (its conflict target named): an insert that
        ignored every conflict was, on SQLite, ``INSERT OR IGNORE``, which passes over a
        NOT NULL violation too, and the row the table refused was answered as a taken id."""
        values = asdict(job)
        j = self.t.cron_job
        key = job.idempotency_key

        def the_keys() -> CronJobRecord | None:
            earlier = j.get_or_none(j.idempotency_key == key) if key is not None else None
            return _job(earlier) if earlier is not None else None

        def op() -> CronJobRecord:
            earlier = the_keys()
            if earlier is not None:
                return earlier
            if j.select().where(j.id == job.id).exists():
                raise DuplicateError("cron job", "id", job.id)
            insert = unless_present(j.insert(**values), j.idempotency_key)
            if not insert.as_rowcount().execute():  # the key, committed meanwhile (PostgreSQL)
                earlier = the_keys()
                if earlier is None:  # its job removed since: the key was taken all the same
                    raise DuplicateError("cron job", "idempotency_key", key)
                return earlier
            if also is not None:
                also()
            self._notify()
            return job
        return self.writer.call(op)

    def _notify(self) -> None:
        """PostgreSQL: have the current transaction wake the delivering runtimes' schedules
        (:data:`~.inbox_notify.SCHEDULES_CHANNEL`), so a job added or triggered in a
        send-only process runs at once, not at their next poll."""
        if is_postgres(self.t.db):
            self.t.db.execute_sql(SCHEDULES_NOTIFY_SQL)

    def get(self, job_id: str) -> CronJobRecord | None:
        """The job with this id, or None."""
        j = self.t.cron_job
        row = j.get_or_none(j.id == job_id)
        return _job(row) if row else None

    def jobs(self, *, active_only: bool = False, limit: int | None = None,
             offset: int = 0, after: str | None = None) -> list[CronJobRecord]:
        """Jobs, soonest due first (paused ones last); at most ``limit`` (all: None) from
        the ``offset``-th on (bounds: :mod:`.paging`).

        With ``after`` (a job id, :func:`.paging.key_after`; ``""``: from the first),
        the jobs whose id sorts after it, in id order instead: the one order a job never
        moves in. In due order a job moves as it fires (to its next time), as it is
        paused (last) or triggered (first), so the pages of a walk by offset skipped one
        job and repeated another; by id, a job there through the walk is on one page (one
        added or removed meanwhile may be on none). A walk of the primary key."""
        limit, offset = paging.limit(limit), paging.offset(offset)
        position = paging.key_after(after)
        j = self.t.cron_job
        if position is None:
            q = j.select().order_by(j.active.desc(), j.next_run_at, j.id)
        else:
            q = j.select().where(j.id > position).order_by(j.id)
        if active_only:
            q = q.where(j.active == True)  # noqa: E712
        return [_job(r) for r in paging.cut(q, limit, offset)]

    def next_run(self) -> float | None:
        """When the soonest active job is due (None: none is), a job waiting for its run
        taken over left out (:meth:`_not_waiting`): one row's read, for the runtime that
        arms a timer for it (armed for a waiting job's time, past, it fired again at once,
        and again)."""
        j = self.t.cron_job
        active = j.active == True  # noqa: E712
        return j.select(pw.fn.MIN(j.next_run_at)).where(active, self._not_waiting()).scalar()

    def _not_waiting(self) -> Any:
        """The condition of a job not waiting for a run of its that was taken over.

        A run taken over (its runtime died in it: its ``takeovers``) and still ``running``
        holds its job back: the job's due occurrence is not fired beside it (two runs of
        one job at once), nor refused as the "still active" error run (lost to the crash),
        but waits, due, until that run ends. A live run never taken over does not: the
        cron rules decide about the occurrence due meanwhile. One uncorrelated subquery
        over the running runs."""
        r, j = self.t.cron_run, self.t.cron_job
        taken_over = r.select(r.job_id).where(r.status == "running", r.takeovers > 0)
        return j.id.not_in(taken_over)

    def update(self, job_id: str, now: float, *, if_active: bool = False,
               if_idle: bool = False, if_triggered: bool = False,
               **changes: Any) -> CronJobRecord | None:
        """Set columns of a job; the updated job, or None when there is no such job (with
        ``if_active``: no such active job, with ``if_idle``: no such job without a run
        ``running``, with ``if_triggered``: no such job with a trigger waiting, as it is
        when the write runs)."""
        j, r = self.t.cron_job, self.t.cron_run
        which = (j.id == job_id) & (j.active == True) if if_active else j.id == job_id  # noqa: E712
        if if_triggered:
            which &= j.triggered_at.is_null(False)
        if if_idle:
            which &= j.id.not_in(r.select(r.job_id).where(r.job_id == job_id,
                                                          r.status == "running"))
        lock_first = if_idle and is_postgres(self.t.db)

        def op() -> CronJobRecord | None:
            if lock_first:
                # The job's row locked first, its runs read by the next statement: a fire
                # holding the row (its run not committed yet) is waited for, and its run
                # seen. Waited for by the UPDATE itself, PostgreSQL re-checked the row
                # alone against the runs as they were before the wait.
                j.select(j.id).where(j.id == job_id).for_update().execute()
            if not j.update(updated_at=now, **changes).where(which).execute():
                return None
            self._notify()
            return _job(j.get(j.id == job_id))
        return self.writer.call(op)

    def delete(self, job_id: str, now: float) -> Removal:
        """Remove a job and its runs, unless a run of it is in progress on a live runtime
        (``running``, owned, its lease not out at ``now``): then nothing is removed and
        :class:`Removal` names that run. Removed with its job, that run's turn went on,
        its commit found no record to finish and was undone: its reply and transcript
        lost, the removal answered as done. A run whose lease ran out (its runtime is
        gone) or that was handed back runs nowhere, and goes with its job."""
        j, r = self.t.cron_job, self.t.cron_run

        def op() -> Removal:
            live = self._live_run(job_id, now)
            if live is not None:
                return Removal(False, live)
            # The runs, then the job: the order finish_op and take_over lock them in.
            r.delete().where(r.job_id == job_id).execute()
            removed = bool(j.delete().where(j.id == job_id).execute())
            # On PostgreSQL the job's delete waits for a fire holding its row, whose run
            # the first delete could not see (not committed yet): that run is live, and
            # the whole removal is undone (the writer's savepoint) rather than lose it.
            live = self._live_run(job_id, now)
            if live is not None:
                raise _RunStarted(live)
            r.delete().where(r.job_id == job_id).execute()
            return Removal(removed, None)

        try:
            return self.writer.call(op)
        except _RunStarted as exc:
            return Removal(False, exc.run_id)

    def _live_run(self, job_id: str, now: float) -> str | None:
        """The id of the job's run in progress on a live runtime, if any."""
        r = self.t.cron_run
        row = r.select(r.id).where(r.job_id == job_id, r.status == "running",
                                   r.owner.is_null(False), r.lease_until >= now).first()
        return None if row is None else str(row.id)

    def move_due(self, now: float, written_after: float,
                 moved_to: Callable[[CronJobRecord], float | None]) -> list[CronJobRecord]:
        """Move the next run of the active jobs last written after ``written_after`` (by a
        clock that read later than this one) to ``moved_to(job)`` (None: keep it), at
        ``now``; the jobs moved."""
        j = self.t.cron_job
        late = j.updated_at > written_after
        if not firing.has_due_moves(j, late, _job, moved_to):
            return []  # the usual case (and every look after a move): no write to queue
        return self.writer.call(lambda: firing.move_due(j, late, _job, moved_to,
                                                        {"updated_at": now}))

    # -- runs ------------------------------------------------------------------------------

    def runs(self, job_id: str | None = None, *, limit: int | None = 50,
             offset: int = 0, before: str | paging.Keyset | None = None
             ) -> list[CronRunRecord]:
        """Runs, newest first (ties by id); at most ``limit`` (all: None) older than the
        cursor ``before`` (:func:`run_cursor` of a page's last run; None: from the newest),
        from the ``offset``-th of those on (bounds and cursor: :mod:`.paging`). A run's
        start never changes, so a walk by the cursor lists each run once however many
        are recorded meanwhile (an offset counts from the newest, and each new run shifts
        the next page by one)."""
        limit, offset = paging.limit(limit), paging.offset(offset)
        position = paging.keyset(before, "before")
        r = self.t.cron_run
        q = r.select().order_by(r.started_at.desc(), r.id.desc())
        if job_id is not None:
            q = q.where(r.job_id == job_id)
        if position is not None:
            q = q.where(pw.Tuple(r.started_at, r.id) < pw.Tuple(position.at, position.id))
        return [_run(x) for x in paging.cut(q, limit, offset)]

    def last_runs(self, job_id: str) -> list[CronRunRecord]:
        """The job's newest runs, newest first: the :data:`~.retention.KEPT_CRON_RUNS` a
        prune always keeps (a walk of the ``(job_id, started_at, id)`` index)."""
        return self.runs(job_id, limit=retention.KEPT_CRON_RUNS)

    def running(self, job_id: str) -> CronRunRecord | None:
        """The job's run still ``running``, if any (its lease may have run out)."""
        r = self.t.cron_run
        row = r.select().where(r.job_id == job_id, r.status == "running").first()
        return _run(row) if row else None

    def fire_due(self, now: float, owner: str, lease: float,
                 decide: Callable[[CronJobRecord, CronRunRecord | None], Occurrence]
                 ) -> list[CronRunRecord]:
        """Fire every due job once; return the runs this caller recorded (to run or failed).

        ``decide(job, running_run)`` runs inside the transaction, with the
        job's run still marked running (if any), and says what the
        occurrence does. A job waiting for a run of its that was taken over is not
        due yet (:meth:`_not_waiting`): take runs over (:meth:`take_over`) first.
        """
        if not firing.has_due(self.t.cron_job, now, self._not_waiting()):
            return []  # the usual look: nothing due, no write to queue
        r = self.t.cron_run
        plans: dict[str, Occurrence] = {}
        recorded: list[CronRunRecord] = []

        def advance(job: CronJobRecord) -> dict[str, Any]:
            plans[job.id] = plan = decide(job, self.running(job.id))
            return {"updated_at": now, **plan.job_changes}

        def on_fire(job: CronJobRecord) -> None:
            plan = plans[job.id]
            if plan.run_status is None:
                return
            due = job.next_run_at if job.next_run_at is not None else now
            live = plan.run_status == "running"
            run = CronRunRecord(f"{job.id}@{int(due * 1000)}", job.id, due, now,
                                None if live else now, plan.run_status, None, plan.run_error,
                                owner if live else None, now + lease if live else None,
                                job.retry_count + 1)
            # The rows it wrote, not SQLite's lastrowid (an earlier insert's, when this
            # occurrence's run exists already: its turn would run, never recorded).
            if unless_present(r.insert(**asdict(run)), r.id).as_rowcount().execute():
                recorded.append(run)

        def op() -> list[CronRunRecord]:
            firing.fire_due(self.t.cron_job, now, _job, advance, on_fire,
                            self._not_waiting())
            return recorded
        # Its runs are leased here: taken as failed, a fire that then committed left them
        # with nothing to run or renew them until their leases ran out.
        return self.writer.call_landed(op)

    def take_over(self, now: float, owner: str, lease: float,
                  end: Callable[[CronRunRecord, CronJobRecord], RunEnd | None] = (
                      lambda _run, _job: None)) -> list[CronRunRecord]:
        """Lease every running run whose owner's lease ran out (its runtime died), or that
        was handed back (:meth:`hand_back`) and is due; the runs taken, ``running`` (to
        run) or ``error``. A takeover counts in ``takeovers`` only when the run had an
        owner: a handed-back run's runtime did not die in it.

        ``end(run, job)`` (the run as taken over, its attempts and takeovers counting this
        one)
        runs inside the transaction: a :class:`RunEnd` ends the run as an error run, its
        job updated in the same transaction, instead of leasing it to be run again. A run
        whose job is gone is deleted, not taken."""
        r, j = self.t.cron_run, self.t.cron_job
        lapsed = (r.status == "running") & (r.lease_until < now)
        if not r.select().where(lapsed).exists():
            return []  # the usual look: every run alive (or none), no write to queue

        def take(row: CronRun) -> CronRunRecord | None:
            if not j.select().where(j.id == row.job_id).exists():
                # Its job was removed (a removal that raced its fire, in an earlier
                # version): as a removal does, the run goes. Leased, its turn found no job
                # and never finished it, and it was taken over at each lease's end.
                r.delete().where(r.id == row.id, r.status == "running").execute()
                return None
            died = row.owner is not None  # else handed back: no death to count
            run = replace(_run(row), owner=owner, lease_until=now + lease,
                          attempts=row.attempts + 1, takeovers=row.takeovers + died)
            if not r.update(owner=owner, lease_until=run.lease_until,
                            attempts=run.attempts, takeovers=run.takeovers).where(
                    r.id == row.id, r.owner == row.owner, r.status == "running",
                    r.lease_until == row.lease_until).execute():
                return None  # another runtime took it meanwhile
            query = j.select().where(j.id == row.job_id)
            if is_postgres(self.t.db):
                query = query.for_update()  # the run's row, then its job's: as finish_op
            job_row = query.first()
            ending = end(run, _job(job_row)) if job_row is not None else None
            if ending is None:
                return run
            r.update(status="error", error=ending.error, finished_at=now,
                     lease_until=None).where(r.id == row.id).execute()
            j.update(updated_at=now, **ending.job_changes).where(j.id == row.job_id).execute()
            return replace(run, status="error", error=ending.error, finished_at=now,
                           lease_until=None)

        def op() -> list[CronRunRecord]:
            taken = [take(row) for row in r.select().where(lapsed)]
            return [run for run in taken if run is not None]
        return self.writer.call_landed(op)  # it leases runs, as fire_due

    def hand_back(self, run_id: str, owner: str, due: float) -> None:
        """Give a run ``owner`` holds back unrun, to be taken (:meth:`take_over`) once
        ``due`` has passed: its failure's record was refused, or the runtime's graceful stop
        cut its turn short. Its owner is cleared, so that
        takeover counts no death of its runtime. Raises :class:`CronRunLost` unless
        ``owner`` still holds it."""
        r = self.t.cron_run

        def op() -> None:
            if not r.update(owner=None, lease_until=due).where(
                    r.id == run_id, r.owner == owner, r.status == "running").execute():
                raise CronRunLost(run_id, owner)
        self.writer.call(op)

    def running_owners(self) -> set[str]:
        """The owners of runs still ``running``."""
        r = self.t.cron_run
        return {row.owner for row in r.select(r.owner).where(r.status == "running").distinct()
                if row.owner}

    def expire_owners(self, owners: set[str], now: float) -> int:
        """Make the running runs of ``owners`` (runtimes known dead) claimable now."""
        r = self.t.cron_run
        return self.writer.call(lambda: r.update(lease_until=now - 1).where(
            r.status == "running", r.owner.in_(sorted(owners))).execute())

    def expire_leases(self, now: float) -> int:
        """Make every running run claimable now (start-up of an exclusive runtime)."""
        r = self.t.cron_run
        return self.writer.call(lambda: r.update(lease_until=now - 1).where(
            r.status == "running").execute())

    def renew(self, owner: str, run_ids: list[str], until: float) -> int:
        """Extend the leases ``owner`` holds on these running runs; return how many."""
        r = self.t.cron_run
        if not run_ids:
            return 0
        return self.writer.call(lambda: r.update(lease_until=until).where(
            r.id.in_(run_ids), r.owner == owner, r.status == "running").execute())

    def finish_op(self, run_id: str, owner: str, now: float, status: str, *,
                  result: str | None = None, error: str | None = None,
                  job_changes: Callable[[CronJobRecord], dict[str, Any]] = lambda _job: {}
                  ) -> Callable[[], CronJobRecord | None]:
        """An operation (for the writer, or a turn's commit) that finishes a run.

        Fenced: raises :class:`CronRunLost` (and so undoes the transaction it
        runs in) unless ``owner`` still holds the run. Returns the job as
        updated with ``job_changes(job)``, or None if the job is gone.
        """
        if status not in RUN_STATES[1:]:
            raise ValueError(f"a run finishes as success or error, not {status!r}")
        r, j = self.t.cron_run, self.t.cron_job

        def op() -> CronJobRecord | None:
            run = r.get_or_none(r.id == run_id)
            if not r.update(status=status, result=result, error=error, finished_at=now,
                            lease_until=None).where(
                    r.id == run_id, r.owner == owner, r.status == "running").execute():
                raise CronRunLost(run_id, owner)
            query = j.select().where(j.id == run.job_id)
            if is_postgres(self.t.db):
                # Locked from this read to the commit: what another runtime commits
                # meanwhile (an operator's pause) waits, and is not written over with
                # changes decided on the row as it was before it.
                query = query.for_update()
            row = query.first()
            if row is None:
                return None
            job = _job(row)
            j.update(updated_at=now, **job_changes(job)).where(j.id == job.id).execute()
            return _job(j.get(j.id == job.id))
        return op

    def finish(self, run_id: str, owner: str, now: float, status: str, *,
               result: str | None = None, error: str | None = None,
               job_changes: Callable[[CronJobRecord], dict[str, Any]] = lambda _job: {}
               ) -> CronJobRecord | None:
        """Finish a run on its own (a failed run: no transcript to commit with it)."""
        # Its outcome decides what follows (the retry's wake-up, the announcement).
        return self.writer.call_landed(self.finish_op(run_id, owner, now, status,
                                                      result=result, error=error,
                                                      job_changes=job_changes))
