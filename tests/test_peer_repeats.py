"""A delivery a peer sends again (its ack was lost) is heard as a repeat, not as a new
message. Each test failed on the code before its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import Runtime
from kinbox.actors.peer_backend import PeerHttpBackend
from kinbox.transport import receiver

pytestmark = pytest.mark.timeout(60)

TOKEN = "t" * 64


def _commit(device: str, message_id: str, text: str) -> receiver.Commit:
    return receiver.Commit(
        message_id,
        receiver.inbox_id(device, message_id),
        receiver.dedicated_session(device),
        text,
        message_id,
    )


def test_a_repeated_delivery_is_heard_with_created_false_and_a_new_one_with_true(
    any_db_url: str, tmp_path: Path
) -> None:
    """A batch holding a repeat is committed one by one (the fallback), which said nothing
    of what it found: every delivery in it, the repeat too, was heard as ``peer_received``
    like a new message (and a local send's ``sent`` says ``created``); and the new one
    beside the repeat was read back, in that transaction, as a repeat of itself."""
    heard: list[tuple[str, bool | None]] = []

    def observer(event: str, data: dict[str, Any]) -> None:
        if event == "peer_received":
            heard.append((data["message_id"], data.get("created")))

    with Runtime(db=any_db_url, data_dir=tmp_path / "data") as rt:
        now = rt.clock.now()
        rt.peers.peers.add_invite("a" * 64, frozenset({"agent"}), now, now + 600)
        assert rt.peers.peers.redeem("a" * 64, now, "dev1", "x", "K" * 43, TOKEN)
        rt.subscribe(observer)
        backend = PeerHttpBackend(rt.peers)
        first = _commit("dev1", "m1", "hello")
        assert backend.commit("dev1", TOKEN, [first]) == [None]
        assert heard == [(first.inbox_id, True)]
        heard.clear()
        second = _commit("dev1", "m2", "again")
        assert backend.commit("dev1", TOKEN, [first, second]) == [None, None]
        assert heard == [(first.inbox_id, False), (second.inbox_id, True)]
        assert len(rt.inbox()) == 2
