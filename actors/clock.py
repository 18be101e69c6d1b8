"""Clocks: the only place the runtime reads the time.

Policy code takes ``now`` as an argument; the runtime gets it from a clock
object it was given. :class:`ManualClock` lets tests and scenarios move time
by hand (a 2-hour threshold takes microseconds) and tells its listeners, so
the dispatcher notices rows that just became due.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from .errors import ConfigError
from .validation import finite_number


def check_step(seconds: object) -> None:
    """A :class:`ConfigError` (``field="seconds"``) unless ``seconds`` is a step a clock
    may take: a finite number >= 0 (not a bool). A step back would undo due times; NaN
    or infinity would stay on the clock for good, and no retry would ever come due."""
    if not finite_number(seconds) or seconds < 0:
        raise ConfigError(f"a clock moves forward by a finite number of seconds >= 0, "
                          f"not {seconds!r}", field="seconds")


class Clock(Protocol):
    """Something that tells the time in epoch seconds."""

    def now(self) -> float:
        """The current time, in seconds since the epoch."""
        ...


class SystemClock:
    """The wall clock."""

    now = staticmethod(time.time)
    """``time.time()`` itself: the hot path reads the clock a few times per message."""


class ManualClock:
    """A clock that moves only when told to (``advance`` / ``set``)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self._listeners: list[Callable[[float], None]] = []

    def now(self) -> float:
        """The clock's current time."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (:func:`check_step`) and notify listeners; return the
        new time."""
        check_step(seconds)
        with self._lock:
            self._now += seconds
            now = self._now
            listeners = list(self._listeners)
        for listener in listeners:
            listener(now)
        return now

    def subscribe(self, listener: Callable[[float], None]) -> Callable[[], None]:
        """Call ``listener(now)`` after every advance; returns an unsubscribe function."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)
        return unsubscribe
