"""What a link's failure notes for the operator is bookkeeping: a database that refuses it
must not keep the link's rows from their retry.

A link whose peer's address answers without the pinned key's proof (a stale URL, a
stranger on it) retries its rows and notes the problem on the device (``kinbox peers
list``). Before, a refused note escaped the link before the rows' retries were recorded:
they stayed ``processing`` under a lease nothing renewed, and the device's messages stood
still for the whole lease, then each counted as a dead link's attempt. The note is now
given up (logged), and the rows are retried with the backoff as without it.
"""

from __future__ import annotations

from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection

from kinbox.actors import ManualClock, Runtime
from kinbox.persistence import DatabaseFailed
from kinbox.persistence.peers import PeerStore
from kinbox.transport.identity import DeviceIdentity

from .helpers import quiet_brain, wait_for
from .peer_harness import FakePeer

pytestmark = pytest.mark.timeout(120)

LEASE = 3600.0


async def _nothing(ws: ServerConnection) -> None:
    await ws.wait_closed()


def test_a_refused_problem_note_does_not_hold_the_links_rows_for_a_lease(
        db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    notes: list[str] = []

    def note_problem(self: PeerStore, device_id: str, *args: Any, **kwargs: Any) -> None:
        notes.append(device_id)
        raise DatabaseFailed("disk I/O error")

    monkeypatch.setattr(PeerStore, "note_problem", note_problem)
    peer = FakePeer(_nothing)
    try:
        with Runtime(db=db_url, brain=quiet_brain, clock=clock,
                     lease_seconds=LEASE) as rt:
            device = peer.grant_to(rt)
            peer.identity = DeviceIdentity.generate()  # answers now with a key not pinned
            me = rt.create_session(None, "sender").id
            [sent] = rt.peers.send_many(me, f"peer:{device}", ["hello"])
            wait_for(lambda: notes, 30, what="the refused problem note")

            def row() -> dict[str, Any]:
                return rt.context.journal.get(sent["message_id"])

            wait_for(lambda: row()["status"] == "pending", 30,
                     what="the row retried, not left leased for its lease")
            back = row()
            assert back["lease_owner"] is None and back["attempts"] == 1
            assert back["available_at"] < clock.now() + LEASE
    finally:
        peer.close()
