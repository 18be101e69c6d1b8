"""Steering on PostgreSQL while another process changes the rows it takes.

``turn.steering()`` leases the session's next due rows into the running turn. Another
process (an operator's ``kinbox inbox cancel``) may change one of them between the
steering's read and its write: the write must apply only to rows still pending, so a
cancelled row is never brought back and run.
"""

from __future__ import annotations

import threading

import pytest

from kinbox.actors import ManualClock, Runtime, Turn

from .helpers import wait_for

pytestmark = pytest.mark.timeout(90)


def lock_waits_here(pg_url: str) -> int:
    """Statements of ``pg_url``'s database waiting for a lock now (other tests' databases on
    the same server are not counted)."""
    import psycopg2

    probe = psycopg2.connect(pg_url)
    try:
        with probe.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND wait_event_type = 'Lock'")
            return int(cur.fetchone()[0])
    finally:
        probe.close()


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
        # The operator's cancel of m2 (what ``rt.cancel`` runs on its writer) is written,
        # and its transaction still open.
        journal, written = operator.context.journal, threading.Event()
        cancelled = journal.writer.submit(lambda: (
            journal._cancel_op("m2", clock.now(), "operator", "not needed"),
            written.set(), commit.wait(30)))
        assert written.wait(20)
        steer.set()  # the turn's steering meets the cancel's lock on m2
        wait_for(lambda: lock_waits_here(pg_url) >= 1 or steered.is_set(),
                 what="the steering to wait for the cancel")
        commit.set()  # the cancel commits
        assert steered.wait(20)
        worker.run_until_idle(timeout=20)
        assert cancelled.result(20)[0]["status"] == "cancelled"  # what the operator was told
        rows = {r["message_id"]: r["status"] for r in worker.inbox()}
        assert rows == {"m1": "delivered", "m2": "cancelled"}
        assert taken == [[]] and seen == ["m1"]
    finally:
        steer.set()
        commit.set()
        operator.stop()
        worker.stop()
