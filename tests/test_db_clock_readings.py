"""Which reading of the server's clock a process carries forward, and that the time it tells
never goes back, whatever threads ask while readings switch (no server needed)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from kinbox.persistence.db_clock import (
    DRIFT,
    NO_READING,
    DatabaseClock,
    Reading,
    better_reading,
)

from .helpers import wait_for


@pytest.mark.timeout(10)
def test_a_reading_with_a_longer_round_trip_does_not_replace_a_tighter_one() -> None:
    kept = Reading(server=1000.0, mono=10.0, round_trip=0.0004)
    late = Reading(server=1002.0, mono=12.0, round_trip=0.020)  # waited for the GIL
    assert better_reading(kept, late) is kept


@pytest.mark.timeout(10)
def test_a_kept_reading_ages_by_the_drift_allowance_until_a_new_one_wins() -> None:
    kept = Reading(server=1000.0, mono=10.0, round_trip=0.0004)
    fair = Reading(server=1000.0 + 30, mono=40.0, round_trip=0.040)  # good to 20 ms
    # 30 s later the kept one may be off by 0.2 ms + 30 s x 500 ppm = 15.2 ms: still tighter.
    assert kept.error_at(40.0) == pytest.approx(0.0002 + 30 * DRIFT, abs=1e-9)
    assert better_reading(kept, fair) is kept
    # 60 s later (30.2 ms) a reading good to 20 ms wins.
    newer = Reading(server=1000.0 + 60, mono=70.0, round_trip=0.040)
    assert better_reading(kept, newer) is newer


@pytest.mark.timeout(10)
def test_a_looser_reading_that_the_kept_one_cannot_explain_replaces_it() -> None:
    # The server's clock was stepped 1 s forward (or this host slept): the kept reading
    # predicts 1002.0 at mono 12, a reading good to 40 ms says 1003.0. Both cannot be right.
    kept = Reading(server=1000.0, mono=10.0, round_trip=0.0004)
    stepped = Reading(server=1003.0, mono=12.0, round_trip=0.080)
    assert better_reading(kept, stepped) is stepped
    # Within both bounds (41 ms at most apart), the tighter kept one stays.
    late = Reading(server=1002.03, mono=12.0, round_trip=0.080)
    assert better_reading(kept, late) is kept


@pytest.mark.timeout(10)
def test_an_equal_or_tighter_reading_replaces_the_kept_one_and_any_beats_none() -> None:
    kept = Reading(server=1000.0, mono=10.0, round_trip=0.001)
    same = Reading(server=1001.0, mono=11.0, round_trip=0.001 - 2 * DRIFT)
    assert better_reading(kept, same) is same
    assert better_reading(NO_READING, kept) is kept


class _NoServer:
    """Stands in for the database: the scripted clock below never sends a query."""

    class _Conn:
        closed = False
        autocommit = False

    def _connect(self) -> _Conn:
        return self._Conn()


class ScriptedClock(DatabaseClock):
    """A DatabaseClock whose readings come from the test, on a monotonic clock it moves."""

    def __init__(self, readings: list[Reading], monotonic: Callable[[], float]) -> None:
        self.script = readings
        super().__init__(_NoServer(), resync=1.0, monotonic=monotonic)  # type: ignore[arg-type]

    def _read_once(self) -> Reading:
        return self.script[0] if len(self.script) == 1 else self.script.pop(0)


class Mono:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.mark.timeout(10)
def test_a_tighter_reading_behind_the_time_told_holds_it_until_it_catches_up() -> None:
    mono = Mono(10.0)
    loose = Reading(server=1000.0, mono=10.0, round_trip=0.020)
    clock = ScriptedClock([loose], mono)
    mono.t = 10.999
    assert clock.now() == pytest.approx(1000.999, abs=1e-6)
    # At the next read a reading good to 0.1 ms says the first ran 10 ms ahead.
    clock.script = [Reading(server=1000.99, mono=11.0, round_trip=0.0002)]
    mono.t = 11.0
    # The first reading carried forward, while the clock's reader thread reads the next.
    assert clock.now() == pytest.approx(1001.0, abs=1e-6)
    wait_for(lambda: clock.reads == 2, 10, "the next reading")
    assert clock.now() == pytest.approx(1001.0, abs=1e-6)  # not 1000.99: it never goes back
    mono.t = 11.005
    assert clock.now() == pytest.approx(1001.0, abs=1e-6)  # held while the new reading catches up
    mono.t = 11.02
    assert clock.now() == pytest.approx(1001.01, abs=1e-6)  # then the new reading's time


@pytest.mark.timeout(30)
def test_threads_asking_the_time_while_readings_switch_never_see_it_go_back() -> None:
    # Readings alternate 5 ms ahead and 5 ms behind, each tighter than the last, and one
    # switch happens at every read; every thread's answers must never decrease.
    step = [0]

    def next_reading() -> Reading:
        step[0] += 1
        now = time.monotonic()
        offset = 0.005 if step[0] % 2 else -0.005
        return Reading(server=1000.0 + now + offset, mono=now, round_trip=1.0 / step[0])

    class Switching(ScriptedClock):
        def _read_once(self) -> Reading:
            return next_reading()

    clock = Switching([], time.monotonic)
    clock.resync = 0.0005
    backwards: list[tuple[float, float]] = []
    # Until readings switched many times under the threads (a second on an idle machine;
    # a loaded one gives the clock's reader thread fewer turns).
    deadline = time.monotonic() + 20.0

    def ask() -> None:
        last = 0.0
        while clock.reads <= 100 and time.monotonic() < deadline:
            t = clock.now()
            if t < last:
                backwards.append((last, t))
            last = t

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clock.reads > 100  # readings switched many times under the threads
    assert backwards == []
