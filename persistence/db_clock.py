"""The database server's clock, as the one time every process sharing a PostgreSQL agrees on.

Leases, ``available_at`` and every other time the journal compares are
written by one process and read by another. With each process's own wall
clock, a worker whose clock runs ten minutes fast sees every live lease as
expired and robs its owner; one running slow writes leases that others see
expired at once, and its sends stay invisible to the others for ten
minutes. So on PostgreSQL every runtime tells the time by the server's
clock (``clock_timestamp()``).

Asking the server on every ``now()`` would cost a round trip on the
hottest paths (every send, claim and commit reads the time), so
:class:`DatabaseClock` reads the server's clock once per ``resync``
seconds on a connection of its own and carries it forward with this
process's monotonic clock in between: the monotonic clock cannot be set
or stepped, and drifts by microseconds over a few seconds. The error is
half the round trip of the read (well under a millisecond on a LAN), and
the clock never goes back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import peewee as pw

from .errors import PersistenceError

log = logging.getLogger("kinbox.db_clock")

RESYNC_SECONDS = 2.0
"""How often the server's clock is read again."""

EPOCH_SQL = "SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8"
"""The server's time now (not the transaction's start, as ``now()`` would be)."""


class DatabaseClock:
    """A PostgreSQL server's clock, read from this process (``now()`` in epoch seconds)."""

    def __init__(self, db: pw.PostgresqlDatabase, *, resync: float = RESYNC_SECONDS,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if resync <= 0:
            raise ValueError(f"resync must be > 0, not {resync!r}")
        self.db = db
        self.resync = resync
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._conn: Any = None
        self._server_at = 0.0  # the server's time at the last read ...
        self._mono_at = 0.0  # ... and this process's monotonic time then
        self._last = 0.0
        self.reads = 0
        """How many times the server's clock was read (for tests and statistics)."""
        self.sync()

    def sync(self) -> None:
        """Read the server's clock now; raise :class:`PersistenceError` if it cannot."""
        with self._lock:
            self._read()

    def _read(self) -> None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self.db._connect()
                self._conn.autocommit = True
            before = self._monotonic()
            with self._conn.cursor() as cur:
                cur.execute(EPOCH_SQL)
                server = float(cur.fetchone()[0])
            after = self._monotonic()
        except Exception as exc:
            self._close()
            raise PersistenceError(f"cannot read the database's clock: {exc}") from exc
        # The server read its clock somewhere in [before, after]: take the middle.
        self._server_at, self._mono_at = server, (before + after) / 2
        self.reads += 1

    def now(self) -> float:
        """The server's time now, in seconds since the epoch (never less than before)."""
        with self._lock:
            if self._monotonic() - self._mono_at >= self.resync:
                try:
                    self._read()
                except PersistenceError as exc:
                    # Carry the last reading forward: it stays right to the monotonic
                    # clock's drift, and the next call tries again.
                    self._mono_at_retry()
                    log.warning("%s; carrying the last reading forward", exc)
            t = self._server_at + (self._monotonic() - self._mono_at)
            self._last = max(self._last, t)
            return self._last

    def _mono_at_retry(self) -> None:
        # Re-anchor the last reading to now so the next attempt waits ``resync``.
        mono = self._monotonic()
        self._server_at += mono - self._mono_at
        self._mono_at = mono

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None

    def close(self) -> None:
        """Close the clock's connection (``now()`` opens a new one when it next reads)."""
        with self._lock:
            self._close()
