"""The slot table's rows across a runtime's stop: what it leased and never ran goes back."""

from __future__ import annotations

import threading

import pytest

from kinbox.actors import ManualClock, Runtime, Turn

from .conftest import Stores

pytestmark = pytest.mark.timeout(60)


def test_a_graceful_stop_hands_back_the_rows_waiting_for_a_slot(db_url: str,
                                                                clock: ManualClock) -> None:
    """Rows leased while every slot was busy (a send leases its target's head at once on
    SQLite) wait in the slot table. A stop left them leased: the next start took them
    over as the rows of a runtime that is gone, suspects run one at a time, as if a
    crash had interrupted them."""
    started = threading.Event()

    def brain(turn: Turn) -> None:
        started.set()
        turn.wait_stop_requested(30)
        turn.reply("stopped")

    rt = Runtime(db=db_url, brain=brain, clock=clock, max_active_sessions=1).start()
    try:
        ids = [rt.create_session(None, f"S{i}").id for i in range(3)]
        for sid in ids:
            rt.post(sid, "hi")
        assert started.wait(20)
    finally:
        rt.stop()
    stores = Stores(db_url)
    try:
        rows = {r["target_chat_id"]: r for r in stores.journal.rows()}
    finally:
        stores.close()
    assert rows[ids[0]]["status"] == "delivered"
    assert [(rows[sid]["status"], rows[sid]["lease_owner"], rows[sid]["attempts"])
            for sid in ids[1:]] == [("pending", None, 0)] * 2
