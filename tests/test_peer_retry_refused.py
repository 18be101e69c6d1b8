"""A peer row whose retry record the database refuses goes back to wait a backoff.

When a link drops, each row it held is a failed attempt (``Journal.retry``). Should the
database refuse that record while the lease is still the link's, the row stayed leased:
its device's rows (it is their head) waited out a whole lease, then a takeover counted
the link as dead. The row now goes back uncounted, due after the backoff the attempt
would have cost, as a local row's (``Journal.release_later``).
"""

from __future__ import annotations

from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection

from kinbox.actors import ManualClock, Runtime
from kinbox.persistence import DatabaseFailed, Journal, Reply
from kinbox.persistence.peers import OUTBOUND

from .helpers import quiet_brain, wait_for
from .peer_harness import FakePeer

pytestmark = pytest.mark.timeout(120)

LEASE = 3600.0


async def _hang_up(ws: ServerConnection) -> None:
    await ws.close()


def test_a_peer_row_whose_retry_record_is_refused_waits_a_backoff_not_its_lease(
        db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Journal.submit_retry
    refusing = [True]
    refused: list[str] = []

    def submit_retry(self: Journal, owner: str, message_id: str, *args: Any,
                     **kwargs: Any) -> Reply[Any]:
        if refusing[0]:
            refused.append(message_id)
            reply: Reply[Any] = Reply()
            reply.set_exception(DatabaseFailed("CHECK constraint failed"))
            return reply
        return real(self, owner, message_id, *args, **kwargs)

    monkeypatch.setattr(Journal, "submit_retry", submit_retry)
    peer = FakePeer(_hang_up)  # every link drops once open: its rows are retried
    try:
        with Runtime(db=db_url, brain=quiet_brain, clock=clock,
                     lease_seconds=LEASE) as rt:
            device = peer.grant_to(rt)
            me = rt.create_session(None, "sender").id
            [sent] = rt.peers.send_many(me, f"peer:{device}", ["hello"])
            mid = sent["message_id"]
            wait_for(lambda: refused, 30, what="the refused retry record")

            def row() -> dict[str, Any]:
                return rt.context.journal.get(mid)

            wait_for(lambda: row()["status"] == "pending", 30,
                     what="the row handed back, not left to its lease")
            back = row()
            assert back["lease_owner"] is None and back["attempts"] == 0
            assert clock.now() < back["available_at"] < clock.now() + LEASE
            refusing[0] = False
            clock.advance(back["available_at"] - clock.now())
            link = rt.peers.link_for(device)
            assert link is not None
            link.wake()
            wait_for(lambda: row()["attempts"] >= 1, 30,
                     what="the next attempt, recorded this time")
    finally:
        peer.close()


def test_a_closed_grants_failures_the_database_refuses_are_not_retried_at_full_speed(
        db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device paused here fails its rows at once, those waiting for a backoff too: a row
    handed back for its backoff (its failure record refused) is taken again at once by
    that claim, so the link must wait before it asks the database again, not loop at
    the writer's speed for as long as the record is refused."""
    refused: list[str] = []

    def submit_retry(self: Journal, owner: str, message_id: str, *args: Any,
                     **kwargs: Any) -> Reply[Any]:
        refused.append(message_id)
        reply: Reply[Any] = Reply()
        reply.set_exception(DatabaseFailed("CHECK constraint failed"))
        return reply

    peer = FakePeer(_hang_up)
    try:
        with Runtime(db=db_url, brain=quiet_brain, clock=clock,
                     lease_seconds=LEASE) as rt:
            device = peer.grant_to(rt)
            rt.peers.peers.set_status(device, "paused", clock.now(), direction=OUTBOUND,
                                      last_error="paused by the operator")
            monkeypatch.setattr(Journal, "submit_retry", submit_retry)
            me = rt.create_session(None, "sender").id
            rt.peers.send_many(me, f"peer:{device}", ["hello"])
            wait_for(lambda: refused, 30, what="the refused failure record")
            # A spinning link asks hundreds of times a second; one that waits, about once.
            with pytest.raises(AssertionError, match="timed out"):
                wait_for(lambda: len(refused) >= 100, 3, what="a hundred refusals")
    finally:
        peer.close()
