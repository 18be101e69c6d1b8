"""Focal wake-ups and the heartbeat on durable schedules (FO6, FO7, C2).

The ``scheduled_jobs`` table is the truth: APScheduler's triggers compute
when a job is next due, and a ``BackgroundScheduler`` (with the system
clock) or the runtime's tick (with an injected clock) calls ``fire_due``,
which advances each due job by compare-and-set and enqueues its wake-up in
the same transaction, under an id unique to that occurrence, so a job fires
once however many runtimes share the database. The heartbeat's job, its
setting and what its occurrences do are :mod:`.focal_heartbeat_job`'s.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from typing import Any

from ..persistence import JobRecord, JobStore, NewMessage
from .context import RuntimeContext
from .cron_rules import CLOCK_STEP_TOLERANCE, InvalidCronExpression, after_clock_step_back
from .errors import ToolError
from .focal import FOCAL_ID, Focal, is_focal_chat
from .focal_heartbeat_job import Heartbeat, HeartbeatJob
from .focal_policy import NOTE_LIMIT
from .ids import short
from .outbox import Writes
from .schedule_driver import POLL_SECONDS, ScheduleDriver
from .triggers import next_fire, next_fire_or_never
from .validation import lookup_key, unstorable

log = logging.getLogger("kinbox.schedule")

MAX_WAKEUPS = 20
LATEST_WAKEUP = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC).timestamp()
"""The last time a one-shot wake-up may be set for."""
WAKEUP_KINDS = ("reminder", "check")
WAKEUP_MESSAGE_KIND = "focal_wakeup"
"""The kind of a wake-up occurrence's inbox row."""


def next_after(job: JobRecord, now: float) -> float | None:
    """When ``job`` is due next after firing at ``now`` (None: it is done).

    A stored expression today's rules refuse (written by an earlier kinbox) ends the
    job after this occurrence: raised here, inside the firing transaction, it undid the
    firing of every due job, at every look, for good.
    """
    if job.cron:
        try:
            return next_fire(job.cron, now)
        except InvalidCronExpression as exc:
            log.warning("wake-up %s ends: its stored expression no longer parses (%s)",
                        job.id, exc.reason)
            return None
    if job.interval_seconds:
        due = job.next_run_at or now
        while due <= now:  # a skipped or late run still advances a full interval
            due += job.interval_seconds
        return due
    return None


def after_step_back(job: JobRecord, now: float) -> float | None:
    """Where a job created or last run by a clock ahead of this one is due now (None:
    kept; a one-shot wake-up keeps the time it was given)."""
    if job.cron:
        try:
            upcoming = next_fire(job.cron, now, inclusive=True)
        except InvalidCronExpression:
            return None  # ended when it fires (next_after)
    elif job.interval_seconds:
        upcoming = now + job.interval_seconds
    else:
        return None
    written = max(job.created_at, job.last_run_at or job.created_at)
    return after_clock_step_back(written, job.next_run_at, now, upcoming)


class FocalSchedule:
    """Schedules of the Focal chat: wake-ups it asks for and the heartbeat."""

    def __init__(self, ctx: RuntimeContext, focal: Focal, jobs: JobStore,
                 use_apscheduler: bool) -> None:
        self.ctx = ctx
        self.focal = focal
        self.jobs = jobs
        # The poll: a wake-up another process scheduled (and stopped or died before it
        # came due) is known to this one only through the table.
        self._driver = ScheduleDriver(self.fire_due, enabled=use_apscheduler, now=ctx.now,
                                      poll_seconds=POLL_SECONDS)
        self._use_apscheduler = use_apscheduler
        self.heartbeat = HeartbeatJob(ctx, focal, jobs, self._register)

    def start(self) -> None:
        """Reload every active job from the table into APScheduler, whose wake-ups for
        times past fire at once. With an injected clock, fire now what came due while no
        runtime ran: nothing fired it until the clock next moved."""
        if not self._use_apscheduler:
            self.fire_due()
            return
        self._driver.start()
        for job in self.jobs.active():
            self._register(job)

    def stop(self) -> None:
        """Stop APScheduler (the table keeps the schedules)."""
        self._driver.stop()

    def keep_polling(self) -> None:
        """Fire a poll a wall clock set back stalled (the runtime's tick calls this)."""
        self._driver.keep_polling()

    def _register(self, job: JobRecord) -> None:
        self._driver.wake_at(job.next_run_at, job.id)

    # -- wake-ups (FO7) --------------------------------------------------------------------

    def schedule_wakeup(self, caller_id: str, kind: Any, at: Any = None, cron: Any = None,
                        note: Any = "", writes: Writes | None = None) -> dict[str, Any]:
        """Create a Focal wake-up: ``at`` (epoch seconds or ISO time) or ``cron``; inside a
        turn (``writes`` holds its outbox) it commits with the turn, or never."""
        session = self.ctx.store.session(caller_id)
        if not is_focal_chat(session):
            raise ToolError("execution_failed",
                            "schedule_wakeup is only available to the Focal agent.")
        if kind not in WAKEUP_KINDS:
            raise ToolError("invalid_argument", "kind must be 'reminder' or 'check'.")
        if (at is None) == (cron is None):
            raise ToolError("invalid_argument", "give exactly one of at or cron.")
        if not isinstance(note, str):
            raise ToolError("invalid_argument", "note must be a string.")
        problem = unstorable(note)
        if problem is not None or len(note) > NOTE_LIMIT:
            raise ToolError("invalid_argument", f"note {problem}." if problem else
                            f"note is {len(note):,} characters; the limit is {NOTE_LIMIT:,}.")
        now = self.ctx.now()
        if cron is not None:
            if not isinstance(cron, str):
                raise ToolError("invalid_argument", "cron must be a crontab string.")
            try:
                next_run = next_fire_or_never(cron, now, inclusive=True)
            except InvalidCronExpression as exc:
                raise ToolError("invalid_argument", str(exc)) from exc
            run_at = None
        else:
            run_at = self._parse_at(at)
            if run_at <= now:
                raise ToolError("invalid_argument", "at must be in the future.")
            next_run = run_at
        job = JobRecord(f"wake-{short(self.ctx.new_id(), 12)}", FOCAL_ID, kind, note.strip(),
                        cron, None, run_at, next_run, None, True, now)
        out = writes if writes is not None else Writes(self.ctx, None)
        full = ToolError("execution_failed",
                         f"Focal already has {MAX_WAKEUPS} wake-ups; cancel one first.")
        queued = out.outbox.wakeups if out.outbox is not None else 0
        if len(self.wakeups()) + queued >= MAX_WAKEUPS:
            raise full

        def registered(created: JobRecord | None) -> None:
            if created is None:  # the limit filled up meanwhile (an operator's call)
                log.warning("wake-up %s not created: Focal has %d already", job.id,
                            MAX_WAKEUPS)
                return
            self._register(created)
            self.ctx.emit("wakeup_scheduled", job_id=job.id, kind=kind)

        created = out.write(lambda: self.jobs.create_now(job, limit_kinds=WAKEUP_KINDS,
                                                         limit=MAX_WAKEUPS), job, registered)
        if created is None:
            raise full
        if out.outbox is not None:
            out.outbox.wakeups += 1
        return created.to_dict()

    @staticmethod
    def _parse_at(at: Any) -> float:
        """Epoch seconds before year 10,000 (a time the scheduler can hold: one past it
        was stored and then refused by every later start of the runtime)."""
        when: float | None = None
        if isinstance(at, int | float) and not isinstance(at, bool):
            try:
                when = float(at)
            except OverflowError:
                when = None
        elif isinstance(at, str):
            try:
                parsed = dt.datetime.fromisoformat(at.replace("Z", "+00:00"))
            except ValueError:
                pass
            else:
                when = (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)).timestamp()
        if when is None or not math.isfinite(when) or not 0 <= when <= LATEST_WAKEUP:
            raise ToolError("invalid_argument", "at must be epoch seconds or an ISO 8601 "
                            "time, before the year 10000.")
        return when

    def wakeups(self) -> list[dict[str, Any]]:
        """Focal's active wake-ups."""
        return [j.to_dict() for j in self.jobs.active(FOCAL_ID) if j.kind in WAKEUP_KINDS]

    def cancel(self, job_id: str) -> bool:
        """Cancel one of Focal's own wake-ups; False for any other job id, or one done with
        nothing left to deliver. Its occurrences still queued for Focal (fired behind a long
        turn, or waiting out a failed attempt's backoff; a one-shot's that fired too) are
        cancelled in the same transaction: they woke Focal, and a reminder notified the
        user, after the wake-up was cancelled. One whose turn is already running is left
        to it."""
        key = lookup_key(job_id)
        job = self.jobs.get(key) if key is not None else None
        if job is None or job.chat_id != FOCAL_ID or job.kind not in WAKEUP_KINDS:
            return False
        now = self.ctx.now()

        def op() -> bool:
            stopped = self.jobs.deactivate_now(job.id)  # a fired one-shot is done already
            queued = self.ctx.journal.cancel_pending_now(
                FOCAL_ID, WAKEUP_MESSAGE_KIND, now, by="focal",
                reason=f"the wake-up {job.id} was cancelled",
                only=lambda message_id: _occurrence_of(message_id) == job.id)
            if queued:
                log.info("cancelled %d queued occurrence(s) of wake-up %s", len(queued),
                         job.id)
            return stopped or bool(queued)

        if not self.jobs.writer.call(op):
            return False
        self._driver.wake_at(None, job.id)  # its wake-up is not kept until its time
        return True

    def _on_fire(self, job: JobRecord, now: float, heartbeat: Heartbeat | None) -> None:
        """Inside fire_due's transaction: the wake-up message, or the heartbeat's (decided
        before the transaction, :meth:`.HeartbeatJob.due`)."""
        if job.kind == "heartbeat":
            self.heartbeat.on_fire(job, now, heartbeat)
            return
        occurrence = int((job.next_run_at or now) * 1000)
        self.ctx.journal.enqueue_now(NewMessage(
            f"wakeup-{job.id}-{occurrence}", FOCAL_ID,
            job.note or f"{job.kind} wake-up", kind=WAKEUP_MESSAGE_KIND, sender="scheduler",
            payload={"job_id": job.id, "kind": job.kind, "note": job.note}), now)

    def fire_due(self) -> list[str]:
        """Fire every job due now (any clock); returns the ids fired."""
        if self.ctx.closed.is_set():
            return []
        now = self.ctx.now()
        self.jobs.move_due(now + CLOCK_STEP_TOLERANCE, lambda job: after_step_back(job, now))
        heartbeat = self.heartbeat.due(now)

        def upcoming(job: JobRecord, at: float) -> float | None:
            if job.kind == "heartbeat" and heartbeat is not None:  # the setting's interval
                return heartbeat.next_after(job, at)
            return next_after(job, at)

        fired = self.jobs.fire_due(now, upcoming,
                                   lambda job, at: self._on_fire(job, at, heartbeat))
        if heartbeat is not None and any(j.kind == "heartbeat" for j in fired):
            self.ctx.emit("heartbeat", run=heartbeat.decision.run,
                          reason=heartbeat.decision.reason, findings=len(heartbeat.findings))
        if self._driver.enabled:  # re-arm: what fired, and what other processes added
            for job in self.jobs.active():
                self._register(job)
        if fired:
            self.ctx.wake_dispatcher()
        return [j.id for j in fired]


def _occurrence_of(message_id: str) -> str | None:
    """The wake-up whose occurrence ``message_id`` is (``wakeup-<job id>-<its time>``,
    :meth:`FocalSchedule._on_fire`), or None."""
    head, _, occurrence = message_id.rpartition("-")
    if not head.startswith("wakeup-") or not occurrence.isdigit():
        return None
    return head.removeprefix("wakeup-")
