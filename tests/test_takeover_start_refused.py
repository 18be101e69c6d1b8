"""A taken-over row whose start the journal refused is a failed attempt, not left to its lease.

A row taken over from a dead worker records its turn's start before its brain runs
(``submit_turn_started``). When that write failed in the database (a blip: the lease is
still this runtime's), the run ended and left the row leased here with nothing to run or
renew it: the row, and every later row of its session, waited out a whole lease (for
ever on an injected clock), then came back as a takeover again. As a refused commit's
(``commit_refused``), its attempt fails with a backoff (the first, 2 s), and it stays a
suspect: its next start is recorded again (``test_takeover_start_backoff.py`` has the
start the database keeps refusing).
"""

from __future__ import annotations

from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.persistence import DatabaseFailed, NewMessage, Reply
from kinbox.persistence.inbox_claims import InboxClaims

from .conftest import Stores
from .helpers import wait_for

pytestmark = pytest.mark.timeout(60)


def test_a_takeover_whose_start_the_database_refused_runs_without_waiting_out_its_lease(
        db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = Stores(db_url)
    j = prepared.journal
    j.enqueue(NewMessage("first", "s0", "first"), 1)
    j.enqueue(NewMessage("second", "s0", "second"), 1)
    assert [r.message_id for r in j.claim("dead-worker", 1, lease=5).rows] == ["first"]
    j.mark_turn_started("dead-worker", "first", 1)  # it died mid-turn: a takeover
    prepared.close()

    real = InboxClaims.submit_turn_started
    refused: list[str] = []
    recorded: list[str] = []

    def refuse_once(self: InboxClaims, owner: str, message_id: str, now: float) -> Reply[Any]:
        if not refused:
            refused.append(message_id)
            reply: Reply[None] = Reply()
            reply.set_exception(DatabaseFailed("disk I/O error"))
            return reply
        recorded.append(message_id)
        return real(self, owner, message_id, now)

    monkeypatch.setattr(InboxClaims, "submit_turn_started", refuse_once)
    ran: list[str] = []

    def brain(turn: Turn) -> None:
        ran.extend(m.content for m in turn.messages)

    # The injected clock moves only past the backoff: a lease left to run out never would.
    rt = Runtime(db=db_url, brain=brain, clock=clock, lease_seconds=3600).start()
    try:
        wait_for(lambda: bool(refused), 20, what="the refused start")
        rt.run_until_idle(20)
        first = rt.inbox(target="s0")[0]
        assert first["status"] == "pending" and first["attempts"] == 2  # takeover, refusal
        assert first["available_at"] - clock.now() < 60  # a backoff, not the hour's lease
        assert ran == []
        clock.advance(first["available_at"] - clock.now())
        wait_for(lambda: ran == ["first", "second"], 20,
                 what="both rows to run after the refused start's backoff")
        assert refused == ["first"] and recorded == ["first"]  # still suspect: recorded
        rt.run_until_idle(20)
        assert {r["status"] for r in rt.inbox(target="s0")} == {"delivered"}
        assert rt.inbox(target="s0")[0]["attempts"] == 2  # no more once it ran
    finally:
        rt.stop()
