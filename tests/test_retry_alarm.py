"""A failed attempt's retry runs when its backoff ends, not at the dispatcher's next tick.

Nothing hands a retried row over: it waits in the journal until a claim finds it
due. On PostgreSQL the claim that follows the failure sees it not yet due and
asks for an alarm; on SQLite that claim reports no due times, so the retry
waited for the tick (up to ``tick_interval`` late). The failure now asks for an
alarm at the retry's time itself. With the tick set past the test's
timeout, a retry that waited for it would never run here. Each failure's alarm
rings, not only the earliest waiting one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kinbox.actors import Runtime, Turn
from kinbox.persistence import inbox_core

from .helpers import wait_for

NO_TICK = 600.0
FIRST_BACKOFF = inbox_core.backoff_delay(1, inbox_core.LOCAL.cap)
"""The wait after a session's first failed attempt (2 s)."""


class FailsFirst:
    """A brain whose first attempt at each session's message fails; when each attempt ran."""

    def __init__(self) -> None:
        self.attempts: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def __call__(self, turn: Turn) -> None:
        with self._lock:
            runs = self.attempts.setdefault(turn.session_id, [])
            runs.append(time.monotonic())
            first = len(runs) == 1
        if first:
            raise RuntimeError("the model timed out")
        turn.reply("done")

    def count(self, sid: str) -> int:
        with self._lock:
            return len(self.attempts.get(sid, []))

    def waited(self, sid: str) -> float:
        with self._lock:
            first, second = self.attempts[sid][:2]
        return second - first


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sessions", [1, 2])
def test_every_retry_runs_when_its_backoff_ends_without_a_tick(tmp_path: Path,
                                                              sessions: int) -> None:
    """With two, the second failure's alarm comes after the first's: both retries must run.
    (A loaded machine may wake the ticker once both are due: alarms due together ring
    once, and that claim finds both rows.)"""
    brain = FailsFirst()
    rt = Runtime(db=f"sqlite:///{tmp_path / 'k.db'}", brain=brain,
                 tick_interval=NO_TICK,
                 lease_seconds=4 * NO_TICK).start()
    try:
        project = rt.create_project("retry").id
        sids = [rt.create_session(project, f"S{k}").id for k in range(sessions)]
        for sid in sids:
            rt.post(sid, "hello")
            wait_for(lambda sid=sid: brain.count(sid) == 1, timeout=20,
                     what="the first attempt")
        for sid in sids:
            wait_for(lambda sid=sid: brain.count(sid) == 2, timeout=FIRST_BACKOFF + 8,
                     what=f"the retry without a tick ({brain.count(sid)} attempts ran)")
            assert FIRST_BACKOFF - 0.1 <= brain.waited(sid) < FIRST_BACKOFF + 3
        wait_for(lambda: len(rt.inbox(state="delivered")) == sessions, timeout=10,
                 what="the retries' commits")
        assert rt.statistics()["alarms"] >= 1  # no tick ran: an alarm claimed them
    finally:
        rt.stop()
