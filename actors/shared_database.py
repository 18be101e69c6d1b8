"""What a runtime does differently on a database other processes share (PostgreSQL).

Two things, both so that processes sharing the database act as one:

* it tells the time by the server's clock (:class:`~kinbox.persistence.DatabaseClock`),
  unless the caller injected a clock of its own, so leases and due times
  mean the same in every process whatever each machine's clock says;
* a delivering runtime listens for other processes' sends
  (:class:`~kinbox.persistence.InboxListener`) and wakes its dispatcher
  on each, so a send is claimed at once rather than at the next poll; and
  for their changes to cron jobs, so a job triggered from ``kinbox serve``
  runs at once rather than at the next look at the job tables.

The runtime's own liveness lock lives in ``persistence/liveness.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import peewee as pw

from ..persistence import DatabaseClock, InboxListener, is_postgres
from ..persistence.inbox_notify import SCHEDULES_CHANNEL
from .clock import Clock


class SharedDatabase:
    """The clock and the listener of one runtime on a shared database (both optional)."""

    def __init__(self) -> None:
        self.clock: DatabaseClock | None = None
        self.listener: InboxListener | None = None

    def clock_for(self, db: pw.Database, given: Clock | None, default: Clock) -> Clock:
        """The runtime's clock: the one given, else the server's on PostgreSQL, else
        ``default``."""
        if given is not None:
            return given
        if is_postgres(db):
            self.clock = DatabaseClock(db)  # type: ignore[arg-type]
            return self.clock
        return default

    def listen(self, db: pw.Database, wake: Callable[[], None],
               look_at_schedules: Callable[[], None]) -> None:
        """On PostgreSQL, call ``wake`` whenever another process commits a send, and
        ``look_at_schedules`` whenever one changes a cron job."""
        if is_postgres(db):
            self.listener = InboxListener(  # type: ignore[arg-type]
                db, wake, also={SCHEDULES_CHANNEL: look_at_schedules})
            self.listener.start()

    def statistics(self) -> dict[str, int]:
        """The listener's counters (empty when there is none)."""
        return self.listener.statistics() if self.listener is not None else {}

    def stop_listening(self) -> None:
        """Stop the listener (idempotent)."""
        if self.listener is not None:
            self.listener.stop()
            self.listener = None

    def close(self) -> None:
        """Stop the listener and close the clock's connection."""
        self.stop_listening()
        if self.clock is not None:
            self.clock.close()
