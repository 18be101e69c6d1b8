"""Is the event loop of async brains held by code that never awaits?

A brain's CPU loop or blocking call holds the loop's thread: no cancel
reaches it (a cancel is delivered at an await), and every async turn waits
meanwhile. The runtime's tick sends the loop a probe; a probe still not run
``grace`` seconds later means the loop is held, which is logged once per
stall, naming who holds it, and once more when the loop runs again.
Measured on the loop's own (monotonic) clock: how long the thread was held
is real time, whatever the runtime's clock says (an injected one moved by an
hour between two ticks is no stall).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

log = logging.getLogger("kinbox.async")


class LoopWatch:
    """The probe of one loop, and what it found."""

    def __init__(self, loop: asyncio.AbstractEventLoop, grace: float,
                 holder: Callable[[], str]) -> None:
        self.loop = loop
        self.grace = grace
        self.holder = holder
        """Who holds the loop now, as far as another thread can tell (for the log)."""
        self._lock = threading.Lock()
        self._probe_sent: float | None = None  # under _lock
        self._stall_told = False  # under _lock

    def tick(self) -> None:
        """Send a probe, or judge the one sent at an earlier tick (any thread)."""
        now = self.loop.time()
        with self._lock:
            sent, stalled = self._probe_sent, False
            if sent is None:
                self._probe_sent = now
            elif now - sent > self.grace and not self._stall_told:
                self._stall_told = stalled = True
        if sent is None:
            try:
                self.loop.call_soon_threadsafe(self._answered)
            except RuntimeError:  # the loop is closed: nothing to watch
                pass
        elif stalled:
            log.warning("the event loop of async brains has not run for %.1f s: %s; every "
                        "async turn waits for it, and no stop or timeout can cancel it",
                        now - sent, self.holder())

    def _answered(self) -> None:  # on the loop
        with self._lock:
            told, self._probe_sent, self._stall_told = self._stall_told, None, False
        if told:
            log.warning("the event loop of async brains runs again")
