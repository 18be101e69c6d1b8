"""The runtime's clock thread: a tick every interval, and an alarm for a row coming due.

The tick is the fallback that finds everything (retries come due, leases
run out, idle actors to passivate, rows no notification announced). Between
ticks, a claim that saw a target's next row not yet due asks for an alarm
at its due time, so the row is claimed then and not up to a tick later:
a retry's backoff ends on time, and on PostgreSQL a send from another
process is claimed at once even when that process's clock reads a few
milliseconds ahead of this one's (the claim finds it "not yet due").

An alarm later than the next tick is left to the tick (which does what the
alarm would), and only the earliest alarm is kept. The thread waits on a
condition, so neither costs a thread or a timer of its own. Each tick comes
an interval after the last one ended, as a loop of ``wait(interval)`` would.
Alarms are asked for through ``RuntimeContext.alarm_in``: by a claim on
PostgreSQL, which reports when a head it saw comes due
(``ClaimResult.next_due``), and by a failed attempt, at the end of its backoff
(on SQLite nothing else would claim the retry before the tick).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


class Ticker:
    """Calls ``on_tick`` every ``interval`` seconds and ``on_alarm`` when an alarm rings."""

    def __init__(self, interval: float, on_tick: Callable[[], None],
                 on_alarm: Callable[[], None]) -> None:
        self.interval = interval
        self._on_tick = on_tick
        self._on_alarm = on_alarm
        self._cond = threading.Condition()
        self._stopped = False
        self._next_tick = math.inf  # none before start(), none while a tick runs
        self._alarm_at: float | None = None
        self._thread: threading.Thread | None = None
        self.alarms = 0
        """How many alarms rang (the runtime's statistics)."""

    def start(self) -> None:
        """Start the thread; the first tick comes one interval from now."""
        self._next_tick = time.monotonic() + self.interval
        self._thread = threading.Thread(target=self._run, name="kinbox-ticker", daemon=True)
        self._thread.start()

    def alarm_in(self, delay: float) -> None:
        """Ring ``on_alarm`` in ``delay`` seconds (at once when it is not positive), unless
        the next tick or an earlier alarm comes first."""
        with self._cond:
            at = time.monotonic() + max(0.0, delay)
            if at >= self._next_tick or (self._alarm_at is not None and self._alarm_at <= at):
                return
            self._alarm_at = at
            self._cond.notify()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (waits for a tick or alarm in progress, unless called from one)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        """The thread is alive (started and not stopped)."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                what = self._wait()
            if what is None:
                return
            if what == "tick":
                self._on_tick()
                with self._cond:
                    self._next_tick = time.monotonic() + self.interval
            else:
                self.alarms += 1
                self._on_alarm()

    def _wait(self) -> str | None:
        """Under the condition: wait for the next tick or alarm and say which ("tick"
        when both are due: the tick does the alarm's work too); None once stopped."""
        while not self._stopped:
            now = time.monotonic()
            due = self._next_tick if self._alarm_at is None else min(self._next_tick,
                                                                     self._alarm_at)
            if now < due:
                self._cond.wait(due - now)
                continue
            self._alarm_at = None  # due now, or due with the tick
            if self._next_tick <= now:
                self._next_tick = math.inf
                return "tick"
            return "alarm"
        return None


def no_alarm(delay: float) -> None:
    """The alarm of a runtime whose clock is moved by hand (it claims as the clock moves,
    and a real-time alarm would only claim too early) or that has no ticker: none."""
