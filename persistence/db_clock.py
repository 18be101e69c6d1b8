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
or stepped, and drifts by microseconds over a few seconds. The clock never
goes back.

A reading is only as good as its round trip: the server read its clock
somewhere between the query's start and the moment this thread had its
answer, and on a busy process that moment includes the wait for the
interpreter lock (measured here: readings off by -12 to +38 ms with four
threads running Python). A process whose clock lags takes another's fresh
send for one not yet due. So each read takes a few readings and keeps the
one with the shortest round trip, and a new reading replaces the one kept
only when its error bound (half its round trip) is no larger than the kept
one's, aged by the drift allowed between the two clocks, or when the two
disagree by more than both bounds, which means a clock stepped
(:func:`better_reading`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import peewee as pw

from .errors import PersistenceError

log = logging.getLogger("kinbox.db_clock")

RESYNC_SECONDS = 2.0
"""How often the server's clock is read again."""

EPOCH_SQL = "SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8"
"""The server's time now (not the transaction's start, as ``now()`` would be)."""

READINGS = 3
"""Readings per read; the one with the shortest round trip is the candidate."""

DRIFT = 500e-6
"""How fast a kept reading's error bound grows, in seconds per second: the most a
server's clock is slewed against a monotonic clock (NTP slews up to 500 ppm)."""


@dataclass(frozen=True, slots=True)
class Reading:
    """The server's clock read once: its time, this process's monotonic time at the middle
    of the round trip, and the round trip."""

    server: float
    mono: float
    round_trip: float

    def error_at(self, mono: float) -> float:
        """The most this reading can be off at monotonic time ``mono``."""
        return self.round_trip / 2 + DRIFT * abs(mono - self.mono)


NO_READING = Reading(0.0, 0.0, float("inf"))
"""Before the first read: any reading is better."""


def better_reading(kept: Reading, new: Reading) -> Reading:
    """The reading to carry forward: ``new`` unless ``kept`` is still the tighter one.

    Also ``new`` when the two cannot both be right (they differ by more than both error
    bounds together): one of the clocks stepped (the server's was set, the database
    failed over to another host, this host was suspended and its monotonic clock
    stopped), and only the newer reading has seen it."""
    predicted = kept.server + (new.mono - kept.mono)
    bound = new.error_at(new.mono) + kept.error_at(new.mono)
    if new.error_at(new.mono) <= kept.error_at(new.mono) or abs(new.server - predicted) > bound:
        return new
    return kept


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
        self._reading = NO_READING
        self._read_at = 0.0  # this process's monotonic time at the last read
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
            readings = [self._read_once() for _ in range(READINGS)]
        except Exception as exc:
            self._close()
            raise PersistenceError(f"cannot read the database's clock: {exc}") from exc
        best = min(readings, key=lambda r: r.round_trip)
        self._reading = better_reading(self._reading, best)
        self._read_at = self._monotonic()
        self.reads += 1

    def _read_once(self) -> Reading:
        before = self._monotonic()
        with self._conn.cursor() as cur:
            cur.execute(EPOCH_SQL)
            server = float(cur.fetchone()[0])
        after = self._monotonic()
        # The server read its clock somewhere in [before, after]: take the middle.
        return Reading(server, (before + after) / 2, after - before)

    def now(self) -> float:
        """The server's time now, in seconds since the epoch (never less than before)."""
        with self._lock:
            if self._monotonic() - self._read_at >= self.resync:
                try:
                    self._read()
                except PersistenceError as exc:
                    # Carry the last reading forward: it stays right to the monotonic
                    # clock's drift, and the next call tries again.
                    self._read_at = self._monotonic()  # the next attempt waits ``resync``
                    log.warning("%s; carrying the last reading forward", exc)
            t = self._reading.server + (self._monotonic() - self._reading.mono)
            self._last = max(self._last, t)
            return self._last

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
