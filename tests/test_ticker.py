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
def test_every_alarm_rings_at_its_own_time_between_ticks() -> None:
    with running(60.0) as (ticker, calls):
        asked = time.monotonic()
        ticker.alarm_in(0.6)
        ticker.alarm_in(0.05)  # earlier: rings first, and the later one is kept
        ticker.alarm_in(0.3)
        wait_for(lambda: len(calls.alarms) == 3, timeout=5, what="three alarms")
        rang = [at - asked for at in calls.alarms]
        assert 0.05 <= rang[0] < 0.3 <= rang[1] < 0.6 <= rang[2]
        ticker.alarm_in(0)  # due at once
        wait_for(lambda: len(calls.alarms) == 4, timeout=5, what="the fourth alarm")
        assert ticker.alarms == 4 and calls.ticks == []


@pytest.mark.timeout(10)
def test_alarms_due_together_ring_once() -> None:
    with running(60.0) as (ticker, calls):
        with ticker._cond:  # held, so both are in the heap before the thread looks
            ticker.alarm_in(0)
            ticker.alarm_in(0)
        wait_for(lambda: calls.alarms, timeout=5, what="the alarm")
        later = time.monotonic()
        ticker.alarm_in(0.05)  # the next ring must be this one: the pair rang once
        wait_for(lambda: len(calls.alarms) == 2, timeout=5, what="the later alarm")
        assert calls.alarms[1] >= later + 0.05 and ticker.alarms == 2


class SlowTick(Calls):
    """Asks for alarms from inside its first tick, while the ticker has no next tick."""

    def __init__(self, ticker_box: list[Ticker]) -> None:
        super().__init__()
        self.box = ticker_box

    def tick(self) -> None:
        if not self.ticks:
            self.box[0].alarm_in(0.01)  # before the next tick: rings
            self.box[0].alarm_in(30.0)  # past it: the tick's work, dropped
        super().tick()


@pytest.mark.timeout(10)
def test_alarms_asked_for_during_a_tick_past_the_next_one_are_left_to_it() -> None:
    box: list[Ticker] = []
    calls = SlowTick(box)
    ticker = Ticker(0.3, calls.tick, calls.alarm)
    box.append(ticker)
    ticker.start()
    try:
        wait_for(lambda: len(calls.ticks) >= 3, timeout=5, what="three ticks")
        assert len(calls.alarms) == 1 and calls.alarms[0] < calls.ticks[1]
        assert ticker._alarms == []  # the 30 s alarm is not waiting past the ticks
    finally:
        ticker.stop()


@pytest.mark.timeout(10)
def test_an_alarm_asked_for_after_stop_is_ignored() -> None:
    with running(60.0) as (ticker, calls):
        ticker.stop()
        ticker.alarm_in(0)
        assert ticker._alarms == [] and calls.alarms == []


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


@pytest.mark.timeout(30)
def test_stop_wakes_the_waiting_thread_and_ends_it() -> None:
    with running(60.0) as (ticker, calls):
        assert ticker.running
        began = time.monotonic()
        ticker.stop()
        assert not ticker.running and time.monotonic() - began < 20  # not a 60 s wait
        assert calls.ticks == [] and calls.alarms == []


@pytest.mark.timeout(10)
def test_a_tick_or_alarm_that_raises_leaves_the_ticker_running() -> None:
    """A callback that raised ended the ticker's thread, silently and for good: no more
    ticks (lease renewals, due retries, takeovers), while the runtime looked healthy. The
    error is logged, and the next tick and alarm come as usual."""
    calls = Calls()
    failures = {"tick": 1, "alarm": 1}

    def tick() -> None:
        if failures["tick"]:
            failures["tick"] -= 1
            raise RuntimeError("a bug in one tick")
        calls.tick()

    def alarm() -> None:
        if failures["alarm"]:
            failures["alarm"] -= 1
            raise RuntimeError("a bug in one alarm")
        calls.alarm()

    def ask_alarm() -> bool:  # asked again and again: a tick due with one does its work
        ticker.alarm_in(0.0)
        return bool(calls.alarms)

    ticker = Ticker(0.05, tick, alarm)
    ticker.start()
    try:
        wait_for(lambda: len(calls.ticks) >= 2, timeout=5, what="ticks after the failing one")
        wait_for(ask_alarm, timeout=5, what="an alarm after the failing one")
        assert failures == {"tick": 0, "alarm": 0} and ticker.running
    finally:
        ticker.stop()
