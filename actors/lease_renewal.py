"""Renewing the leases of the rows this runtime's turns hold (I4).

A running turn's row keeps its lease a lease ahead, renewed once a third of a lease has
passed since the last renewal. While the runtime runs, the dispatcher renews on its tick.
A graceful stop gives running turns its timeout to finish and commit, and in that time
the dispatcher takes no tick (it is stopping its session actors): the runtime's ticker
renews instead, until the turns have ended (``Runtime.stop``). Without that, a turn that
wound down longer than its lease's remainder lost the lease mid-stop, another runtime
on the same PostgreSQL ran it again, and its own commit was refused. One
:class:`LeaseRenewal` serves both callers, so they renew at the same pace.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from ..persistence import DatabaseFailed, PersistenceError
from .renewal_schedule import RenewalSchedule

if TYPE_CHECKING:
    from .context import RuntimeContext
    from .slots import Slots

log = logging.getLogger("kinbox.dispatcher")

TRANSIENT_KINDS = frozenset({"OperationalError", "InterfaceError"})
"""``DatabaseFailed.kind`` of a failure that is the database's moment, not a fault of
kinbox or its schema: a lost connection (the thread's next statement connects again), a
lock wait that timed out, a server shutting down."""


def failure_level(exc: PersistenceError) -> int:
    """How loud a failed claim or renewal is: WARNING for a transient database failure
    (a conflict that outlasted the retries, a lost connection: the next tick tries again
    and nothing was lost), ERROR for the rest (a missing table, a bug)."""
    if isinstance(exc, DatabaseFailed) and (exc.retryable or exc.kind in TRANSIENT_KINDS):
        return logging.WARNING
    return logging.ERROR


def log_failure(logger: logging.Logger, what: str, exc: PersistenceError, then: str) -> None:
    """Log that the tick's ``what`` failed with ``exc`` (at :func:`failure_level`, its type
    and SQLSTATE named) and what happens ``then``. Its text names no message: a
    PostgreSQL error's primary message alone (the DETAIL that may quote a row is kept off
    it, see ``DatabaseFailed.detail``)."""
    logger.log(failure_level(exc), "%s failed (%s, SQLSTATE %s): %s; %s", what,
               type(exc).__name__, getattr(exc, "sqlstate", None), exc, then)


class LeaseRenewal:
    """Renews the leases of the sessions ``slots`` holds, at most once a third of a lease."""

    def __init__(self, ctx: RuntimeContext, slots: Slots) -> None:
        self.ctx = ctx
        self.slots = slots
        self._lock = threading.Lock()
        self._schedule = RenewalSchedule()
        """On the runtime's clock."""

    def renew_if_due(self) -> None:
        """Renew now if a third of a lease has passed since the last renewal; a database
        failure is logged, and the next call tries again."""
        ctx = self.ctx
        now = ctx.now()
        with self._lock:  # two callers during a stop's start: one renews
            if not self._schedule.due(now, ctx.lease_seconds):
                return
            held = self.slots.held()
            if not held:
                return
            before = self._schedule.begin(now)
        try:
            ctx.journal.renew(ctx.owner, held, now + ctx.lease_seconds, now)
        except PersistenceError as exc:
            with self._lock:
                self._schedule.refused(now, before)
            log_failure(log, "lease renewal", exc, "the next tick renews again")
            return
        log.debug("renewed the leases of %d running or waiting turns", len(held))
