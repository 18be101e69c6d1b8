"""A device's signed refusal whose record the database refuses leaves no row leased.

The device refused this one (its operator paused or revoked it), signed; the sender
records that on the device (``paused``/``revoked``) and fails the rows. Before, a database
that refused that record raised out of the link before the rows' failures were recorded:
they stayed ``processing`` under a lease nothing renewed, the device's messages held for
the whole lease, then each counted as a dead link's attempt. The rows now go back
uncounted, due after a backoff (``Journal.release_later``); the link dials again then,
hears the refusal again, and records it once the database takes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime
from kinbox.persistence import DatabaseFailed
from kinbox.persistence.peers import OUTBOUND, PeerStore

from .helpers import quiet_brain, wait_for
from .peer_harness import Receiver

pytestmark = pytest.mark.timeout(180)

LEASE = 3600.0


def test_a_refusal_the_database_will_not_record_hands_the_rows_back(
        receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = PeerStore.close_outbound
    refusing = [True]
    refused: list[str] = []

    def close_outbound(self: PeerStore, device_id: str, *args: Any, **kwargs: Any) -> bool:
        if refusing[0]:
            refused.append(device_id)
            raise DatabaseFailed("disk I/O error")
        return real(self, device_id, *args, **kwargs)

    monkeypatch.setattr(PeerStore, "close_outbound", close_outbound)
    clock = ManualClock()
    rt = Runtime(db=f"sqlite:///{tmp_path / 'o' / 'sender.db'}", brain=quiet_brain,
                 clock=clock, lease_seconds=LEASE).start()
    try:
        rec = rt.peers.pair(receiver.http, receiver.invite())
        receiver.peers("revoke", rt.peers.identity.device_id)
        me = rt.create_session(None, "me").id
        [sent] = rt.peers.send_many(me, f"peer:{rec.device_id}", ["hello"])
        mid = sent["message_id"]
        journal = rt.context.journal
        wait_for(lambda: refused, 60, "the refused record of the device's refusal")
        wait_for(lambda: journal.get(mid)["status"] == "pending", 30,
                 "the row handed back, not left leased for its lease")
        back = journal.get(mid)
        assert back["lease_owner"] is None and back["attempts"] == 0
        assert back["available_at"] < clock.now() + LEASE
        refusing[0] = False
        clock.advance(back["available_at"] - clock.now())
        wait_for(lambda: journal.get(mid)["status"] == "failed", 60,
                 "the refusal heard again, recorded this time")
        device = rt.peers.peers.device(rec.device_id, OUTBOUND)
        assert device is not None and device.status == "revoked"
    finally:
        rt.stop()
