"""Steering on PostgreSQL while another process changes the rows it takes.

``turn.steering()`` leases the session's next due rows into the running turn. Another
process (an operator's ``kinbox inbox cancel``) may change one of them between the
steering's read and its write: the write must apply only to rows still pending, so a
cancelled row is never brought back and run.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.persistence import GroupCommitWriter

from .helpers import lock_waits, wait_for

pytestmark = pytest.mark.timeout(90)


def hold_after(writer: GroupCommitWriter, op: Any, until: threading.Event) -> list[Any]:
    """Run ``op`` on ``writer`` in a batch that then waits for ``until`` before it commits
    (its transaction holds what ``op`` locked meanwhile); the list gets its answer."""
    gate, holding = threading.Event(), threading.Event()
    writer.submit(lambda: (holding.set(), gate.wait(30)))
    assert holding.wait(10)
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(op())
        except Exception as exc:  # the test looks at it
            out.append(exc)
    threading.Thread(target=run, daemon=True).start()
    wait_for(lambda: writer.queued() >= 1, what="the operation to queue")
    writer.submit(lambda: until.wait(30))
    gate.set()
    return out


def test_a_row_cancelled_while_steering_reads_it_stays_cancelled(pg_url: str) -> None:
    clock = ManualClock()
    running, steer, steered = threading.Event(), threading.Event(), threading.Event()
    seen: list[str] = []
    taken: list[list[str]] = []

    def brain(turn: Turn) -> None:
        seen.extend(m.message_id for m in turn.messages)
        if turn.messages[0].message_id == "m1":
            running.set()
            assert steer.wait(30)
            taken.append([m.message_id for m in turn.steering()])
            steered.set()

    worker = Runtime(db=pg_url, brain=brain, clock=clock)
    operator = Runtime(db=pg_url, clock=clock)  # `kinbox inbox cancel`, another process
    worker.start()
    operator.start()
    commit = threading.Event()
    try:
        sid = worker.create_session(worker.create_project("p").id, "S").id
        worker.post(sid, "one", message_id="m1")
        assert running.wait(20)
        worker.post(sid, "two", message_id="m2")
        # The operator's cancel of m2 is written, and its transaction still open.
        cancelled = hold_after(operator.context.journal.writer,
                               lambda: operator.cancel("m2", reason="not needed"), commit)
        wait_for(lambda: operator.context.journal.writer.queued() == 0,
                 what="the cancel's batch to run")
        steer.set()  # the turn's steering meets the cancel's lock on m2
        wait_for(lambda: lock_waits(pg_url) >= 1 or steered.is_set(),
                 what="the steering to wait for the cancel")
        commit.set()  # the cancel commits
        assert steered.wait(20)
        worker.run_until_idle(timeout=20)
        wait_for(lambda: bool(cancelled), what="the cancel's answer")
        rows = {r["message_id"]: r["status"] for r in worker.inbox()}
        assert rows == {"m1": "delivered", "m2": "cancelled"}, (rows, cancelled)
        assert taken == [[]] and seen == ["m1"]
    finally:
        steer.set()
        commit.set()
        operator.stop()
        worker.stop()
