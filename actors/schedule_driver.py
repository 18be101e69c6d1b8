"""When to look at the schedule tables: APScheduler on the system clock.

The tables (``scheduled_jobs``, ``cron_jobs``) are the truth; a driver only
calls its ``fire`` function when something may be due: at the times it was
told about (``wake_at``) and, optionally, every ``poll_seconds`` (to notice
jobs other processes added or runs whose owner died). With an injected
clock the driver stays off and the runtime calls ``fire`` on every clock
move instead, so a test of a day of schedules takes milliseconds.
APScheduler's thread only calls ``fire``; it never holds a transaction.

The times a driver is told are on the runtime's clock (on PostgreSQL the
database server's, :class:`~kinbox.persistence.DatabaseClock`), APScheduler
waits on this machine's wall clock: a wake-up is armed for when the runtime's
clock reaches it, as far ahead on the wall clock as it is on the runtime's.
Armed for the time itself, a runtime clock behind the wall clock fired early,
found nothing due, and re-armed for a time already past on the wall clock:
back-to-back fires (each a transaction) until the two clocks agreed; one ahead
fired that much late.

APScheduler keeps its times on the wall clock: set back, every one of them
(the poll's too) waits for the clock to catch up. The runtime's tick, on the
monotonic clock, calls :meth:`ScheduleDriver.keep_polling`, which fires a
poll overdue by two periods and re-arms it from the clock as it reads now.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

from apscheduler.executors.pool import BasePoolExecutor
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler

from ..persistence import PersistenceError
from .daemon_pool import DaemonPool
from .lease_renewal import log_failure
from .triggers import utc

log = logging.getLogger("kinbox.schedule")

POLL_SECONDS = 15.0
"""How often a driver looks at its table for what it was not told about: jobs another
process added, runs or wake-ups whose process stopped or died."""


JOB_THREADS = 10
"""Threads APScheduler runs its jobs (``fire``) on: its default pool's size."""


class DaemonJobs(BasePoolExecutor):  # type: ignore[misc]
    """APScheduler's thread pool executor on daemon threads: a ``fire`` waiting on a
    database that stopped answering holds no exit (the interpreter joins the stock pool's
    threads at exit, for as long as the statement waits: for ever, on a hung server)."""

    def __init__(self) -> None:
        super().__init__(DaemonPool(JOB_THREADS, "kinbox-schedule"))


class ScheduleDriver:
    """Calls ``fire`` when a durable schedule may be due (system clock only)."""

    def __init__(self, fire: Callable[[], object], *, enabled: bool, now: Callable[[], float],
                 poll_seconds: float | None = None) -> None:
        """``now``: the runtime's clock, the one the times given to :meth:`wake_at` are on."""
        self._fire = fire
        self._now = now
        self._poll = poll_seconds
        self._scheduler = (BackgroundScheduler(timezone="UTC", executors={"default": DaemonJobs()})
                           if enabled else None)
        self._fired = time.monotonic()  # when fire last began (or the driver was made)
        self._firing = threading.Lock()  # held while fire runs
        self._armed: dict[str, str] = {}
        """Each key's armed wake-up: its APScheduler id (under ``_armed_lock``)."""
        self._armed_lock = threading.Lock()
        self._arming = itertools.count(1)
        self._soon = False
        """A look :meth:`fire_soon` asked for is armed and has not begun (``_armed_lock``)."""

    @property
    def enabled(self) -> bool:
        """True when APScheduler drives this schedule (the system clock)."""
        return self._scheduler is not None

    def start(self) -> None:
        """Start APScheduler (and the poll, if any)."""
        if self._scheduler is None:
            return
        self._scheduler.start()
        self._fired = time.monotonic()
        self._arm_poll()

    def _arm_poll(self) -> None:
        if self._scheduler is not None and self._poll:
            self._scheduler.add_job(self._safe_fire, "interval", seconds=self._poll,
                                    id="poll", coalesce=True, max_instances=1,
                                    replace_existing=True)

    def keep_polling(self) -> None:
        """Fire now and re-arm the poll when it is overdue by two periods (the runtime's
        tick, on the monotonic clock, calls this): a wall clock set back stalls it."""
        if (self._scheduler is None or not self._poll or not self._scheduler.running
                or time.monotonic() - self._fired < 2 * self._poll):
            return
        # Taken without waiting, in one step: a fire running (a slow one, or one APScheduler
        # began since the look above) means no stalled poll, and the tick must not wait.
        if not self._firing.acquire(blocking=False):
            return
        try:
            log.warning("the schedule poll is overdue (the wall clock was set back?); "
                        "firing and re-arming it")
            self._fire_held()
        finally:
            self._firing.release()
        self._arm_poll()

    def stop(self) -> None:
        """Stop APScheduler; the tables keep the schedules."""
        if self._scheduler is not None and self._scheduler.running:
            # shutdown() marks the scheduler stopped before it takes the job store lock,
            # and a round of due jobs still running then fails to remove its fired date
            # job (JobLookupError, and a traceback). Pausing, then clearing the jobs
            # (which waits for that lock), leaves the round nothing to remove.
            self._scheduler.pause()
            self._scheduler.remove_all_jobs()
            self._scheduler.shutdown(wait=False)
        with self._armed_lock:
            self._armed.clear()
            self._soon = False

    def wake_at(self, ts: float | None, key: str) -> None:
        """Call ``fire`` when the runtime's clock reaches ``ts`` (epoch seconds). One wake-up
        per key (a job): a later call replaces it, and ``None`` (a job paused, cancelled or
        removed) drops it. Kept per key and time, every change of a job's time left its
        old wake-up in memory until that time came (a year ahead, for a yearly job), so
        a product that moved or removed many jobs grew without bound."""
        if self._scheduler is None:
            return
        # An id of its own each time, the key's last one dropped: APScheduler runs one
        # instance of an id at once and drops a date job due while one runs, so a key
        # re-armed under one id from inside its own fire (the cron tick re-arms
        # "cron-next") for a time already come lost that wake-up until the poll.
        wake_id = f"at:{key}#{next(self._arming)}"  # apart from the poll's and "soon#" looks
        # On the wall clock APScheduler waits on; read before the lock (a database clock may
        # ask its server).
        at = time.time() + max(0.0, ts - self._now()) if ts is not None else 0.0
        with self._armed_lock:  # one step: two calls for a key leave one wake-up
            old = self._armed.pop(key, None)
            if old is not None:
                try:
                    self._scheduler.remove_job(old)
                except JobLookupError:
                    pass  # it fired already (or is firing)
            if ts is None:
                return
            self._scheduler.add_job(self._fire_armed, "date", args=(key, wake_id),
                                    run_date=utc(at), id=wake_id, misfire_grace_time=None)
            self._armed[key] = wake_id

    def _fire_armed(self, key: str, wake_id: str) -> None:
        """A wake-up ``wake_at`` armed: it is no longer the key's (unless re-armed), then
        fire."""
        with self._armed_lock:
            if self._armed.get(key) == wake_id:
                del self._armed[key]
        self._safe_fire()

    def fire_soon(self) -> None:
        """Call ``fire`` as soon as APScheduler's thread can (another process changed a
        schedule); calls before it begins make one, a call while it runs one more after it.
        Each under an id of its own, as :meth:`wake_at`'s: under one id, a call while the
        last one ran was dropped by APScheduler (a second instance of a running job), and
        the change waited for the poll."""
        if self._scheduler is None or not self._scheduler.running:
            return
        with self._armed_lock:
            if self._soon:
                return
            self._scheduler.add_job(self._fire_soon, "date", id=f"soon#{next(self._arming)}",
                                    misfire_grace_time=None)
            self._soon = True

    def _fire_soon(self) -> None:
        """The look :meth:`fire_soon` armed: begun, so a change from now on arms another."""
        with self._armed_lock:
            self._soon = False
        self._safe_fire()

    def _safe_fire(self) -> None:
        with self._firing:
            self._fire_held()

    def _fire_held(self) -> None:
        """Fire (``_firing`` held); a failure is logged, the next wake-up tries again."""
        self._fired = time.monotonic()
        try:
            self._fire()
        except PersistenceError as exc:  # the database's (a lost connection: one line)
            log_failure(log, "firing due schedules", exc, "the next wake-up tries again")
        except Exception:
            log.exception("firing due schedules failed; the next wake-up tries again")
