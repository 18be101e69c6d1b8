"""Reclaiming the journal: an operator's prune, and a runtime's retention on its tick.

What may be deleted is :mod:`kinbox.persistence.retention`'s rule (finished rows whose
last change is older than the cutoff, and nothing a live path still reads; finished cron
runs, each job's newest kept); the deleting
is the journal's (:meth:`~kinbox.persistence.Journal.prune`, bounded batches). This
module checks an operator's arguments, and runs a runtime's automatic retention: with
``Runtime(retention=seconds)``, a pass every :data:`RETENTION_INTERVAL` of the runtime's
clock, one batch per tick, so the ticker never holds a long prune and the writer is
held for one short batch at a time, never by the delivery path's own operations.

The cutoff is also the window of message-id de-duplication: a send repeated with the
``message_id`` of a row that was pruned is a new message.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import TYPE_CHECKING

from ..persistence import PruneCounts, retention
from .errors import ConfigError
from .validation import finite_number

if TYPE_CHECKING:
    from .context import RuntimeContext

log = logging.getLogger("kinbox.pruning")

RETENTION_INTERVAL = 3600.0
"""Seconds of the runtime's clock between two automatic retention passes."""


def older_than_seconds(value: object, field: str = "older_than") -> float:
    """A prune's age in seconds: a finite number, at least :data:`retention.MIN_RETENTION`
    (a shorter one would let a paired device's re-send of a pruned row run again;
    booleans are not numbers); a ConfigError naming ``field`` otherwise."""
    if not finite_number(value) or value <= 0:
        raise ConfigError(f"{field} must be a number of seconds > 0, got {value!r}",
                          field=field)
    if value < retention.MIN_RETENTION:
        raise ConfigError(
            f"{field} must be at least {retention.MIN_RETENTION} s "
            f"({retention.MIN_RETENTION // 3600}h: a paired device re-sends a message that "
            f"long, and a pruned one would run again), got {value!r}", field=field)
    return float(value)


def batch_size(value: object) -> int:
    """A prune's batch: a whole number from 1 to :data:`retention.MAX_BATCH`."""
    if (isinstance(value, bool) or not isinstance(value, int)
            or not 1 <= value <= retention.MAX_BATCH):
        raise ConfigError(f"batch must be a whole number from 1 to {retention.MAX_BATCH:,}, "
                          f"got {value!r}", field="batch")
    return value


def prune(ctx: RuntimeContext, older_than: float, *, dry_run: bool = False,
          batch: int = retention.DEFAULT_BATCH) -> PruneCounts:
    """Delete the journal's prunable rows older than ``older_than`` seconds on the
    runtime's clock (with their markers and history), and the finished cron runs (each
    job's newest kept); what went (or, dry, would)."""
    seconds = older_than_seconds(older_than)
    size = batch_size(batch)
    counts = ctx.journal.prune(ctx.now() - seconds, batch=size, dry_run=dry_run)
    log.info("%s %d inbox rows (%d markers, %d history rows) and %d cron runs older than "
             "%.0f s", "would prune" if dry_run else "pruned", counts.rows, counts.markers,
             counts.events, counts.cron_runs, seconds)
    return counts


class Retention:
    """A runtime's automatic prune: a pass each :data:`RETENTION_INTERVAL`, a batch a tick
    (the inbox rows', then the cron runs').

    Ticks may come from two threads (the ticker's, and an injected clock's mover): one
    runs a batch, the other skips it."""

    def __init__(self, older_than: float, interval: float = RETENTION_INTERVAL) -> None:
        self.older_than = older_than
        self.interval = interval
        self._lock = threading.Lock()
        self._next_pass = -math.inf
        self._cutoff: float | None = None
        """The running pass's cutoff (fixed at its start); None between passes."""
        self._before: int | None = None
        self._runs = False
        """The running pass is at its cron runs (the inbox rows done)."""
        self._from_job: str | None = None

    def tick(self, ctx: RuntimeContext) -> None:
        """Run the next batch of the pass under way, or start one when it is due."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            now = ctx.now()
            if self._cutoff is None:
                if now < self._next_pass:
                    return
                self._cutoff, self._before = now - self.older_than, None
                self._runs, self._from_job = False, None
                self._next_pass = now + self.interval
            if not self._runs:
                step = ctx.journal.prune_batch(self._cutoff, before_seq=self._before)
                if step.counts.rows:
                    log.info("retention pruned %d inbox rows", step.counts.rows)
                self._before = step.before_seq
                self._runs = step.before_seq is None
                return
            runs = ctx.journal.prune_cron_batch(self._cutoff, from_job=self._from_job)
            if runs.runs:
                log.info("retention pruned %d cron runs", runs.runs)
            self._from_job = runs.from_job
            if runs.from_job is None:
                self._cutoff = None
        except Exception:
            log.exception("retention's prune failed; the next pass tries again")
            self._cutoff = None
        finally:
            self._lock.release()
