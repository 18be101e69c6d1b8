"""A receiver whose handshake slots are full is busy, not failing: over a real uvicorn
server on 127.0.0.1 holding its only handshake slot, it answers the upgrade 503 ``busy``
with ``Retry-After``. The sender counted that as a failed attempt of every row the link
carried (48 such answers failed a message) and flagged the device to the operator as an
unproven refusal; and it dialled again after the peer backoff (2 s), whatever the
receiver had asked. Now the rows go back uncounted, due no sooner than the wait the
receiver gave, and the device is not flagged."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

from kinbox.actors import ManualClock, Runtime, SystemClock
from kinbox.actors.errors import PairingFailed, ToolError
from kinbox.persistence.peers import OUTBOUND
from kinbox.transport import HandshakeLimits
from kinbox.transport import frames as f

from .helpers import quiet_brain, wait_for
from .peer_harness import Served

pytestmark = pytest.mark.timeout(120)

SLOT_SECONDS = 60.0
"""The receiver's handshake deadline: a held slot is free again at the latest after it,
the ``Retry-After`` a busy receiver gives (less what has passed)."""

MakeRuntime = Callable[..., Runtime]


def hold_the_slot(served: Served) -> ClientConnection:
    """A connection to the receiver for its only handshake slot, to be entered: a pairing
    that takes its challenge and says nothing (as a slow or hostile client would)."""
    return connect(f"ws://127.0.0.1:{served.port}/peers/pair", open_timeout=10, proxy=None,
                   legacy=True)


@pytest.fixture
def busy_pair(make_runtime: MakeRuntime, tmp_path: Path
              ) -> Iterator[tuple[Runtime, Served, str, ClientConnection]]:
    """A sender on the test's clock paired with a receiver whose single handshake slot is
    then held; the device id and the holding connection."""
    receiver = Runtime(db=f"sqlite:///{tmp_path / 'b' / 'b.db'}", brain=quiet_brain,
                       clock=SystemClock(), data_dir=tmp_path / "b").start()
    served = Served(receiver, HandshakeLimits(timeout=SLOT_SECONDS, max_pending=1))
    sender = make_runtime(brain=quiet_brain, data_dir=tmp_path / "a")
    try:
        device = sender.peers.pair(served.http, served.invite(), name="b").device_id
        with hold_the_slot(served) as holder:
            assert isinstance(f.parse(holder.recv(10)), f.Challenge)  # the slot is taken
            yield sender, served, device, holder
    finally:
        served.close()
        receiver.stop()


def test_a_busy_receiver_costs_no_attempt_no_flag_and_is_dialled_after_its_wait(
        busy_pair: tuple[Runtime, Served, str, ClientConnection], clock: ManualClock) -> None:
    sender, _, device, holder = busy_pair
    me = sender.create_session(None, "sender").id
    [sent] = sender.peers.send_many(me, f"peer:{device}", ["hello"])

    def row() -> dict[str, Any]:
        return sender.context.journal.get(sent["message_id"])

    wait_for(lambda: row()["status"] == "pending" and row()["available_at"] > clock.now(),
             30, "the link to hear the receiver is busy and hand the row back")
    back = row()
    assert back["attempts"] == 0, back["last_error"]  # busy is no failed attempt
    # Dialled again no sooner than the receiver asked: its slot is held up to a minute.
    assert back["available_at"] >= clock.now() + SLOT_SECONDS - 15
    rec = sender.peers.peers.device(device, OUTBOUND)
    assert rec is not None and rec.status == "active"
    # Shown in `peers list` as busy, not as a stranger's refusal: its messages wait unseen
    # no longer, and no attempt is counted.
    wait_for(lambda: "busy" in (note(sender, device) or ""), 30, "the device's busy note")
    assert "refused the connection" not in (note(sender, device) or "")

    holder.close()  # the receiver has a slot again (once its server has seen the close)

    def delivered_once_due() -> bool:
        now, r = clock.now(), row()
        if r["status"] == "pending" and r["available_at"] > now:  # busy (still): its wait
            clock.advance(r["available_at"] - now)
        return bool(r["status"] == "delivered")

    wait_for(delivered_once_due, 30, "the row delivered once due")
    assert row()["attempts"] == 0
    wait_for(lambda: note(sender, device) is None, 30, "the note cleared by the welcome")


def note(rt: Runtime, device: str) -> str | None:
    """The device's note in ``kinbox peers list`` (its last problem), None when clear."""
    rec = rt.peers.peers.device(device, OUTBOUND)
    assert rec is not None
    return rec.last_error


def test_a_read_of_a_busy_receiver_says_when_to_try_again_and_flags_nothing(
        busy_pair: tuple[Runtime, Served, str, ClientConnection]) -> None:
    sender, _, device, _ = busy_pair
    with pytest.raises(ToolError) as refused:
        sender.peers.request(f"peer:{device}", "read")
    assert refused.value.code == "execution_failed"
    assert refused.value.retry_after is not None
    assert 1 <= refused.value.retry_after <= SLOT_SECONDS
    rec = sender.peers.peers.device(device, OUTBOUND)
    assert rec is not None and rec.last_error is None


def test_many_busy_answers_never_fail_a_message(
        busy_pair: tuple[Runtime, Served, str, ClientConnection], clock: ManualClock) -> None:
    """The peer policy fails a row at its 48th attempt: busy answers count none."""
    sender, _, device, _ = busy_pair
    me = sender.create_session(None, "sender").id
    [sent] = sender.peers.send_many(me, f"peer:{device}", ["hello"])
    seen: list[float] = []

    def row() -> dict[str, Any]:
        return sender.context.journal.get(sent["message_id"])

    for _ in range(50):
        wait_for(lambda: row()["available_at"] > clock.now() and row()["available_at"]
                 not in seen, 30, "the next busy answer")
        seen.append(row()["available_at"])
        clock.advance(row()["available_at"] - clock.now())
    last = row()  # pending, or taken again by the link: never failed, never counted
    assert last["status"] in ("pending", "processing") and last["attempts"] == 0


def test_pairing_with_a_busy_device_says_it_is_up_and_when_to_try_again(
        busy_pair: tuple[Runtime, Served, str, ClientConnection]) -> None:
    """Told it "must be running kinbox serve at that address", a user checked a server
    that was running; busy, it is up and asks to be tried again after a while."""
    sender, served, _, _ = busy_pair
    with pytest.raises(PairingFailed) as failed:
        sender.peers.pair(served.http, served.invite(), name="b")
    assert failed.value.reason == "unavailable" and failed.value.retry
    assert failed.value.status == 503
    message = str(failed.value)
    assert "must be running" not in message
    assert "busy" in message
    wait = re.search(r"again in (\d+) s", message)
    assert wait is not None, message
    assert 1 <= int(wait.group(1)) <= SLOT_SECONDS
