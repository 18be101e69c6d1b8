"""Managing cron job definitions: add, list, pause, resume, trigger, remove, runs.

Used by the runtime (``rt.cron``) and by the ``kinbox cron`` commands, which
work on the database directly while a runtime runs elsewhere: everything a
definition change needs is the tables, a clock and an id source. A new job
is validated completely (expression with APScheduler's ``CronTrigger``, time
zone, name, prompt, delivery mode) before anything is written, and gets its
session ``cron-<job_id>`` (kind ``cron``, ``default`` project) at once, so it
is listed like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..persistence import (
    CronJobRecord,
    CronStore,
    DuplicateError,
    InvalidArgument,
    SessionStore,
    paging,
    run_cursor,
)
from ..transport.page_limits import RUNS_LIMIT
from . import cron_rules as rules
from .ids import short
from .triggers import next_fire_or_never
from .validation import lookup_key, quoted, unstorable

DEFAULT_PROJECT = "default"
TRIGGER_TRIES = 3
"""Looks a trigger takes at its job: one found idle whose write then met a run started
meanwhile, or a pause, looks again (which says which it met)."""


def _no_wake(_job_id: str, _next_run_at: float | None) -> None:
    pass


def _whole(check: Callable[[object], int | None], value: object) -> int | None:
    """``value`` by the stores' paging rule (:mod:`kinbox.persistence.paging`); None when
    it breaks it."""
    try:
        return check(value)
    except InvalidArgument:
        return None


def _check_limit(limit: object) -> None:
    found = _whole(paging.limit, limit)
    if found is None or found > RUNS_LIMIT:  # a listing's own cap below the stores'
        raise rules.InvalidCronJob("limit", f"give a whole number from 1 to {RUNS_LIMIT}, "
                                            f"not {quoted(limit)}")


def _check_offset(offset: object) -> None:
    if _whole(paging.offset, offset) is None:
        raise rules.InvalidCronJob("offset", "give a whole number from 0 to "
                                             f"{paging.PAGE_NUMBER_MAX}, not {quoted(offset)}")


def _cut(records: list[Any], limit: int) -> tuple[list[dict[str, Any]], bool]:
    """A page read one record past ``limit``: the page, and whether more follow."""
    return [r.to_dict() for r in records[:limit]], len(records) > limit


class RunList(list[dict[str, Any]]):
    """A page of run records; :attr:`before`, the cursor of the page after it (None on the
    last page)."""

    def __init__(self, runs: list[dict[str, Any]], before: str | None) -> None:
        super().__init__(runs)
        self.before = before
        """Hand back as ``before`` for the older runs: each run is on one page."""


class JobList(list[dict[str, Any]]):
    """A page of jobs; :attr:`after`, the cursor of the page after it (None on the last
    page, and on a page in due order, which no cursor continues)."""

    def __init__(self, jobs: list[dict[str, Any]], after: str | None) -> None:
        super().__init__(jobs)
        self.after = after
        """Hand back as ``after`` for the jobs past these in id order: each job is on one
        page however the jobs fire meanwhile."""


class Added(NamedTuple):
    """What an add did."""

    job: dict[str, Any]
    """The job, as :meth:`CronJobs.job` shows it."""
    new: bool
    """Added by this call (False: an earlier add's, with the same idempotency key)."""


class CronJobs:
    """Cron job definitions on one database."""

    def __init__(self, store: CronStore, sessions: SessionStore, now: Callable[[], float],
                 new_id: Callable[[], str],
                 on_change: Callable[[str, float | None], None] = _no_wake) -> None:
        self.store = store
        self.sessions = sessions
        self.now = now
        self.new_id = new_id
        self.on_change = on_change
        """Told of a job whose next run changed, by its id and next run (None: none, or
        the job is gone); the runtime re-arms APScheduler."""

    def add(self, name: Any, cron: Any, prompt: Any, *, delivery: Any = "announce",
            timezone: Any = "UTC", active: bool = True,
            idempotency_key: Any = None) -> dict[str, Any]:
        """Create a job; nothing is written if any field is invalid. With an
        ``idempotency_key`` another add gave, that add's job is answered (the same
        definition: a retry whose first answer was lost) or :class:`CronJobConflict`
        raised (another), and nothing is written."""
        return self.added(name, cron, prompt, delivery=delivery, timezone=timezone,
                          active=active, idempotency_key=idempotency_key).job

    def added(self, name: Any, cron: Any, prompt: Any, *, delivery: Any = "announce",
              timezone: Any = "UTC", active: bool = True,
              idempotency_key: Any = None) -> Added:
        """:meth:`add`, saying whether the job is new or an earlier add's."""
        name, prompt, delivery = rules.check_fields(name, prompt, delivery)
        key = rules.check_idempotency_key(idempotency_key)
        if not isinstance(timezone, str) or unstorable(timezone) is not None:
            raise rules.InvalidCronJob("timezone", "give an IANA time zone name")
        now = self.now()
        upcoming = next_fire_or_never(cron, now, timezone)  # parses it: malformed, never fires
        job = CronJobRecord(f"cj_{short(self.new_id(), 10)}", name, cron.strip(), timezone, prompt,
                            bool(active), delivery, 0, upcoming if active else None,
                            None, None, None, now, now, idempotency_key=key)
        # The job and its session in one transaction: made in two, a failed session write
        # answered the add as failed with the job committed, and the caller's retry added
        # a second job, each run of the schedule twice.
        stored = self.store.create(job, also=lambda: self._create_session_now(job, now))
        if stored.id != job.id:  # the key's earlier add
            assert key is not None
            differ = rules.differing_fields(stored.to_dict(), job.to_dict())
            if differ:
                raise rules.CronJobConflict(stored.id, key, differ)
            return Added(stored.to_dict(), False)
        self.on_change(job.id, job.next_run_at)
        return Added(job.to_dict(), True)

    def ensure_session(self, job: CronJobRecord) -> str:
        """The job's session, created if it does not exist yet."""
        sid = rules.session_id_for(job.id)
        if self.sessions.session(sid) is None:
            self.sessions.writer.call(lambda: self._create_session_now(job, self.now()))
        return sid

    def _create_session_now(self, job: CronJobRecord, now: float) -> None:
        """Create the job's session inside the caller's transaction, unless it exists."""
        try:
            self.sessions.create_session_now(rules.session_id_for(job.id), DEFAULT_PROJECT,
                                             f"Cron: {job.name}", "cron", now,
                                             config={"cron_job_id": job.id})
        except DuplicateError:
            pass  # another runtime created it first

    def get(self, job_id: object) -> CronJobRecord:
        """The job; :class:`CronJobNotFound` if there is none."""
        key = lookup_key(job_id)
        job = self.store.get(key) if key is not None else None
        if job is None:
            raise rules.CronJobNotFound(str(job_id))
        return job

    def job(self, job_id: str) -> dict[str, Any]:
        """One job as a dict."""
        return self.get(job_id).to_dict()

    def jobs(self, limit: int | None = None, offset: int = 0) -> list[dict[str, Any]]:
        """Jobs, soonest due first, paused ones last: every one, or at most ``limit`` (1 to
        :data:`~kinbox.transport.RUNS_LIMIT`) from the ``offset``-th on."""
        if limit is not None:
            _check_limit(limit)
        _check_offset(offset)
        return [j.to_dict() for j in self.store.jobs(limit=limit, offset=offset)]

    def jobs_page(self, limit: int, offset: int = 0, *, after: str | None = None
                  ) -> tuple[JobList, bool]:
        """At most ``limit`` jobs (1 to :data:`~kinbox.transport.RUNS_LIMIT`) in listing
        order from the ``offset``-th on, or in id order past the cursor ``after`` (a
        page's :attr:`JobList.after`; ``""``: from the first), not both; and whether more
        follow: one read, one job past the page. Walk by the cursor: a job that fires
        between two pages moves in due order (to its next time), and the offset's next
        page skips one job and a later one repeats it; a job's id never moves."""
        _check_limit(limit)
        _check_offset(offset)
        if after is not None:
            if offset:
                raise rules.InvalidCronJob("after", "give after or offset, not both")
            try:
                paging.key_after(after)
            except InvalidArgument:
                raise rules.InvalidCronJob("after", "give the cursor a page of jobs "
                                                    "named (a job id, or empty to "
                                                    "start)") from None
        records = self.store.jobs(limit=limit + 1, offset=offset, after=after)
        page, more = _cut(records, limit)
        cursor = records[limit - 1].id if more and after is not None else None
        return JobList(page, cursor), more

    def pause(self, job_id: str) -> dict[str, Any]:
        """Stop a job's schedule (its runs and session stay)."""
        self.get(job_id)
        return self._changed(job_id, self.store.update(job_id, self.now(), active=False,
                                                       next_run_at=None, triggered_at=None))

    def resume(self, job_id: str) -> dict[str, Any]:
        """Restart a paused or deactivated job from its next regular time, retries reset;
        an active job whose trigger waits keeps it (and its due time)."""
        current = self.get(job_id)
        now = self.now()
        if current.active and current.triggered_at is not None:
            # Moved to the regular time, the trigger waiting for a delivering runtime was
            # dropped, answered "resumed": the run asked for never happened.
            kept = self.store.update(job_id, now, if_active=True, if_triggered=True,
                                     retry_count=0, last_error=None)
            if kept is not None:
                return self._changed(job_id, kept)
        upcoming = next_fire_or_never(current.cron, now, current.timezone)
        return self._changed(job_id, self.store.update(
            job_id, now, active=True, retry_count=0, last_error=None, next_run_at=upcoming,
            triggered_at=None))

    def trigger(self, job_id: str, idempotency_key: Any = None) -> dict[str, Any]:
        """Make an active job due now (a runtime with a brain runs it at its next look);
        :class:`CronJobPaused` for a paused job, :class:`CronRunInProgress` while a run of
        it is in progress. ``idempotency_key`` (checked as an add's): the key of the job's
        last keyed trigger answers the job as it is, neither triggered again nor refused
        for the run that trigger started (a client retrying after a lost answer)."""
        key = rules.check_idempotency_key(idempotency_key)
        if key is not None and (current := self.get(job_id)).trigger_key == key:
            return current.to_dict()
        keyed = {} if key is None else {"trigger_key": key}
        for _ in range(TRIGGER_TRIES):
            self._check_triggerable(job_id)
            now = self.now()
            # Only while active and idle, as the write finds it: a pause committed since
            # the look above (another operator, another process) was otherwise answered
            # "triggered", its job left paused with a due time; a run started meanwhile
            # made the trigger that run's "still active" error run.
            job = self.store.update(job_id, now, if_active=True, if_idle=True,
                                    next_run_at=now, triggered_at=now, **keyed)
            if job is not None:
                return self._changed(job_id, job)
        self._check_triggerable(job_id)
        raise rules.CronRunInProgress(job_id, None)  # each try found a run, gone at the look

    def _check_triggerable(self, job_id: str) -> None:
        """Refuse a trigger of a job that is gone, paused, or has a run in progress (written,
        that trigger was the "still active" error run at the next look: answered
        "triggered", the job never ran for it)."""
        if not self.get(job_id).active:
            raise rules.CronJobPaused(job_id)
        running = self.store.running(job_id)
        if running is not None:
            raise rules.CronRunInProgress(job_id, running.id)

    def remove(self, job_id: str) -> dict[str, Any]:
        """Delete a job and its run records (its session and transcript stay);
        :class:`CronRunInProgress` while a run of it is in progress (its result would be
        lost with it): remove it once that run ended."""
        if lookup_key(job_id) is None:
            raise rules.CronJobNotFound(str(job_id))
        removal = self.store.delete(job_id, self.now())
        if removal.live_run is not None:
            raise rules.CronRunInProgress(job_id, removal.live_run, action="remove")
        if not removal.removed:
            raise rules.CronJobNotFound(str(job_id))
        self.on_change(job_id, None)
        return {"job_id": job_id, "removed": True}

    def runs(self, job_id: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Run records, newest first (of one job, or of all); at most ``limit``, 1 to
        :data:`~kinbox.transport.RUNS_LIMIT`."""
        return self.runs_page(job_id, limit)[0]

    def runs_page(self, job_id: str | None = None, limit: int = 50, offset: int = 0,
                  *, before: str | None = None) -> tuple[RunList, bool]:
        """Run records, newest first (ties by id), at most ``limit`` older than the cursor
        ``before`` (a page's :attr:`RunList.before`; None: from the newest) or from the
        ``offset``-th on (not both), and whether older ones follow. Walk by the cursor:
        runs recorded meanwhile shift an offset's pages, repeating a run."""
        _check_limit(limit)
        _check_offset(offset)
        if before is not None:
            if offset:
                raise rules.InvalidCronJob("before", "give before or offset, not both")
            try:
                paging.keyset(before, "before")
            except InvalidArgument:
                raise rules.InvalidCronJob("before", "give the cursor a page of runs "
                                                     "named") from None
        if job_id is not None:
            self.get(job_id)
        records = self.store.runs(job_id, limit=limit + 1, offset=offset, before=before)
        page, more = _cut(records, limit)
        return RunList(page, run_cursor(records[limit - 1]) if more else None), more

    def _changed(self, job_id: str, job: CronJobRecord | None) -> dict[str, Any]:
        if job is None:
            raise rules.CronJobNotFound(job_id)
        self.on_change(job.id, job.next_run_at)
        return job.to_dict()
