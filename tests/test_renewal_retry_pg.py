"""A lease renewal the database refused is tried again at the next tick.

The renewal runs once a third of a lease; a failed one (a database blip: a failover, a
lost connection) said "the next tick renews again", but the runtime had already noted it
as done, so the next try came a third of a lease later. A blip covering two of those
(10 s to 20 s of a 30 s lease: a PostgreSQL failover) let the leases of running turns run
out although the database was back well before: another runtime then took the row over
and ran its brain a second time while the first turn still ran.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn

from .helpers import counting, wait_for

pytestmark = pytest.mark.timeout(90)


def test_a_renewal_a_database_blip_refused_is_tried_again_before_the_lease_runs_out(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    running, release = threading.Event(), threading.Event()
    runs: list[tuple[str, str]] = []

    def brain_of(name: str) -> Any:
        def brain(turn: Turn) -> None:
            runs.append((name, turn.messages[0].message_id))
            running.set()
            assert release.wait(60)
            turn.reply("done")
        return brain

    a = Runtime(db=pg_url, brain=brain_of("a"), clock=clock, lease_seconds=30)
    b = Runtime(db=pg_url, brain=brain_of("b"), clock=clock, lease_seconds=30)
    a.start()
    try:
        sid = a.create_session(a.create_project("p").id, "S").id
        a.post(sid, "one", message_id="m1")
        assert running.wait(20)
        b.start()  # another worker on the database, started after a took m1
        outage, renewals, ticks, claims = threading.Event(), [], [], []
        journal = a.context.journal
        monkeypatch.setattr(journal, "renew", counting(journal.renew, renewals, outage))
        renewal = a._renewal  # type: ignore[attr-defined]
        monkeypatch.setattr(renewal, "renew_if_due", counting(renewal.renew_if_due, ticks))
        b_journal = b.context.journal
        monkeypatch.setattr(b_journal, "claim", counting(b_journal.claim, claims))

        def advance(seconds: float, calls: list[int], more: int, what: str) -> None:
            seen = len(calls)
            clock.advance(seconds)
            wait_for(lambda: len(calls) >= seen + more, timeout=20, what=what)

        outage.set()  # the database goes away for a while
        advance(11, renewals, 1, "a renewal during the outage")
        advance(10, renewals, 1, "another renewal during the outage")
        outage.clear()  # the database is back, 9 s before the lease runs out
        advance(0.5, ticks, 3, "ticks of a with the database back")
        outage.set()  # and gone again for a moment as the lease's end passes
        advance(10, claims, 3, "claims of b past the first lease's end")
        assert runs == [("a", "m1")]  # m1's lease held: b never ran it
        outage.clear()
        release.set()
        a.run_until_idle(timeout=20)
        assert [(r["status"], r["attempts"]) for r in a.inbox()] == [("delivered", 0)]
        assert runs == [("a", "m1")]
    finally:
        release.set()
        b.stop()
        a.stop()
