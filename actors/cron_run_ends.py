"""How a cron run ends: recorded (success, a failure counted toward its job's retries),
handed back when the database refuses the record, and announced.

The end of a run as :class:`~.cron.CronService` carries it out after the run's turn (or
instead of it), apart from the firing and the turn itself: what a failure sets on its job
(:func:`.cron_rules.after_failure`), a refused record's hand-back
(:func:`.cron_rules.after_unrecorded_failure`), and the announcement a finished run of an
``announce`` job leaves for the UI.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..persistence import (
    CronJobRecord,
    CronRunLost,
    CronRunRecord,
    CronStore,
    PersistenceError,
    WriterClosed,
)
from . import cron_rules as rules
from .announcements import Announcements
from .brain_failure import ORDINARY, FailureKind
from .context import RuntimeContext
from .turn import Turn
from .turn_run import error_kind

log = logging.getLogger("kinbox.cron")

RESULT_CHARS = 4000
"""How much of a run's replies its record and announcement keep."""


class RunEnds:
    """Records, hands back and announces the ends of one runtime's cron runs."""

    def __init__(self, ctx: RuntimeContext, store: CronStore, announcements: Announcements,
                 wake_at: Callable[[float | None, str], None]) -> None:
        self.ctx = ctx
        self.store = store
        self.announcements = announcements
        self.wake_at = wake_at
        """Arm the schedule's wake-up for a job or run (its time, its key)."""

    def fail(
        self, job: CronJobRecord, run: CronRunRecord, error: str, kind: FailureKind = ORDINARY
    ) -> None:
        """Record ``run`` failed with ``error``, counted toward its job's retries as ``kind``
        asks (a record the database refuses: :meth:`hand_back`), and announce it."""
        now = self.ctx.now()
        try:
            updated = self.store.finish(
                run.id,
                self.ctx.owner,
                now,
                "error",
                error=error,
                job_changes=lambda current: failure_changes(current, error, now, kind),
            )
        except CronRunLost as exc:
            log.warning("cron run %s failed but is no longer ours: %s", run.id, exc)
            return
        except WriterClosed:
            raise  # stopping: the run stays ``running`` for whoever takes it over
        except PersistenceError as exc:
            self.hand_back(run, f"the record of its failure ({error_kind(error)})", exc)
            return
        if updated is not None:
            self.wake_at(updated.next_run_at, updated.id)
            if not updated.active:
                last = updated.last_error or ""
                log.warning("cron job %s deactivated: %s", job.id, error_kind(last))
                log.debug("cron job %s deactivated: %s", job.id, last)
        self.finished(job, run, "error", None, error)

    def hand_back(self, run: CronRunRecord, what: str, refusal: PersistenceError) -> None:
        """The database refused ``what`` of ``run`` (the record of its failure, or the read
        of its job before its turn): give the run back, due again
        after a retry delay (:func:`.cron_rules.after_unrecorded_failure`), as the inbox
        hands back such a row. Raised, it sat out its lease unrenewed, was taken over as
        if its runtime had died, and after five was failed as such. A hand back refused
        too leaves the run to its lease."""
        due = rules.after_unrecorded_failure(run.attempts, self.ctx.now())
        try:
            self.store.hand_back(run.id, self.ctx.owner, due)
        except CronRunLost as exc:
            log.warning("cron run %s: the database refused %s, and the run is no longer "
                        "ours: %s", run.id, what, exc)
            return
        except PersistenceError as exc:
            log.error("cron run %s: the database refused %s (%s) and its hand back (%s): "
                      "it is taken over once its lease runs out", run.id, what, refusal, exc)
            return
        log.error("cron run %s: the database refused %s (%s): handed back, it runs again "
                  "in %.0f s", run.id, what, refusal, due - self.ctx.now())
        self.wake_at(due, run.id)

    def finished(
        self,
        job: CronJobRecord,
        run: CronRunRecord,
        status: str,
        result: str | None,
        error: str | None,
    ) -> None:
        """Tell observers ``run`` ended, and announce it when its job asks."""
        self.ctx.emit("cron_run_finished", job_id=job.id, run_id=run.id, status=status, error=error)
        if job.delivery == "announce":
            self.announcements.add(
                {
                    "job_id": job.id,
                    "name": job.name,
                    "run_id": run.id,
                    "status": status,
                    "result": result,
                    "error": error,
                    "session_id": rules.session_id_for(job.id),
                    "at": self.ctx.now(),
                }
            )

    def refused(self, run: CronRunRecord) -> None:
        """A run recorded failed at once (the previous one still active), or ended at its
        takeover, is announced too."""
        job = self.store.get(run.job_id)
        if job is not None:
            self.finished(job, run, "error", None, run.error)

def failure_changes(
    job: CronJobRecord, error: str, now: float, kind: FailureKind = ORDINARY
) -> dict[str, Any]:
    """The columns a failed run of ``job`` (as read in the failure's transaction) sets;
    ``kind``: how the brain's exception asked to be retried."""
    plan = rules.after_failure(
        job.retry_count, error, now, permanent=kind.permanent, retry_after=kind.retry_after
    )
    if not job.active:  # paused meanwhile: record, do not resume it
        return {"retry_count": plan.retry_count, "last_error": plan.last_error}
    return {
        "retry_count": plan.retry_count,
        "active": plan.active,
        "next_run_at": plan.next_run_at,
        "last_error": plan.last_error,
    }


def summary(turn: Turn) -> str:
    """A run's result: its turn's replies, cut to :data:`RESULT_CHARS`."""
    return "\n".join(turn.replies)[:RESULT_CHARS]
