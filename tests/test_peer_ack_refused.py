"""Peer rows whose ack the database refuses go back to be sent again, not held for a lease.

The receiver committed the rows and acknowledged them; the sender's database then refused
the batch that records them ``delivered`` (a failed commit, a lost connection). Before,
the refusal left the link with an exception and the rows ``processing`` under its lease:
nothing renewed it and nothing sent them again, so the device's messages stood still for
the whole lease, after which a takeover counted each as a failed attempt of a dead link
and sent them one by one. They now go back unrun (no attempt counted), due after the
backoff a failed attempt would have cost, and the next link sends them again: the
receiver answers a repeat with the same ack.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection

from kinbox.actors import ManualClock, Runtime
from kinbox.persistence import DatabaseFailed, Reply
from kinbox.persistence.peer_outbox import PeerOutbox
from kinbox.transport import frames as f

from .helpers import quiet_brain, wait_for
from .peer_harness import FakePeer

pytestmark = pytest.mark.timeout(120)

LEASE = 3600.0


async def _ack_everything(ws: ServerConnection) -> None:
    """A receiver that commits every delivery (here: takes it) and acknowledges it."""
    async for text in ws:
        frame = json.loads(text)
        if frame.get("type") == "deliver":
            await ws.send(f.encode(f.Ack(frame["id"])))


def test_peer_rows_whose_ack_the_database_refuses_are_sent_again_not_held_for_a_lease(
        db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    real = PeerOutbox.submit_ack
    refusing = [True]
    refused: list[list[str]] = []

    def submit_ack(self: PeerOutbox, owner: str, message_ids: Any, now: float
                   ) -> Reply[list[str]]:
        if refusing[0]:
            refused.append(list(message_ids))
            reply: Reply[list[str]] = Reply()
            reply.set_exception(DatabaseFailed("disk I/O error"))
            return reply
        return real(self, owner, message_ids, now)

    monkeypatch.setattr(PeerOutbox, "submit_ack", submit_ack)
    peer = FakePeer(_ack_everything)
    try:
        with Runtime(db=db_url, brain=quiet_brain, clock=clock,
                     lease_seconds=LEASE) as rt:
            device = peer.grant_to(rt)
            me = rt.create_session(None, "sender").id
            sent = rt.peers.send_many(me, f"peer:{device}", ["one", "two", "three"])
            ids = [s["message_id"] for s in sent]
            wait_for(lambda: refused, 30, what="a refused ack")

            def rows() -> list[dict[str, Any]]:
                return [rt.context.journal.get(m) for m in ids]

            wait_for(lambda: all(r["status"] == "pending" for r in rows()), 30,
                     what="the rows handed back, not left leased for their lease")
            for r in rows():
                assert r["lease_owner"] is None and r["attempts"] == 0
                assert r["available_at"] < clock.now() + LEASE
            refusing[0] = False
            clock.advance(max(r["available_at"] for r in rows()) - clock.now())
            wait_for(lambda: all(r["status"] == "delivered" for r in rows()), 30,
                     what="the rows sent again and delivered")
            assert all(r["attempts"] == 0 for r in rows())
    finally:
        peer.close()
