"""A row started as the runtime's stop begins is handed back, never dropped.

A send (or a run's end) starts a row's turn under the slot table's lock and tells the
session actor after it. A stop in between queues the actor's stop ahead of that
``Deliver``; pykka drops a told message still queued when its actor stops, so the row
stayed ``processing``, leased to a stopped runtime: other runtimes waited out its
lease (a fresh start on SQLite expires it) and took it over as a suspect (run alone, as
one that may have killed its process), though it never ran. The pool here is held busy
so that the interleaving is the same on every run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import Runtime

from .helpers import quiet_brain, wait_for

MakeRuntime = Callable[..., Runtime]

pytestmark = pytest.mark.timeout(60)


class Blocker:
    """Holds a pool thread (a slow turn of another session would) until ``go``."""

    def __init__(self) -> None:
        self.running, self.go = threading.Event(), threading.Event()

    def _run_slice(self) -> None:
        self.running.set()
        assert self.go.wait(30)


async def quiet_async_brain(turn: object) -> None:
    """An ``async def`` brain that says nothing (its turns run on the event loop)."""


@pytest.mark.parametrize("brain", [quiet_brain, quiet_async_brain], ids=["sync", "async"])
def test_a_row_told_after_the_stop_reached_its_actor_is_handed_back(
        make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch, brain: Any) -> None:
    rt = make_runtime(brain=brain, max_active_sessions=1)
    sid = rt.create_session(rt.create_project("p").id, "S").id
    slots = rt.context.slots
    assert slots is not None
    blocker = Blocker()
    slots.pool.schedule(blocker)  # type: ignore[arg-type]
    assert blocker.running.wait(10)

    real_tell = slots._tell
    telling = threading.Event()

    def late_tell(started: Any) -> None:
        started = list(started)
        if started:
            telling.set()
            ref = started[0][0]
            # The stop got in between: the actor's stop is queued before this Deliver.
            wait_for(lambda: slots.stopped and not ref.actor_inbox.empty(), timeout=30,
                     what="the stop to reach the session actor")
        real_tell(started)

    monkeypatch.setattr(slots, "_tell", late_tell)
    sender = threading.Thread(target=lambda: rt.post(sid, "hello", message_id="m1"))
    sender.start()
    assert telling.wait(10)
    stopper = threading.Thread(target=lambda: rt.stop(timeout=20))
    stopper.start()
    sender.join(30)
    blocker.go.set()
    stopper.join(40)
    assert not stopper.is_alive() and not sender.is_alive()

    again = Runtime(db=rt.url, clock=rt.clock)  # send-only: it reads, never claims
    again.start()
    try:
        row = again.inbox()[0]
        assert (row["status"], row["attempts"]) == ("pending", 0)
    finally:
        again.stop()
