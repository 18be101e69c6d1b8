"""The runtime's ticker: a tick every interval, and an alarm that rings between ticks."""

from __future__ import annotations

import threading
import time

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


@pytest.mark.timeout(10)
def test_an_alarm_rings_between_ticks_and_only_the_earliest_is_kept() -> None:
    calls = Calls()
    ticker = Ticker(60.0, calls.tick, calls.alarm)
    ticker.start()
    try:
        asked = time.monotonic()
        ticker.alarm_in(0.5)
        ticker.alarm_in(0.05)  # earlier: replaces it
        ticker.alarm_in(0.3)  # later than the one set: dropped
        wait_for(lambda: calls.alarms, timeout=5, what="the alarm")
        assert 0.05 <= calls.alarms[0] - asked < 0.3
        ticker.alarm_in(0)  # due at once
        wait_for(lambda: len(calls.alarms) == 2, timeout=5, what="the second alarm")
        assert ticker.alarms == 2 and calls.ticks == []
    finally:
        ticker.stop()


@pytest.mark.timeout(10)
def test_ticks_keep_their_interval_and_an_alarm_past_the_next_tick_is_left_to_it() -> None:
    calls = Calls()
    ticker = Ticker(0.05, calls.tick, calls.alarm)
    ticker.start()
    try:
        ticker.alarm_in(30.0)  # the next tick comes first: it does the alarm's work
        wait_for(lambda: len(calls.ticks) >= 5, timeout=5, what="five ticks")
        assert calls.alarms == [] and ticker.alarms == 0
        gaps = [b - a for a, b in zip(calls.ticks, calls.ticks[1:], strict=False)]
        assert min(gaps) >= 0.045
    finally:
        ticker.stop()


@pytest.mark.timeout(10)
def test_an_alarm_asked_for_before_start_rings_once_it_runs() -> None:
    calls = Calls()
    ticker = Ticker(60.0, calls.tick, calls.alarm)
    ticker.alarm_in(0.05)
    ticker.start()
    try:
        wait_for(lambda: calls.alarms, timeout=5, what="the alarm asked for before start")
        assert calls.ticks == []
    finally:
        ticker.stop()


@pytest.mark.timeout(10)
def test_stop_wakes_the_waiting_thread_and_ends_it() -> None:
    calls = Calls()
    ticker = Ticker(60.0, calls.tick, calls.alarm)
    ticker.start()
    assert ticker.running
    began = time.monotonic()
    ticker.stop()
    assert not ticker.running and time.monotonic() - began < 2.0  # not a 60 s wait
    assert calls.ticks == [] and calls.alarms == []
