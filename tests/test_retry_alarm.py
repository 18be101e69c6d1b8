"""A failed attempt's retry runs when its backoff ends, not at the dispatcher's next tick.

Nothing hands a retried row over: it waits in the journal until a claim finds it
due. On PostgreSQL the claim that follows the failure sees it not yet due and
asks for an alarm; on SQLite that claim reports no due times, so the retry
waited for the tick (up to ``tick_interval`` late). The failure now asks for an
alarm at the retry's time itself, on both. With the tick set past the test's
timeout, a retry that waited for it would never run here.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kinbox.actors import Runtime, Turn

from .helpers import wait_for

NO_TICK = 600.0
FIRST_BACKOFF = 2.0
"""``inbox_core.backoff_delay`` after a first failed attempt: 2**1 s."""


@pytest.mark.timeout(30)
def test_a_retry_runs_when_its_backoff_ends_without_a_tick(tmp_path: Path) -> None:
    attempts: list[float] = []
    lock = threading.Lock()

    def brain(turn: Turn) -> None:
        with lock:
            attempts.append(time.monotonic())
            first = len(attempts) == 1
        if first:
            raise RuntimeError("the model timed out")
        turn.reply("done")

    rt = Runtime(db=f"sqlite:///{tmp_path / 'k.db'}", brain=brain,
                 tick_interval=NO_TICK).start()
    try:
        project = rt.create_project("retry").id
        sid = rt.create_session(project, "S").id
        rt.post(sid, "hello")
        wait_for(lambda: len(attempts) == 2, timeout=FIRST_BACKOFF + 8,
                 what=f"the retry without a tick ({len(attempts)} attempts ran)")
        waited = attempts[1] - attempts[0]
        assert FIRST_BACKOFF - 0.1 <= waited < FIRST_BACKOFF + 3, waited
        wait_for(lambda: rt.inbox(state="delivered"), timeout=10, what="the retry's commit")
        assert rt.statistics()["alarms"] >= 1
    finally:
        rt.stop()
