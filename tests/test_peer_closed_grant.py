"""A grant closed here (``kinbox peers pause|revoke --direction outbound``, or the device's
signed refusal) fails every open row of the device at once, those waiting for a backoff too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kinbox.actors import ManualClock, Runtime
from kinbox.persistence.peers import OUTBOUND

from .helpers import quiet_brain, wait_for
from .peer_harness import Receiver

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("status", ["paused", "revoked"])
def test_a_row_waiting_for_its_backoff_fails_at_once_when_the_grant_here_closes(
        receiver: Receiver, tmp_path: Path, status: str) -> None:
    """``kinbox peers pause|revoke --direction outbound`` fails every open row of the
    device with the grant's status: a row waiting for its backoff (the device was
    offline) stayed ``pending``, listed as queued, until the backoff ran out (up to an
    hour), and only then failed."""
    clock = ManualClock()
    rt = Runtime(db=f"sqlite:///{tmp_path / 'o' / 'sender.db'}", brain=quiet_brain,
                 clock=clock).start()
    try:
        rec = rt.peers.pair(receiver.http, receiver.invite())
        receiver.kill()  # offline: the row goes back with the backoff
        me = rt.create_session(None, "me").id
        [sent] = rt.peers.send_many(me, f"peer:{rec.device_id}", ["hello"])
        journal = rt.context.journal
        mid = sent["message_id"]
        wait_for(lambda: journal.get(mid)["attempts"] == 1, 20, "the first failed attempt")
        assert journal.get(mid)["status"] == "pending"
        rt.peers.peers.set_status(rec.device_id, status, clock.now(), direction=OUTBOUND,
                                  last_error=f"{status} by the operator")
        wait_for(lambda: journal.get(mid)["status"] == "failed", 10,
                 "the row in backoff to fail with the grant's status")
        assert status in journal.get(mid)["last_error"]
    finally:
        rt.stop()


def test_a_signed_refusal_fails_the_rows_waiting_for_their_backoff_at_once(
        receiver: Receiver, tmp_path: Path) -> None:
    """The device was offline (the row waits for its backoff), comes back and has revoked
    this one: the refusal an ``agent_read`` hears closes the device here, and the row
    fails now with that reason, not when its backoff ends (it said pending, queued for a
    device that refused it, up to an hour)."""
    from kinbox.actors import ToolError

    clock = ManualClock()
    rt = Runtime(db=f"sqlite:///{tmp_path / 'o' / 'sender.db'}", brain=quiet_brain,
                 clock=clock).start()
    try:
        rec = rt.peers.pair(receiver.http, receiver.invite())
        receiver.kill()
        me = rt.create_session(None, "me").id
        [sent] = rt.peers.send_many(me, f"peer:{rec.device_id}", ["hello"])
        journal = rt.context.journal
        mid = sent["message_id"]
        wait_for(lambda: journal.get(mid)["attempts"] == 1, 20, "the first failed attempt")
        receiver.start()
        receiver.peers("revoke", rt.peers.identity.device_id)
        with pytest.raises(ToolError, match="revoked"):
            rt.peers.request(f"peer:{rec.device_id}", "read")
        wait_for(lambda: journal.get(mid)["status"] == "failed", 10,
                 "the row in backoff to fail with the device's refusal")
        assert "revoked" in journal.get(mid)["last_error"]
    finally:
        rt.stop()
