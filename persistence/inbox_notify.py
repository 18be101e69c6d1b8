"""Wake-ups across processes on PostgreSQL: ``NOTIFY`` on enqueue, a ``LISTEN`` thread here.

A send committed by one process must wake the dispatchers of the others at
once, not at their next poll. Every transaction that inserts inbox rows
also runs :data:`NOTIFY_SQL` (the server delivers the notification only if
that transaction commits, and folds identical ones of a transaction into
one). :class:`InboxListener` holds a connection of its own that listens on
:data:`CHANNEL` and calls the callback the runtime passes in (which wakes
its dispatcher).

A change to a cron job (added, triggered, resumed, edited) runs
:data:`SCHEDULES_NOTIFY_SQL` the same way, and the listener, on the same
connection, calls the schedules' callback for it: "run now" asked of a
send-only ``kinbox serve`` runs on a worker at once.

Polling stays the fallback and the ground truth: a notification only says
"claim now", never what to claim, so a lost one costs one poll interval.
The listener reconnects when its connection drops (with backoff) and calls
the callback after every (re)connect, since notifications sent while it
was away are gone. Only this module's thread touches its connection.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import peewee as pw

log = logging.getLogger("kinbox.inbox_notify")

CHANNEL = "kinbox_inbox"
"""The channel every enqueue notifies and every delivering runtime listens on."""

NOTIFY_SQL = f"SELECT pg_notify('{CHANNEL}', '')"
"""Run inside an enqueue's transaction: delivered to listeners if and when it commits."""

SCHEDULES_CHANNEL = "kinbox_schedules"
"""The channel a change to a cron job notifies (added, triggered, resumed, edited), so the
delivering runtimes look at the job tables now, not at their next poll."""

SCHEDULES_NOTIFY_SQL = f"SELECT pg_notify('{SCHEDULES_CHANNEL}', '')"
"""Run inside the transaction that changes a cron job."""

APPLICATION_NAME = "kinbox-listener"
"""The listener's ``application_name`` in ``pg_stat_activity`` (operators can tell it apart)."""

KEEPALIVE_SECONDS = 5.0
"""With no notification for this long, the listener checks its connection with a query."""


def reconnect_delays(initial: float = 0.05, maximum: float = 5.0,
                     factor: float = 2.0) -> Iterator[float]:
    """Seconds to wait before each reconnect attempt: ``initial``, growing by ``factor``
    up to ``maximum`` (a pure generator: it never sleeps)."""
    delay = initial
    while True:
        yield delay
        delay = min(maximum, delay * factor)


class InboxListener:
    """A thread that calls ``on_notify()`` when another process commits a send."""

    def __init__(self, db: pw.PostgresqlDatabase, on_notify: Callable[[], None], *,
                 channel: str = CHANNEL, also: Mapping[str, Callable[[], None]] | None = None,
                 delays: Callable[[], Iterator[float]] = reconnect_delays) -> None:
        """``also``: more channels on the same connection, each with its callback (called
        like ``on_notify``: on a notification on it, and after every (re)connect)."""
        self.db = db
        self.callbacks = {channel: on_notify, **(also or {})}
        self._delays = delays
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()  # stop() interrupts the select at once
        self._thread: threading.Thread | None = None
        self._stats_lock = threading.Lock()
        self._stats = {"notifications": 0, "connects": 0, "drops": 0}
        self.listening = threading.Event()
        """Set while the listener holds a connection that is listening."""

    def start(self) -> None:
        """Start listening in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="kinbox-listener", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close its connection."""
        if self._stop.is_set():
            return
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def statistics(self) -> dict[str, int]:
        """Notifications heard, connections made and connections lost so far."""
        with self._stats_lock:
            return dict(self._stats)

    def _bump(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self._stats[name] += n

    def _run(self) -> None:
        delays = self._delays()
        while not self._stop.is_set():
            conn = None
            try:
                conn = self._connect()
                delays = self._delays()  # a good connection starts the backoff over
                self._listen(conn)
            except Exception as exc:
                if self._stop.is_set():
                    break
                self._bump("drops")
                log.warning("the inbox listener lost its connection (%s); polling covers "
                            "until it reconnects", type(exc).__name__)
            finally:
                self.listening.clear()
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
            if self._stop.wait(next(delays)):
                break

    def _connect(self) -> Any:
        conn = self.db._connect()
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SET application_name = %s", (APPLICATION_NAME,))
                for channel in self.callbacks:
                    cur.execute(f'LISTEN "{channel}"')
        except Exception:
            conn.close()
            raise
        self._bump("connects")
        self.listening.set()
        self._call(self.callbacks)  # anything sent while we were not listening
        return conn

    def _listen(self, conn: Any) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([conn, self._wake_r], [], [], KEEPALIVE_SECONDS)
            if self._stop.is_set():
                return
            if not ready:
                with conn.cursor() as cur:  # a dead peer shows up here as an error
                    cur.execute("SELECT 1")
            conn.poll()
            if conn.notifies:
                heard = {n.channel for n in conn.notifies}
                self._bump("notifications", len(conn.notifies))
                conn.notifies.clear()
                self._call(heard)

    def _call(self, channels: Iterable[str]) -> None:
        """Call each callback of ``channels`` once."""
        for channel in channels:
            try:
                self.callbacks[channel]()
            except Exception:
                log.exception("the listener's callback for %s failed", channel)
