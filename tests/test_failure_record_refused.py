"""A failed attempt whose record the database keeps refusing waits; it does not spin.

When the record of a failed attempt is refused (a database error; the lease still this
runtime's), the turn's rows go back unrun, so the session does not wait out a lease.
Handed back due, the run's claim took the row again at once and ran its brain again,
which failed again, and so on at full speed (a model call each time) for as long as the
database refused that record, while a release went through: a hook's write that can
never commit with it, a value the row cannot store. The row goes back to wait a backoff.
"""

from __future__ import annotations

from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.persistence import DatabaseFailed, Journal, Reply

from .helpers import of_kind, wait_for

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_failure_record_the_database_keeps_refusing_does_not_rerun_the_brain_at_once(
    db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    real = Journal.submit_retry
    refusing = [True]

    def submit_retry(self: Journal, *args: Any, **kwargs: Any) -> Reply[Any]:
        if refusing[0]:
            reply: Reply[Any] = Reply()
            reply.set_exception(DatabaseFailed("CHECK constraint failed"))
            return reply
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Journal, "submit_retry", submit_retry)
    calls: list[str] = []

    def brain(turn: Turn) -> None:
        calls.append(turn.messages[0].content)
        raise ValueError("the model timed out")

    chosen = of_kind(kind, brain)
    rt = Runtime(db=db_url, brain=chosen, clock=clock, lease_seconds=3600).start()
    try:
        session = rt.create_session(rt.create_project("p").id, "s").id
        rt.post(session, "hello")
        wait_for(lambda: bool(calls), 20, what="the first attempt")
        # Idle until the clock moves: the row waits, its brain not run again meanwhile.
        rt.run_until_idle(20)
        assert len(calls) == 1, f"the brain ran {len(calls)} times on a still clock"
        row = rt.inbox(target=session)[0]
        assert row["status"] == "pending" and row["available_at"] > clock.now()
        refusing[0] = False
        clock.advance(row["available_at"] - clock.now())
        wait_for(lambda: len(calls) == 2, 20, what="the next attempt, once the wait ended")
        rt.run_until_idle(20)
        assert rt.inbox(target=session)[0]["attempts"] == 1  # recorded this time
    finally:
        rt.stop()
