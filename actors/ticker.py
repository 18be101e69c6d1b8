"""The runtime's clock thread: a tick every interval, and an alarm for a row coming due.

The tick is the fallback that finds everything (retries come due, leases
run out, idle actors to passivate, rows no notification announced), at most
an interval late. An alarm claims sooner: whatever learns that a row comes
due before the next tick asks for one at its due time, through
``RuntimeContext.alarm_in``. A claim on PostgreSQL reports when a head it
saw comes due (``ClaimResult.next_due``): a send from another process whose
clock reads a few milliseconds ahead of this one's is "not yet due" when its
notification arrives. A failed attempt asks for one at its backoff's end (on
SQLite nothing else would claim the retry before the tick).

An alarm later than the next tick is left to the tick; earlier ones wait in
a small heap, each rung at its time (alarms due together ring once). The
thread waits on a condition, so neither costs a thread or a timer of its
own. Each tick comes an interval after the last one ended, as a loop of
``wait(interval)`` would. A tick or alarm that raises is logged and the thread goes
on: it is the runtime's only clock (lease renewals among its work), and its end would
be silent.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections.abc import Callable

log = logging.getLogger("kinbox.runtime")


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
        self._alarms: list[float] = []  # a heap of monotonic times, each before _next_tick
        self._thread: threading.Thread | None = None
        self.alarms = 0
        """How many alarms rang (the runtime's statistics)."""

    def start(self) -> None:
        """Start the thread; the first tick comes one interval from now. Once stopped too:
        a runtime whose start failed late (its wind-down stops the ticker) starts again."""
        with self._cond:
            self._stopped = False
            self._set_next_tick(time.monotonic() + self.interval)
        self._thread = threading.Thread(target=self._run, name="kinbox-ticker", daemon=True)
        self._thread.start()

    def alarm_in(self, delay: float) -> None:
        """Ring ``on_alarm`` in ``delay`` seconds (at once when it is not positive), unless
        the next tick comes first or the ticker has stopped."""
        with self._cond:
            at = time.monotonic() + max(0.0, delay)
            if self._stopped or at >= self._next_tick:
                return
            heapq.heappush(self._alarms, at)
            if self._alarms[0] == at:
                self._cond.notify()  # the thread waits for a later time

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
                self._call(self._on_tick, what)
                with self._cond:
                    self._set_next_tick(time.monotonic() + self.interval)
            else:
                self.alarms += 1
                self._call(self._on_alarm, what)

    @staticmethod
    def _call(callback: Callable[[], None], what: str) -> None:
        """Run a tick's or an alarm's callback; an error is logged, never the thread's end."""
        try:
            callback()
        except Exception:
            log.exception("the runtime's %s failed; the next one comes as usual", what)

    def _set_next_tick(self, at: float) -> None:
        """Under the condition: the next tick comes at ``at``. Alarms asked for while there
        was no next tick (before the start, during a tick) that come at ``at`` or later are
        dropped: the tick does their work."""
        self._next_tick = at
        kept = [a for a in self._alarms if a < at]
        if len(kept) < len(self._alarms):
            heapq.heapify(kept)
            self._alarms = kept

    def _wait(self) -> str | None:
        """Under the condition: wait for the next tick or alarm and say which ("tick"
        when both are due: the tick does the alarm's work too); None once stopped."""
        while not self._stopped:
            now = time.monotonic()
            due = min(self._next_tick, self._alarms[0]) if self._alarms else self._next_tick
            if now < due:
                self._cond.wait(due - now)
                continue
            while self._alarms and self._alarms[0] <= now:  # due now, or due with the tick
                heapq.heappop(self._alarms)
            if self._next_tick <= now:
                self._next_tick = math.inf
                return "tick"
            return "alarm"
        return None


def no_alarm(delay: float) -> None:
    """The alarm of a runtime that does not deliver (send-only, or not started yet) or
    whose clock is moved by hand (``Runtime.start`` says why): none."""
