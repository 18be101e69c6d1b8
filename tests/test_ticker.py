"""The runtime's ticker: a tick every interval, and an alarm that rings between ticks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from kinbox.actors.ticker import Ticker

from .helpers import wait_for


class Calls:
    def __init__(self) -> None:
        self.ticks: list[float] = []
        self.alarms: list[float] = []
        self.lock = threading.Lock()

    def tick(self) -> None:
        with self.lock:
            self.ticks.append(time.monotonic())

    def alarm(self) -> None:
        with self.lock:
            self.alarms.append(time.monotonic())


@contextmanager
def running(interval: float, *, alarm_first: float | None = None
            ) -> Iterator[tuple[Ticker, Calls]]:
    """A started ticker and what it called, stopped at the end (``alarm_first``: an alarm
    asked for before it starts)."""
    calls = Calls()
    ticker = Ticker(interval, calls.tick, calls.alarm)
    if alarm_first is not None:
        ticker.alarm_in(alarm_first)
    ticker.start()
    try:
        yield ticker, calls
    finally:
        ticker.stop()


@pytest.mark.timeout(10)
def test_an_alarm_rings_between_ticks_and_only_the_earliest_is_kept() -> None:
    with running(60.0) as (ticker, calls):
        asked = time.monotonic()
        ticker.alarm_in(0.5)
        ticker.alarm_in(0.05)  # earlier: replaces it
        ticker.alarm_in(0.3)  # later than the one set: dropped
        wait_for(lambda: calls.alarms, timeout=5, what="the alarm")
        assert 0.05 <= calls.alarms[0] - asked < 0.3
        ticker.alarm_in(0)  # due at once
        wait_for(lambda: len(calls.alarms) == 2, timeout=5, what="the second alarm")
        assert ticker.alarms == 2 and calls.ticks == []


@pytest.mark.timeout(10)
def test_ticks_keep_their_interval_and_an_alarm_past_the_next_tick_is_left_to_it() -> None:
    with running(0.05) as (ticker, calls):
        ticker.alarm_in(30.0)  # the next tick comes first: it does the alarm's work
        wait_for(lambda: len(calls.ticks) >= 5, timeout=5, what="five ticks")
        assert calls.alarms == [] and ticker.alarms == 0
        gaps = [b - a for a, b in zip(calls.ticks, calls.ticks[1:], strict=False)]
        assert min(gaps) >= 0.045


@pytest.mark.timeout(10)
def test_an_alarm_asked_for_before_start_rings_once_it_runs() -> None:
    with running(60.0, alarm_first=0.05) as (_, calls):
        wait_for(lambda: calls.alarms, timeout=5, what="the alarm asked for before start")
        assert calls.ticks == []


@pytest.mark.timeout(10)
def test_stop_wakes_the_waiting_thread_and_ends_it() -> None:
    with running(60.0) as (ticker, calls):
        assert ticker.running
        began = time.monotonic()
        ticker.stop()
        assert not ticker.running and time.monotonic() - began < 2.0  # not a 60 s wait
        assert calls.ticks == [] and calls.alarms == []
