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

``now()`` never waits for the server: the first reading is taken when the
clock is made, and each later one on a thread of the clock's own, started
when a ``now()`` finds the last reading ``resync`` seconds old; ``now()``
carries the last reading forward meanwhile. Every thread of a runtime asks
the time, its event loop among them, and a read is a network round trip: a
read that hung (a server gone without a word, a connection half dead) held
the clock's lock, and so every send, claim, commit and async turn of the
process, for as long as it hung.

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

CLOSE_WAIT = 5.0
"""Seconds :meth:`DatabaseClock.close` waits for a read under way before it leaves it."""

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
        self._io = threading.Lock()
        """Held by a read of the server's clock (never under ``_lock``)."""
        self._due = threading.Event()
        self._reader: threading.Thread | None = None
        self._closed = False
        self._conn: Any = None
        self._reading = NO_READING
        self._read_at = 0.0  # this process's monotonic time at the last read
        self._last = 0.0
        self.reads = 0
        """How many times the server's clock was read (for tests and statistics)."""
        self.sync()

    def sync(self) -> None:
        """Read the server's clock now, on this thread; raise :class:`PersistenceError` if
        it cannot."""
        with self._io:
            self._read()

    def _read(self) -> None:
        """One read of the server's clock (under ``_io``): the candidate reading kept or
        not by :func:`better_reading`."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self.db._connect()
                self._conn.autocommit = True
            readings = [self._read_once() for _ in range(READINGS)]
        except Exception as exc:
            self._close()
            raise PersistenceError(f"cannot read the database's clock: {exc}") from exc
        best = min(readings, key=lambda r: r.round_trip)
        with self._lock:
            self._reading = better_reading(self._reading, best)
            self._read_at = self._monotonic()
            self.reads += 1

    def _keep_reading(self) -> None:
        """The reader thread: a read each time ``now()`` finds the last one old."""
        while True:
            self._due.wait()
            self._due.clear()
            if self._closed:
                return
            try:
                self.sync()
            except PersistenceError as exc:
                # The last reading is carried forward: it stays right to the monotonic
                # clock's drift; the next try comes ``resync`` later.
                log.warning("%s; carrying the last reading forward", exc)

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
            mono = self._monotonic()
            if mono - self._read_at >= self.resync and not self._closed:
                self._read_at = mono  # asked once: the next ask comes ``resync`` later
                if self._reader is None:
                    self._reader = threading.Thread(target=self._keep_reading, daemon=True,
                                                    name="kinbox-db-clock")
                    self._reader.start()
                self._due.set()
            t = self._reading.server + (mono - self._reading.mono)
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
        """End the reader thread and close the clock's connection (``now()`` goes on
        carrying the last reading forward)."""
        with self._lock:
            self._closed = True
        self._due.set()
        # A read under way ends first; one that hangs is left to the reader thread (a
        # daemon): a stop must not hang with it.
        if self._io.acquire(timeout=CLOSE_WAIT):
            try:
                self._close()
            finally:
                self._io.release()
