"""A row its send leased (SQLite's fast path) runs once, however long the sending thread
takes to hand it over.

The row is leased in the send's own transaction and offered to the slots by the sending
thread once the commit's answer reaches it. The dispatcher's look for rows leased here
that nothing runs (:mod:`kinbox.actors.unheld_leases`) saw it unheld at two looks, handed
it back and claimed it again, its turn ran; then the sending thread offered the row it
had been answered, and a second turn ran the brain again for the same message. Here the
sending thread is held by an observer of ``sent`` (they run on the sender's thread) for
as long as the dispatcher needs; a thread descheduled on a loaded machine does the same.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kinbox.actors import Runtime, Turn
from kinbox.actors.unheld_leases import LOOK_INTERVAL

from .helpers import wait_for

pytestmark = pytest.mark.timeout(90)


def test_a_row_leased_with_its_send_runs_once_when_the_sender_is_slow_to_hand_it_over(
        tmp_path: Path) -> None:
    seen: list[str] = []

    def brain(turn: Turn) -> None:
        seen.extend(m.message_id for m in turn.messages)

    rt = Runtime(db=f"sqlite:///{tmp_path}/slow.db", brain=brain, tick_interval=0.05)
    rt.start()
    try:
        sid = rt.create_session(rt.create_project("slow").id, "S").id
        held, go = threading.Event(), threading.Event()
        sender: list[threading.Thread] = []

        def observer(event: str, data: dict[str, object]) -> None:
            if event == "sent" and threading.current_thread() in sender:
                held.set()
                go.wait(60)  # the sending thread stalls between its commit and its offer

        rt.subscribe(observer)
        receipt: list[object] = []
        thread = threading.Thread(target=lambda: receipt.append(rt.post(sid, "hello")))
        sender.append(thread)
        thread.start()
        assert held.wait(20), "the send never committed"
        [row] = rt.inbox()
        assert row["status"] == "processing"  # leased with its send
        since = rt.context.now()
        # Long enough for the look to have taken it back, and its claim to have run it.
        wait_for(lambda: rt.context.now() - since > 4 * LOOK_INTERVAL and (
            bool(seen) or rt.inbox()[0]["status"] == "processing"), timeout=30,
            what="several looks for rows nothing runs")
        go.set()
        thread.join(20)
        wait_for(lambda: rt.inbox()[0]["status"] == "delivered", timeout=20,
                 what="the delivery")
        rt.run_until_idle(20)
        assert seen == [row["message_id"]], f"the brain ran {len(seen)} times for one message"
    finally:
        rt.stop()
