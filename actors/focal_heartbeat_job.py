"""The Focal heartbeat's job (FO6): made once, changed with the user's setting, and what
each due occurrence does.

The shell around two pure rules: :mod:`.focal_heartbeat_setting` (the user's setting,
read from Focal's config, and when the next occurrence is due) and
:mod:`.focal_heartbeat` (whether a check-in runs). The job's row in ``scheduled_jobs``
says when it is next due; :class:`.focal_schedule.FocalSchedule` fires it with Focal's
wake-ups, by compare-and-set, once however many runtimes share the database. Each due
occurrence reads the setting afresh, so a change made by another process, or written
into the config without :meth:`HeartbeatJob.change`, is obeyed.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..persistence import JobRecord, JobStore, NewMessage
from . import focal_heartbeat as hb
from . import focal_heartbeat_setting as hs
from .context import RuntimeContext
from .focal import FOCAL_ID, Focal
from .focal_checklist_file import read_up_to

log = logging.getLogger("kinbox.schedule")

HEARTBEAT_JOB = "focal-heartbeat"
HEARTBEAT_KIND = "focal_heartbeat"
"""The kind of a check-in's inbox row."""


@dataclass(frozen=True)
class Heartbeat:
    """A due heartbeat's decision and, when it runs, the message Focal gets."""

    decision: hb.HeartbeatDecision
    body: str
    findings: list[str]
    kept: list[str]
    """The findings the message carries (:func:`.focal_heartbeat.kept_findings`): what its
    row's payload keeps, with the count of those left out."""
    setting: hs.HeartbeatSetting
    """The user's setting as the occurrence read it: the interval to the next."""

    def next_after(self, job: JobRecord, now: float) -> float:
        """When the heartbeat is due next after ``job``'s occurrence fired at ``now``."""
        return hs.next_due(self.setting, job.next_run_at, now)


class HeartbeatJob:
    """The heartbeat of one runtime's Focal: its job, its setting, its occurrences."""

    def __init__(self, ctx: RuntimeContext, focal: Focal, jobs: JobStore,
                 register: Callable[[JobRecord], None]) -> None:
        """``register``: arms the schedule's driver for a job's next run."""
        self.ctx = ctx
        self.focal = focal
        self.jobs = jobs
        self._register = register

    def ensure(self) -> None:
        """Create the heartbeat job once, at the stored setting's interval (another process
        may be creating it at the same time: its job it is)."""
        if self.jobs.get(HEARTBEAT_JOB) is not None:
            return
        now = self.ctx.now()
        self._register(self.jobs.ensure(_heartbeat_job(self.setting(), now)))

    def setting(self) -> hs.HeartbeatSetting:
        """The user's heartbeat setting as the tables hold it (the default without a
        Focal chat)."""
        return hs.from_config(self._config())

    def change(self, changes: dict[str, Any]) -> hs.HeartbeatSetting:
        """Apply checked ``changes`` (:func:`.focal_heartbeat_setting.checked`) to the
        stored setting; the setting now. The config and the job's schedule change in one
        transaction, read with the Focal row locked (another process's change meanwhile is
        not lost), and only when the setting changes: saving it unchanged does not put the
        next heartbeat off. A change is due one interval of the new setting from now.
        Switched off, the check-ins still queued for Focal (behind a long turn, or waiting
        out a failed attempt's backoff) are cancelled in the same transaction: off means no
        heartbeat turn from then on, and they were delivered after it."""
        store, now = self.ctx.store, self.ctx.now()

        def op() -> tuple[hs.HeartbeatSetting, JobRecord | None]:
            current = hs.from_config(store.config_now(FOCAL_ID))
            setting = current.changed(**changes)
            job = None
            if setting != current:
                store.patch_config_now(FOCAL_ID, setting.as_config(), now)
                job = _heartbeat_job(setting, now)
                # First: on PostgreSQL this waits for another process's firing of the job
                # in flight, whose check-in the cancel below then sees committed.
                self.jobs.reschedule_now(job)
            if not hs.runs(setting):
                self._cancel_queued(now)
            return setting, job

        setting, job = self.jobs.writer.call(op)
        if job is not None:
            self._register(job)
        return setting

    def due(self, now: float) -> Heartbeat | None:
        """The heartbeat's decision when it is due (None otherwise), made before the firing
        transaction: it reads ``heartbeat.md`` and every watched session, which must not
        hold up the writer (every send in the process waits for it). Switched off, or with
        a check-in still open for Focal (skipped: the schedule advances), it reads
        neither."""
        job = self.jobs.get(HEARTBEAT_JOB)
        if job is None or not job.active or job.next_run_at is None or job.next_run_at > now:
            return None
        setting = self.setting()  # the user's, whoever wrote it (another process)
        if not hs.runs(setting):
            return Heartbeat(hb.HeartbeatDecision(False, "the heartbeat is off", None), "", [],
                             [], setting)
        # One check-in at a time: one still waiting for Focal (behind a long turn, or for
        # its retry) has not stored its signature, so its findings looked new again and
        # Focal got them twice.
        if self.ctx.journal.has_open_of_kind(FOCAL_ID, HEARTBEAT_KIND):
            return Heartbeat(hb.HeartbeatDecision(False, "a check-in still waits for Focal",
                                                  None), "", [], [], setting)
        # The signature is read after that look: the check-in turn stores it with the
        # commit that closes its row, and read before, a check-in ending in between left
        # the last signature unseen and its findings went to Focal again.
        last_signature = self._config().get("focal_heartbeat_signature")
        checklist = self._checklist()
        found = hb.findings(self.focal.watched_sessions(), now)
        decision = hb.should_run_focal_heartbeat(checklist, found, last_signature)
        return Heartbeat(decision, hb.check_in(checklist, found), found,
                         hb.kept_findings(checklist, found), setting)

    def _config(self) -> dict[str, Any]:
        """The Focal chat's config as the tables hold it now (empty without the chat)."""
        focal = self.ctx.store.session(FOCAL_ID)
        return focal.config if focal else {}

    def on_fire(self, job: JobRecord, now: float, heartbeat: Heartbeat | None) -> None:
        """Inside the firing transaction: the check-in message, when :meth:`due` decided
        it runs (a skipped one is recorded as run: the schedule already advanced). One
        that finds the heartbeat off cancels the check-ins still queued, as switching it
        off does: the setting may have been written into the config alone."""
        if heartbeat is not None and not hs.runs(heartbeat.setting):
            self._cancel_queued(now)
        if heartbeat is None or not heartbeat.decision.run:
            return
        occurrence = int((job.next_run_at or now) * 1000)
        payload = {"signature": heartbeat.decision.signature, "findings": heartbeat.kept,
                   "left_out": len(heartbeat.findings) - len(heartbeat.kept)}
        self.ctx.journal.enqueue_now(NewMessage(
            f"heartbeat-{occurrence}", FOCAL_ID, heartbeat.body, kind=HEARTBEAT_KIND,
            sender="scheduler", payload=payload), now)

    def _cancel_queued(self, now: float) -> None:
        """Inside a writer operation: cancel the check-ins queued for Focal and not yet
        running (the heartbeat is off)."""
        cancelled = self.ctx.journal.cancel_pending_now(
            FOCAL_ID, HEARTBEAT_KIND, now, by="heartbeat",
            reason="the Focal heartbeat was switched off")
        if cancelled:
            log.info("cancelled %d queued heartbeat check-in(s): the heartbeat is off",
                     len(cancelled))

    def _checklist(self) -> str:
        """``heartbeat.md`` as the heartbeat reads it: the default when there is none, or
        when it cannot be read (a folder, a pipe, no permission: a due heartbeat that
        raised held up every Focal wake-up with it); never more than the limit's bytes."""
        path = self.focal.folder / "heartbeat.md"
        try:
            # Non-blocking, and a regular file only: opening a named pipe waits for a writer.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return hb.DEFAULT_FOCAL_HEARTBEAT
        except OSError as exc:
            log.warning("%s cannot be opened (%s); the default checklist runs", path,
                        exc.strerror)
            return hb.DEFAULT_FOCAL_HEARTBEAT
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                log.warning("%s is not a regular file; the default checklist runs", path)
                return hb.DEFAULT_FOCAL_HEARTBEAT
            raw = read_up_to(fd, hb.CHECKLIST_READ)
        except OSError as exc:
            log.warning("%s cannot be read (%s); the default checklist runs", path,
                        exc.strerror)
            return hb.DEFAULT_FOCAL_HEARTBEAT
        finally:
            os.close(fd)
        _warn_unless_utf8(raw, path)
        return hb.checklist_text(raw)


def _warn_unless_utf8(raw: bytes, path: os.PathLike[str]) -> None:
    """Say in the log when ``raw`` (the file's first bytes) is not UTF-8: its bad bytes
    reach Focal as U+FFFD (:func:`.focal_heartbeat.checklist_text`), and nothing told the
    user why their checklist came out garbled. A character cut by the read's limit is no
    encoding problem."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.end == len(raw) and len(raw) == hb.CHECKLIST_READ:
            return  # the read's limit cut the last character
        log.warning("%s is not UTF-8 (a bad byte at offset %d); its bad bytes are replaced "
                    "with U+FFFD", path, exc.start)


def _heartbeat_job(setting: hs.HeartbeatSetting, now: float) -> JobRecord:
    """The heartbeat job on ``setting``'s interval, made or changed at ``now``: due one
    interval of it on (:func:`.focal_heartbeat_setting.after_change`)."""
    return JobRecord(HEARTBEAT_JOB, FOCAL_ID, "heartbeat", "", None, setting.interval_seconds,
                     None, hs.after_change(setting, now), None, True, now)
