"""A graceful stop keeps the leases of the turns it waits for.

``Runtime.stop`` gives running turns its ``timeout`` to finish and commit, but it
stopped the ticker first, and the ticker is what renews leases (the dispatcher's tick).
A turn that took longer than its lease's remainder to wind down lost its lease in the
middle of the stop: on PostgreSQL another runtime claimed the row and ran the turn a
second time, and the first turn's commit was refused (fencing), its answer lost.
"""

from __future__ import annotations

import threading

import pytest

from kinbox.actors import Runtime, Turn

from .helpers import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

LEASE = 4.0
"""Short enough for a quick test, long enough that a loaded machine still renews it in
time while the turn runs (every third of it)."""
WIND_DOWN = 2.5 * LEASE
"""How long the first runtime's turn takes to finish once asked to stop: past its lease,
within the stop's timeout."""


def test_a_turn_winding_down_in_a_stop_keeps_its_lease_and_runs_once(pg_url: str) -> None:
    started = threading.Event()
    ran: list[str] = []

    def first(turn: Turn) -> None:
        ran.append("first")
        started.set()
        turn.wait_stop_requested(60)
        threading.Event().wait(WIND_DOWN)  # the turn's own work, saving what it did
        turn.reply("wound down")

    def second(turn: Turn) -> None:
        ran.append("second")
        turn.reply("ran again")

    a = Runtime(db=pg_url, brain=first, lease_seconds=LEASE).start()
    try:
        project = a.create_project("web")
        session = a.create_session(project.id, "chat")
        a.post(session.id, "ping", message_id="msg-once")
        wait_for(started.is_set, timeout=30, what="the first runtime's turn to start")
        with Runtime(db=pg_url, brain=second, lease_seconds=LEASE) as b:
            a.stop(timeout=WIND_DOWN * 3)  # the turn ends within it
            b.run_until_idle(timeout=30)
            texts = [e.text for e in b.transcript(session.id)]
            row = b.inbox()[0]
    finally:
        a.stop()
    assert ran == ["first"]
    assert texts == ["ping", "wound down"]
    assert row["status"] == "delivered"


def test_a_cron_run_winding_down_in_a_stop_keeps_its_lease(pg_url: str) -> None:
    """The same for a cron run: its lease is renewed on the tick too, and another runtime
    on the database took a run that was still winding down in its runtime's stop."""
    started, gate = threading.Event(), threading.Event()

    def slow(turn: Turn) -> str:
        started.set()
        turn.wait_stop_requested(30)
        assert gate.wait(30)  # its wind-down, until the test has looked
        return "done"

    lease = 1.5
    with Runtime(db=pg_url, brain=slow, lease_seconds=lease) as owner:
        job = owner.cron.add("digest", "0 9 * * *", "Summarize")
        owner.cron.trigger(job["job_id"])
        assert started.wait(20)
        # Started once the run is the owner's: a runtime already running could take it.
        with Runtime(db=pg_url, brain=slow, lease_seconds=lease) as other:
            stopping = threading.Thread(target=owner.stop, kwargs={"timeout": 60})
            stopping.start()
            try:
                begun = other.context.now()
                wait_for(lambda: other.context.now() > begun + 2 * lease, 10,
                         what="two leases' time to pass")
                taken = other.cron.tick()
            finally:
                gate.set()
                stopping.join(60)
            assert taken == [], "another process took over a run still winding down"
            assert [r["status"] for r in other.cron.runs(job["job_id"])] == ["success"]
