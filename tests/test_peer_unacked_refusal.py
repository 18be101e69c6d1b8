"""A row the device committed, whose ack the link lost, is not failed by the device's
later refusal: the refusal says which of the rows the link carries it has.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from kinbox.actors import ManualClock, Runtime, ToolError
from kinbox.transport import frames as f
from kinbox.transport import handshake as hs
from kinbox.transport.grants import Refusal
from kinbox.transport.identity import DeviceIdentity
from kinbox.transport.invite_code import parse_code
from kinbox.transport.peer_client import pair_with
from kinbox.transport.receiver import inbox_id

from .helpers import quiet_brain, wait_for
from .peer_harness import CuttingProxy, Receiver

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("heard_by", ["retry", "agent_read"])
@pytest.mark.parametrize("action", ["pause", "revoke"])
def test_a_row_committed_before_the_cut_is_delivered_when_the_device_then_refuses(
        receiver: Receiver, tmp_path: Path, action: str, heard_by: str) -> None:
    """The laptop committed the phone's message, the link died before the ack reached the
    phone (the row went back for a retry), and the laptop's operator paused or revoked the
    phone: the retry's handshake is refused, and the phone marked the row ``failed``
    though the laptop has it (a manual retry once resumed delivered it twice). The row
    the laptop has is delivered; one it has not is failed as before. So too when the
    phone's next contact is an ``agent_read`` of the laptop: its one-shot link failed
    every open row of the device; its upgrade now names the rows waiting for a retry, as
    a live link's does, and the signed refusal says which of them the laptop has."""
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
                 "the laptop to commit the second message")
        assert journal.get(mid)["status"] == "processing", "its ack must not have arrived"
        proxy.cut()
        wait_for(lambda: journal.get(mid)["attempts"] == 1, 30, "the lost link's retry")
        assert journal.get(mid)["status"] == "pending"
        [unsent] = rt.peers.send_many(me, target, ["never reached the laptop"])
        receiver.peers(action, phone)
        if heard_by == "retry":
            clock.advance(10)  # the retry is due: the next handshake is refused
        else:
            with pytest.raises(ToolError, match="refused"):
                rt.tools_for(me).agent_read(target)  # the clock stands: no retry is due
        for m in (mid, unsent["message_id"]):
            wait_for(lambda m=m: journal.get(m)["status"] in ("delivered", "failed"), 60,
                     "the refusal to settle the row")
        assert journal.get(mid)["status"] == "delivered", journal.get(mid)["last_error"]
        assert journal.get(unsent["message_id"])["status"] == "failed"
        assert receiver.peer_rows(phone).count(inbox_id(phone, mid)) == 1
    finally:
        rt.stop()
        proxy.close()


def _link(receiver: Receiver, token: str, in_flight: str) -> ClientConnection:
    return connect(f"ws://127.0.0.1:{receiver.port}/peers/link", proxy=None, open_timeout=20,
                   additional_headers={"Authorization": f"Bearer {token}",
                                       f.IN_FLIGHT_HEADER: in_flight}, legacy=True)


def _hello(ws: ClientConnection, identity: DeviceIdentity,
           token: str) -> tuple[f.Challenge, f.Hello]:
    ch = f.parse(ws.recv(20))
    assert isinstance(ch, f.Challenge)
    hello = hs.hello(identity, ch, token, hs.new_nonce(random.randbytes(32)), ch.device_id)
    ws.send(f.encode(hello))
    return ch, hello


def test_a_refused_device_hears_which_named_rows_were_committed_and_no_one_else_does(
        receiver: Receiver) -> None:
    """The refusal's ``committed`` frame answers the device's own proven hello; a hello
    that proves nothing (a copied token, another key) hears none of its rows; a malformed
    header is refused at the upgrade, before anything is read."""
    me = DeviceIdentity.generate()
    paired = pair_with(receiver.http, me, parse_code(receiver.invite()), "raw",
                       hs.new_nonce(random.randbytes(32)))
    with _link(receiver, paired.token, "m1") as ws:
        _hello(ws, me, paired.token)
        assert isinstance(f.parse(ws.recv(20)), f.Welcome)
        ws.send(f.encode(f.Deliver("m1", "hello")))
        assert f.parse(ws.recv(20)) == f.Ack("m1")
    receiver.peers("revoke", me.device_id)

    other = DeviceIdentity.generate()

    class Impostor(DeviceIdentity):
        """Claims my device id, signs with another key."""

        def __init__(self) -> None:
            self.__dict__.update(other.__dict__)
            self.device_id = me.device_id

    for who, expected in ((Impostor(), []), (me, ["m1"])):
        with _link(receiver, paired.token, "m0 m1 m2") as ws:
            ch, hello = _hello(ws, who, paired.token)
            committed, refused = f.parse(ws.recv(20)), f.parse(ws.recv(20))
        assert committed == f.Committed(expected)
        assert isinstance(refused, f.Refused)
        assert hs.check_refused(who, ch, hello, paired.token, refused, paired.public_key,
                                committed) is Refusal.REVOKED
    with pytest.raises(InvalidStatus) as info, _link(receiver, paired.token, "m0,m1"):
        pass
    assert json.loads(info.value.response.body)["error"] == "malformed"
