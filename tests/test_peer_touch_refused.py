"""A link's "last seen" note is bookkeeping: a database that refuses it must not stop the
link from carrying the device's messages.

A link notes the device as seen (``kinbox peers list``) when the peer proves its key, and
again as acks come. Before, a refused note (a write that timed out behind a busy writer,
a PostgreSQL failover) escaped the link: at the welcome it ended the link before a frame
was sent, again at every reconnect, so nothing reached the device for as long as the note
was refused; among the acks it also skipped the hand-back of a claim under way, whose rows
stayed leased until their lease ran out and were then counted as a dead link's attempts.
The note is now given up (logged), and the link carries on as without it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection

from kinbox.actors import ManualClock, Runtime
from kinbox.persistence import DatabaseFailed
from kinbox.persistence.peers import PeerStore

from .helpers import quiet_brain, wait_for
from .peer_harness import FakePeer

pytestmark = pytest.mark.timeout(120)


async def _ack_everything(ws: ServerConnection) -> None:
    async for text in ws:
        frame = json.loads(text)
        if frame["type"] == "deliver":
            await ws.send(json.dumps({"v": 1, "type": "ack", "id": frame["id"]}))


def test_a_refused_last_seen_note_does_not_keep_the_messages_from_the_device(
        db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    notes: list[str] = []

    def touch(self: PeerStore, device_id: str, *args: Any, **kwargs: Any) -> None:
        notes.append(device_id)
        raise DatabaseFailed("disk I/O error")

    monkeypatch.setattr(PeerStore, "touch", touch)
    peer = FakePeer(_ack_everything)
    try:
        with Runtime(db=db_url, brain=quiet_brain, clock=clock) as rt:
            device = peer.grant_to(rt)
            me = rt.create_session(None, "sender").id
            sent = rt.peers.send_many(me, f"peer:{device}", ["one", "two", "three"])

            def rows() -> list[dict[str, Any]]:
                return [rt.context.journal.get(s["message_id"]) for s in sent]

            wait_for(lambda: all(r["status"] == "delivered" for r in rows()), 30,
                     what="the messages delivered although the note is refused")
            assert notes and all(r["attempts"] == 0 for r in rows())
    finally:
        peer.close()
