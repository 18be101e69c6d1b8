"""Calls made later on one thread (``actors/delayed.py``)."""

from __future__ import annotations

import threading

import pytest

from kinbox.actors.delayed import Delayed

from .helpers import wait_for

pytestmark = pytest.mark.timeout(30)


def test_calls_run_once_each_in_due_order_on_one_thread() -> None:
    delayed, ran, threads = Delayed("test-delayed"), [], set()

    def call(name: str) -> None:
        ran.append(name)
        threads.add(threading.current_thread().name)

    try:
        delayed.call_in(0.2, "late", lambda: call("late"))
        delayed.call_in(0.0, "now", lambda: call("now"))
        delayed.call_in(0.1, "soon", lambda: call("soon"))
        wait_for(lambda: len(ran) == 3, 10, "the three calls")
        assert ran == ["now", "soon", "late"]
        assert threads == {"test-delayed"}
        assert len(delayed) == 0
    finally:
        delayed.close()


def test_a_key_holds_one_call_and_a_failing_call_stops_no_other() -> None:
    delayed, ran = Delayed("test-delayed"), []

    def boom() -> None:
        raise RuntimeError("a bug in one call")

    try:
        delayed.call_in(0.0, "a", boom)
        delayed.call_in(30.0, "b", lambda: ran.append("replaced"))
        delayed.call_in(0.05, "b", lambda: ran.append("b"))  # replaces the 30 s one
        wait_for(lambda: ran == ["b"], 10, "the replacing call")
        assert len(delayed) == 0
    finally:
        delayed.close()


def test_close_drops_what_waits_and_ignores_later_calls() -> None:
    delayed, ran = Delayed("test-delayed"), []
    delayed.call_in(30.0, "a", lambda: ran.append("a"))
    assert len(delayed) == 1
    delayed.close()
    delayed.call_in(0.0, "b", lambda: ran.append("b"))
    assert len(delayed) == 0
    wait_for(lambda: not any(t.name == "test-delayed" for t in threading.enumerate()), 10,
             "the thread's end")
    assert ran == []
