"""A refusal heard first by ``agent_read`` / ``agent_stop`` does not fail the rows the
device committed.

The laptop committed the phone's message, the link died before its ack reached the phone
(the row waits for a retry), and the laptop's operator paused or revoked the phone. The
phone's next contact is an ``agent_read`` of the laptop: its one-shot link hears the signed
refusal, and the phone failed every open row of the device, the one the laptop has too
(a user saw it ``failed``; a requeue once resumed was a repeat). The read's upgrade now
names the rows waiting for a retry, as a live link's does, and the refusal says, signed,
which of them the laptop has: those are delivered, the rest fail as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kinbox.actors import ManualClock, Runtime, ToolError
from kinbox.transport.receiver import inbox_id

from .helpers import quiet_brain, wait_for
from .peer_harness import CuttingProxy, Receiver

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("action", ["pause", "revoke"])
def test_a_refusal_heard_by_agent_read_delivers_the_rows_the_device_committed(
        receiver: Receiver, tmp_path: Path, action: str) -> None:
    clock = ManualClock()
    proxy = CuttingProxy(receiver.port)
    rt = Runtime(db=f"sqlite:///{tmp_path / 'o' / 'sender.db'}", brain=quiet_brain,
                 clock=clock).start()
    try:
        rec = rt.peers.pair(proxy.http, receiver.invite())
        phone = rt.peers.identity.device_id
        target = f"peer:{rec.device_id}"
        me = rt.create_session(None, "me").id
        journal = rt.context.journal
        [first] = rt.peers.send_many(me, target, ["first"])
        wait_for(lambda: journal.get(first["message_id"])["status"] == "delivered", 60,
                 "the first message over a live link")
        proxy.hold_replies()  # the laptop's acks stop reaching the phone
        [sent] = rt.peers.send_many(me, target, ["committed there, never acked here"])
        mid = sent["message_id"]
        wait_for(lambda: inbox_id(phone, mid) in receiver.peer_rows(phone), 60,
                 "the laptop to commit the message")
        assert journal.get(mid)["status"] == "processing", "its ack must not have arrived"
        proxy.cut()
        wait_for(lambda: journal.get(mid)["attempts"] == 1, 30, "the lost link's retry")
        assert journal.get(mid)["status"] == "pending"
        [unsent] = rt.peers.send_many(me, target, ["never reached the laptop"])
        receiver.peers(action, phone)
        with pytest.raises(ToolError, match="refused"):
            rt.tools_for(me).agent_read(target)  # the clock stands: no retry is due yet
        for m in (mid, unsent["message_id"]):
            wait_for(lambda m=m: journal.get(m)["status"] in ("delivered", "failed"), 60,
                     "the refusal to settle the row")
        assert journal.get(mid)["status"] == "delivered", journal.get(mid)["last_error"]
        assert journal.get(unsent["message_id"])["status"] == "failed"
        assert receiver.peer_rows(phone).count(inbox_id(phone, mid)) == 1
    finally:
        rt.stop()
        proxy.close()
