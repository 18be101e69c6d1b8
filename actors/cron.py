"""User cron jobs (C1-C3): durable definitions, firing once, runs as turns, announcements.

The thin shell around :mod:`.cron_rules` (what a due job and a run's end do)
and :class:`~kinbox.persistence.CronStore` (the tables, which are the truth).
``tick`` is the whole cycle: renew the leases of the runs this runtime is
running, move on the jobs a clock set back since left due too late, take over
runs whose runtime died, fire every due job (compare-and-set: once across
processes; a job whose run is taken over waits for it, and fires when it
ends), and start each run as a direct turn in session
``cron-<job_id>`` (kind ``cron``, ``default`` project), opened by a system
reminder naming the job, the local time and the last run. APScheduler calls
``tick`` at each job's next time (system clock); with an injected clock the
runtime calls it whenever the clock moves.

A runtime without a brain (send-only) manages the definitions but never
fires or runs a job: another process with a brain does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from ..persistence import (
    CronJobRecord,
    CronRunLost,
    CronRunRecord,
    CronStore,
    Occurrence,
    PersistenceError,
    RunEnd,
    WriterClosed,
)
from . import cron_rules as rules
from .announcements import Announcements, Drained
from .brain_tasks import BrainAbandoned
from .context import RuntimeContext
from .cron_jobs import CronJobs, JobList, RunList
from .cron_run_ends import RunEnds, failure_changes, summary
from .direct_turn import DirectTurns
from .renewal_schedule import RenewalSchedule
from .schedule_driver import POLL_SECONDS, ScheduleDriver
from .steps import Blocking, Steps
from .triggers import local_time, next_fire
from .turn import Message, Turn
from .turn_run import refused_commit, refused_start

log = logging.getLogger("kinbox.cron")

class CronService:
    """Cron jobs of one runtime (``rt.cron``)."""

    def __init__(
        self,
        ctx: RuntimeContext,
        store: CronStore,
        turns: DirectTurns | None,
        *,
        use_apscheduler: bool,
        grace: float = rules.DEFAULT_GRACE_SECONDS,
        poll_seconds: float = POLL_SECONDS,
        announcements: Announcements | None = None,
        gone: Callable[[Iterable[str]], set[str]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.store = store
        self.turns = turns
        self.grace = grace
        self.announcements = announcements or Announcements()
        self.gone = gone
        """Which of some owners are dead runtimes (PostgreSQL life locks), if known."""
        self._driver = ScheduleDriver(
            self.tick,
            enabled=use_apscheduler and turns is not None,
            now=ctx.now,
            poll_seconds=poll_seconds,
        )
        self.ends = RunEnds(ctx, store, self.announcements, self._driver.wake_at)
        """How its runs end: recorded, handed back, announced (:mod:`.cron_run_ends`)."""
        self.definitions = CronJobs(
            store,
            ctx.store,
            ctx.now,
            ctx.new_id,
            on_change=lambda job_id, next_run_at: self._driver.wake_at(next_run_at, job_id),
        )
        self._mine: set[str] = set()  # runs this runtime is running (their leases to renew)
        self._renewal = RenewalSchedule()  # when renew_leases last renewed them
        self._lock = threading.Lock()
        self._tick_lock = threading.Lock()

    # -- life cycle ------------------------------------------------------------------------

    def start(self, *, exclusive: bool = False) -> None:
        """Start APScheduler, fire what is due (coalesced) and arm it for what is due next.

        ``exclusive``: this runtime owns the database alone (SQLite), so a run
        left ``running`` belongs to a process that is gone and is taken over now.
        """
        if self.turns is None:
            return
        if exclusive:
            self.store.expire_leases(self.ctx.now())
        self._driver.start()
        self.tick()  # fires what is due, and arms APScheduler for what is due next

    def stop(self) -> None:
        """Stop APScheduler; the tables keep every schedule and run."""
        self._driver.stop()

    def look_now(self) -> None:
        """Another process changed a job (PostgreSQL told this one): look at the job tables
        now, on the schedule's thread, not at the next poll."""
        self._driver.fire_soon()

    def keep_polling(self) -> None:
        """Fire a poll a wall clock set back stalled (the runtime's tick calls this)."""
        self._driver.keep_polling()

    # -- definitions (see :mod:`.cron_jobs`) -------------------------------------------------

    def add(
        self,
        name: Any,
        cron: Any,
        prompt: Any,
        *,
        delivery: Any = "announce",
        timezone: Any = "UTC",
        active: bool = True,
        idempotency_key: Any = None,
    ) -> dict[str, Any]:
        """Create a job (``cron`` a crontab expression); nothing is written if invalid.
        ``idempotency_key``: a repeat of this add (its answer lost) answers the job it
        added; another job with the key is :class:`CronJobConflict`."""
        added = self.definitions.added(
            name, cron, prompt, delivery=delivery, timezone=timezone, active=active,
            idempotency_key=idempotency_key,
        )
        if added.new:  # not an earlier add's job, answered again
            self.ctx.emit("cron_added", job_id=added.job["job_id"], cron=added.job["cron"])
        return added.job

    def job(self, job_id: str) -> dict[str, Any]:
        """One job."""
        return self.definitions.job(job_id)

    def jobs(self, limit: int | None = None, offset: int = 0) -> list[dict[str, Any]]:
        """Jobs, soonest due first, paused ones last: every one, or at most ``limit`` (1 to
        :data:`~kinbox.transport.RUNS_LIMIT`) from the ``offset``-th on."""
        return self.definitions.jobs(limit, offset)

    def jobs_page(self, limit: int, offset: int = 0, *, after: str | None = None
                  ) -> tuple[JobList, bool]:
        """At most ``limit`` jobs in listing order from the ``offset``-th on, or in id
        order past the cursor ``after`` (the page before's ``.after``; ``""``: from the
        first), read in one query, and whether more follow; a page read from a cursor
        has the next one's as ``.after`` (None on the last). A walk by the cursor lists
        each job once while jobs fire (each moves in due order as it does)."""
        return self.definitions.jobs_page(limit, offset, after=after)

    def pause(self, job_id: str) -> dict[str, Any]:
        """Stop a job's schedule (its runs and session stay)."""
        return self.definitions.pause(job_id)

    def resume(self, job_id: str) -> dict[str, Any]:
        """Restart a paused or deactivated job from its next regular time, retries reset."""
        return self.definitions.resume(job_id)

    def trigger(self, job_id: str, idempotency_key: str | None = None) -> dict[str, Any]:
        """Run a job now (its regular schedule is unchanged); :class:`CronJobPaused` for a
        paused job, :class:`CronRunInProgress` while a run of it is in progress. A repeat
        of the job's last keyed trigger (``idempotency_key``) answers the job as it is,
        running nothing again."""
        job = self.definitions.trigger(job_id, idempotency_key)
        try:
            self.tick()
        except PersistenceError as exc:
            # The trigger stands (committed, its wake-up armed): the schedule's next look
            # runs it. Raised, the caller heard "failed, try again", and its retry ran
            # the job twice.
            log.warning("cron job %s is triggered; the look that runs it failed (%s): the "
                        "next look runs it", job_id, type(exc).__name__)
        return job

    def remove(self, job_id: str) -> dict[str, Any]:
        """Delete a job and its run records (its session and transcript stay);
        :class:`CronRunInProgress` (nothing removed) while a run of it is in progress on a
        live runtime, whose reply would be lost."""
        return self.definitions.remove(job_id)

    def runs(self, job_id: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Run records, newest first (of one job, or of all)."""
        return self.definitions.runs(job_id, limit)

    def runs_page(
        self, job_id: str | None = None, limit: int = 50, offset: int = 0, *,
        before: str | None = None,
    ) -> tuple[RunList, bool]:
        """Run records, newest first, at most ``limit`` older than the cursor ``before``
        (the page before's ``.before``) or from the ``offset``-th on, and whether older
        ones follow; the page's ``.before`` is the next page's cursor (None on the last).
        A walk by the cursor lists each run once while runs are recorded."""
        return self.definitions.runs_page(job_id, limit, offset, before=before)

    def drain_announcements(self) -> Drained:
        """Take the queued announcements of finished runs (the UI's feed), oldest first;
        ``.dropped``: how many the full queue dropped since the last drain."""
        return self.announcements.drain()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no cron (or other direct) turn runs; False on timeout."""
        return self.turns is None or self.turns.wait_idle(timeout)

    # -- firing ----------------------------------------------------------------------------

    def tick(self, dead: set[str] | None = None) -> list[str]:
        """Renew, fire, take over and start runs; returns the ids of the runs started.
        ``dead``: the owners the caller found gone already (else they are looked up)."""
        if self.turns is None or self.ctx.closed.is_set():
            return []
        with self._tick_lock:
            now = self.ctx.now()
            lease = self.ctx.lease_seconds
            with self._lock:
                mine = sorted(self._mine)
            self.store.renew(self.ctx.owner, mine, now + lease)
            self._expire_the_gone(now, dead)
            self.store.move_due(
                now, now + rules.CLOCK_STEP_TOLERANCE, lambda job: self._after_step_back(job, now)
            )
            # Takeovers first: a job whose run is taken over waits for it, and its due
            # occurrence runs once it ended (fired first, the occurrence was refused as
            # "still active" and never ran).
            taken = self.store.take_over(
                now, self.ctx.owner, lease, lambda run, job: self._end_taken_over(run, job, now)
            )
            recorded = self.store.fire_due(
                now, self.ctx.owner, lease, lambda job, running: self._decide(job, running, now)
            )
        started = []
        for run in recorded:
            if run.status == "error":
                self.ends.refused(run)
                self.ctx.emit("cron_run_refused", job_id=run.job_id, run_id=run.id, error=run.error)
        for run in taken:
            if run.status == "error":
                log.warning("cron run %s ended: %s", run.id, run.error)
                self.ends.refused(run)
        for run in [
            *(r for r in recorded if r.status == "running"),
            *(r for r in taken if r.status == "running"),
        ]:
            with self._lock:
                self._mine.add(run.id)
            if self.turns.submit_steps(lambda run=run: self._execute(run)) is None:
                with self._lock:
                    self._mine.discard(run.id)
            else:
                started.append(run.id)
        if self._driver.enabled:
            # Re-arm APScheduler for the soonest job only: that wake-up's tick arms the
            # next, and the poll finds what other processes changed. Reading every active
            # job here, at each tick and poll, cost as much as there were jobs.
            self._driver.wake_at(self.store.next_run(), "cron-next")
        return started

    def renew_leases(self) -> None:
        """Keep the leases of the runs this runtime runs a lease ahead, every third of a
        lease (the runtime's tick calls this): :meth:`tick` alone renews them only at job
        times and on its poll, and a long run outlived its lease and was taken over and
        run again by another process while this one still ran it."""
        now = self.ctx.now()
        if not self._renewal.due(now, self.ctx.lease_seconds):
            return
        with self._lock:
            mine = sorted(self._mine)
        if not mine:
            return
        before = self._renewal.begin(now)
        try:
            self.store.renew(self.ctx.owner, mine, now + self.ctx.lease_seconds)
        except WriterClosed:
            pass  # stopping: the runs' records stay for whoever takes them over
        except PersistenceError as exc:
            self._renewal.refused(now, before)  # due again at the next tick
            log.error("cron lease renewal failed: %s; the next tick renews again", exc)

    def take_over_the_gone(self) -> list[str]:
        """Start now the runs of runtimes known dead (PostgreSQL life locks); the ids of
        the runs started. The runtime calls this with its takeover check of inbox rows
        (:mod:`.takeover`): :meth:`tick` alone came at job times and on cron's poll, so
        a live runtime took a dead one's run over up to a poll (15 s) late."""
        if self.turns is None or self.gone is None or self.ctx.closed.is_set():
            return []
        dead = self._the_gone()
        return self.tick(dead) if dead else []  # expires their runs, and takes them over

    def _the_gone(self) -> set[str]:
        """The other owners of running runs whose runtime is known dead."""
        if self.gone is None:
            return set()
        owners = self.store.running_owners() - {self.ctx.owner}
        return self.gone(owners) if owners else set()

    def _expire_the_gone(self, now: float, dead: set[str] | None) -> None:
        """Runs of a runtime known dead (``dead``, else looked up) are taken over now, not
        when their lease ends."""
        if dead is None:
            dead = self._the_gone()
        if dead:
            taken = self.store.expire_owners(dead, now)
            log.warning("taking over %d cron runs of %d runtime(s) that are gone", taken, len(dead))

    @staticmethod
    def _after_step_back(job: CronJobRecord, now: float) -> float | None:
        """Where a job written by a clock ahead of this one is due now (None: kept). A
        trigger waiting is due now: stamped with the clock ahead, it waited as long as
        that clock was ahead (or for the job's next regular time, if sooner)."""
        if job.triggered_at is not None:
            return rules.after_clock_step_back(job.updated_at, job.next_run_at, now, now)
        try:
            upcoming = next_fire(job.cron, now, job.timezone, inclusive=True)
        except (rules.InvalidCronExpression, rules.InvalidCronJob):
            return None  # a stored expression that no longer parses: firing ends it
        return rules.after_clock_step_back(job.updated_at, job.next_run_at, now, upcoming)

    def _decide(self, job: CronJobRecord, running: CronRunRecord | None, now: float) -> Occurrence:
        """Inside the firing transaction: what this occurrence of ``job`` does."""
        try:
            upcoming = next_fire(job.cron, now, job.timezone)
            recent = next_fire(job.cron, now - self.grace, job.timezone, inclusive=True)
        except (rules.InvalidCronExpression, rules.InvalidCronJob) as exc:  # a stored zone
            log.warning("cron job %s deactivated: %s", job.id, exc)
            return Occurrence(
                {
                    "active": False,
                    "next_run_at": None,
                    "triggered_at": None,
                    "last_error": rules.invalid_expression_error(exc.reason),
                },
                None,
            )
        decision = rules.on_due(
            job.next_run_at or now,
            now,
            next_regular=upcoming,
            previous_active=running is not None,
            grace=self.grace,
            recent_regular=recent,
            asked=job.triggered_at is not None,
        )
        changes: dict[str, Any] = {"next_run_at": upcoming, "active": upcoming is not None,
                                   "triggered_at": None}
        if decision.due is rules.Due.MISSED:
            log.info(
                "cron job %s missed its run at %s (beyond the grace time)", job.id, job.next_run_at
            )
            # A retry missed so ends its occurrence's retries: the next regular one is a new
            # occurrence, with all of its own (kept, they deactivated it at its first failure).
            return Occurrence({**changes, "retry_count": 0}, None)
        if decision.due is rules.Due.PREVIOUS_ACTIVE:
            return Occurrence({**changes, "last_error": decision.error}, "error", decision.error)
        return Occurrence({**changes, "last_run_at": now}, "running")

    @staticmethod
    def _end_taken_over(run: CronRunRecord, job: CronJobRecord, now: float) -> RunEnd | None:
        """Inside the takeover's transaction: does ``run`` end here (taken over once too
        often: its turn kills its runtime), a failure of ``job``, instead of running again?"""
        error = rules.after_takeover(run.takeovers)
        return None if error is None else RunEnd(error, failure_changes(job, error, now))

    # -- running ---------------------------------------------------------------------------

    def _execute(self, run: CronRunRecord) -> Steps[None]:
        """Run ``run`` as a turn and record how it ended (a :data:`.steps.Steps`: on the
        event loop of an async brain its waits hold no thread)."""
        assert self.turns is not None
        # A database error before the turn (stopping apart: the run stays ``running`` for
        # whoever takes it over) is no death of this runtime. Raised, the run sat out its
        # lease unrenewed and was taken over as a dead runtime's, five times at most.
        try:
            try:
                job = yield Blocking(partial(self.store.get, run.job_id))
            except WriterClosed:
                raise
            except PersistenceError as exc:  # no job to count a failure against
                yield Blocking(partial(self.ends.hand_back, run, "the read of its job", exc))
                return
            if job is None:
                return
            try:
                sid = yield Blocking(partial(self.definitions.ensure_session, job))
                recent = yield Blocking(partial(self.store.last_runs, job.id))
            except WriterClosed:
                raise
            except PersistenceError as exc:
                # A failed run whose turn never started, counted as a refused commit's is
                # (retried, deactivated at the limit; its record refused too, handed back).
                error = refused_start(exc).outcome.error or str(exc)
                yield Blocking(partial(self.ends.fail, job, run, error))
                return
            taken_over = run.takeovers > 0
            now = self.ctx.now()
            earlier = [
                r
                for r in recent
                if r.id != run.id
                and r.started_at <= run.started_at
                and r.error != rules.PREVIOUS_ACTIVE
            ]
            last = local_time(earlier[0].started_at, job.timezone) if earlier else None
            text = (
                rules.reminder(job.name, local_time(now, job.timezone), last) + "\n\n" + job.prompt
            )
            message = Message(
                run.id, "cron", text, None, {"job_id": job.id, "run_id": run.id, "cron": job.cron}
            )
            self.ctx.emit("cron_run_started", job_id=job.id, run_id=run.id, session_id=sid)

            def commit_ops(turn: Turn) -> list[Any]:
                result = summary(turn)
                return [
                    self.store.finish_op(
                        run.id,
                        self.ctx.owner,
                        self.ctx.now(),
                        "success",
                        result=result,
                        job_changes=lambda _j: {
                            "retry_count": 0,
                            "last_result": result,
                            "last_error": None,
                        },
                    )
                ]

            try:
                done = yield from self.turns.run_steps(sid, [message], commit_ops=commit_ops)
            except BrainAbandoned:
                # The runtime's stop cut the turn short (or its loop ended): nothing of it
                # committed. Left leased to this runtime, its next start took it over as a
                # dead runtime's, a death counted toward the run's failure at each deploy.
                yield Blocking(partial(self._hand_back_unrun, run))
                raise
            if done.committed:
                yield Blocking(
                    partial(self.ends.finished, job, run, "success", summary(done.turn), None)
                )
            elif not done.outcome.ok:
                yield Blocking(
                    partial(self.ends.fail, job, run, done.error or "the turn failed", done.kind)
                )
            else:
                # The commit was refused: a failed run as a brain's error is (fenced: a run
                # taken over meanwhile is the other runtime's). Left ``running``, its lease
                # ran out and it was taken over and run again, for ever, nothing counted.
                refused = done.commit_error or PersistenceError(done.error or "refused")
                error = refused_commit(refused).outcome.error or str(refused)
                yield Blocking(partial(self.ends.fail, job, run, error))
            if taken_over:
                yield Blocking(self._after_taken_over_run)
        finally:
            with self._lock:
                self._mine.discard(run.id)

    def _hand_back_unrun(self, run: CronRunRecord) -> None:
        """Give ``run``, which the runtime's stop ended unrun, back: due at once (for a
        runtime beside this one, or this one's next start), its takeover no death."""
        try:
            self.store.hand_back(run.id, self.ctx.owner, self.ctx.now() - 1)
        except CronRunLost:
            pass  # taken over meanwhile: the other runtime's now
        except PersistenceError as exc:  # the writer closed too: left to its lease
            log.info("cron run %s ended unrun by the stop stays leased (%s): it is taken "
                     "over at the next start", run.id, type(exc).__name__)

    def _after_taken_over_run(self) -> None:
        """A run taken over has ended: its job's occurrence that came due meanwhile
        waited for it (:meth:`CronStore.fire_due`) and fires now, not at the next look
        (a job time, the poll, an injected clock's move), which coalesced it with the
        occurrence due then."""
        try:
            self.tick()
        except WriterClosed:
            pass  # stopping: the job stays due for the next runtime's look
        except PersistenceError as exc:
            log.error(
                "cron could not look for the occurrence a taken-over run held back "
                "(the next look fires it): %s",
                exc,
            )
