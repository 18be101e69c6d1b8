"""``PeerService.send`` (the documented way to name a streaming session) holds a message to
the ``agent_send`` rules, as ``rt.post`` does, before anything is written.

A blank message passed the frame's own check (one character or more), was committed, and
was then rejected by the receiver ("the message is empty"), the row failed after a round
trip; an empty one, or one with a NUL character, was refused with the advice for a frame
too large ("Shorten it or split it"), which named nothing that was wrong with it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kinbox.actors import ManualClock, Runtime, ToolError
from kinbox.transport.grants import new_token
from kinbox.transport.identity import SEAL_NONCE_BYTES, DeviceIdentity

from .helpers import quiet_brain

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(("text", "says"), [
    ("   \n\t", "must not be empty"),
    ("", "must not be empty"),
    ("a\x00b", "NUL"),
    (None, "must be a string"),
])
def test_a_message_the_receiver_would_refuse_is_refused_at_the_send(
        tmp_path: Path, text: object, says: str) -> None:
    rt = Runtime(db=f"sqlite:///{tmp_path / 'k.db'}", brain=quiet_brain, clock=ManualClock(),
                 data_dir=tmp_path / "data").start()
    try:
        me = rt.create_session(None, "sender").id
        peer = DeviceIdentity.generate()
        rt.peers.peers.save_outbound(
            peer.device_id, "laptop", peer.public_key, "http://127.0.0.1:9",
            rt.peers.identity.seal(new_token(os.urandom(32)), os.urandom(SEAL_NONCE_BYTES)),
            frozenset({"agent"}), rt.clock.now())
        with pytest.raises(ToolError) as info:
            rt.peers.send(me, f"peer:{peer.device_id}", text)  # type: ignore[arg-type]
        assert info.value.code == "invalid_argument"
        assert says in info.value.message and "Shorten" not in info.value.message
        assert rt.inbox() == []
    finally:
        rt.stop()
