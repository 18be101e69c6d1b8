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
