"""An operator's requeue or cancel on PostgreSQL, where another process may move the row
between the operator's check of its state and the write: the write applies only to the
state it was checked against (it rewrote a delivered row as pending, or as cancelled)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.persistence import inbox_core

from .helpers import wait_for


def pause_after_check(monkeypatch: pytest.MonkeyPatch, rt: Runtime, event: inbox_core.Event
                      ) -> tuple[threading.Event, threading.Event]:
    """``rt``'s writer stops once, right after the state machine allowed ``event`` and before
    the UPDATE (as a busy database or a descheduled thread would stop it)."""
    checked, go = threading.Event(), threading.Event()
    real = inbox_core.transition

    def transition(message_id: str, state: Any, ev: inbox_core.Event) -> Any:
        result = real(message_id, state, ev)
        if (ev is event and not checked.is_set()
                and threading.current_thread() is rt._writer._thread):  # type: ignore[union-attr]
            checked.set()
            go.wait(30)
        return result
    monkeypatch.setattr(inbox_core, "transition", transition)
    return checked, go


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # the test looks at it
            out.append(exc)
    t = threading.Thread(target=run)
    t.start()
    return t, out


@pytest.mark.timeout(90)
def test_a_requeue_that_read_failed_does_not_resurrect_a_row_delivered_meanwhile(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    broken = threading.Event()
    broken.set()

    def brain(turn: Turn) -> None:
        if broken.is_set():
            raise RuntimeError("down")

    worker = Runtime(db=pg_url, brain=brain, clock=clock)   # `kinbox serve --brain` / worker
    operator = Runtime(db=pg_url, clock=clock)              # `kinbox inbox requeue ID`
    worker.start()
    operator.start()
    try:
        project = worker.create_project("p")
        a = worker.create_session(project.id, "A").id
        b = worker.create_session(project.id, "B").id
        mid = worker.post(b, "hello", sender=a).message_id
        for _ in range(12):
            worker.run_until_idle()
            clock.advance(60)
        assert [r["status"] for r in worker.inbox()] == ["failed"]
        broken.clear()
        checked, go = pause_after_check(monkeypatch, operator, inbox_core.Event.REQUEUE)
        t, late = in_thread(lambda: operator.requeue(mid))
        wait_for(checked.is_set, what="the operator to read the failed row")
        worker.requeue(mid)        # another operator (or `requeue --all-failed`) was first
        wait_for(lambda: worker.run_until_idle() is None
                 and [r["status"] for r in worker.inbox()] == ["delivered"], timeout=20,
                 what="the requeued row to be delivered")
        go.set()
        t.join(30)
        # delivered is terminal: the late requeue must be refused, the row stay delivered
        assert [r["status"] for r in worker.inbox()] == ["delivered"], late
        assert isinstance(late[0], inbox_core.IllegalTransition), late
    finally:
        operator.stop()
        worker.stop()


@pytest.mark.timeout(90)
def test_a_cancel_that_read_pending_does_not_cancel_a_row_delivered_meanwhile(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    turns: list[str] = []
    operator = Runtime(db=pg_url, clock=clock)              # `kinbox inbox cancel ID`
    operator.start()
    worker = Runtime(db=pg_url, clock=clock,
                     brain=lambda turn: turns.extend(m.message_id for m in turn.messages))
    try:
        project = operator.create_project("p")
        a = operator.create_session(project.id, "A").id
        b = operator.create_session(project.id, "B").id
        mid = operator.post(b, "hello", sender=a).message_id
        checked, go = pause_after_check(monkeypatch, operator, inbox_core.Event.CANCEL)
        t, late = in_thread(lambda: operator.cancel(mid, reason="stuck"))
        wait_for(checked.is_set, what="the operator to read the pending row")
        worker.start()
        wait_for(lambda: worker.run_until_idle() is None
                 and [r["status"] for r in worker.inbox()] == ["delivered"], timeout=20,
                 what="the row to be delivered")
        assert turns == [mid]
        go.set()
        t.join(30)
        # its turn ran and committed: the row must stay delivered, the cancel be refused
        assert [r["status"] for r in worker.inbox()] == ["delivered"], late
    finally:
        operator.stop()
        worker.stop()
