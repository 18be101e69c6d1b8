"""An idle link waits for work instead of polling the database for it.

A device's link with nothing to send claimed its rows (a writer transaction; on
PostgreSQL an advisory lock too) once a second, for as long as the runtime ran, and once
more at every move of an injected clock, for every paired device. It now claims when
something can have given it work: a send to the device committed here, the device's
next row comes due (a retry's backoff, a lease running out), or the device scan finds
rows another process queued. A send that commits while the link goes to sleep wakes it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, SystemClock
from kinbox.actors import peers as peers_module
from kinbox.persistence import Reply, WindowClaim
from kinbox.persistence.peer_outbox import PeerOutbox

from .helpers import quiet_brain, wait_for
from .peer_harness import Served

pytestmark = pytest.mark.timeout(120)

MakeRuntime = Callable[..., Runtime]


class Calls:
    """The journal calls of the links, by target: window claims and looks at the head's
    due time (``next_due``, read just before an idle link sleeps); ``on_look`` runs once,
    in the next look from a link's thread, after its read and before it answers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.claims: Counter[str] = Counter()
        self.looks: Counter[str] = Counter()
        self.on_look: Callable[[], None] | None = None
        real_claim, real_due = PeerOutbox.submit_claim, PeerOutbox.next_due
        calls = self

        def submit_claim(outbox: PeerOutbox, owner: str, target: str, *args: Any,
                         **kwargs: Any) -> Reply[WindowClaim]:
            calls.claims[target] += 1
            return real_claim(outbox, owner, target, *args, **kwargs)

        def next_due(outbox: PeerOutbox, target: str) -> float | None:
            calls.looks[target] += 1
            due = real_due(outbox, target)
            hook = calls.on_look
            if hook is not None and threading.current_thread().name.startswith("kinbox-peer-"):
                calls.on_look = None
                hook()  # after the read: what it commits, the link has not seen
            return due

        monkeypatch.setattr(PeerOutbox, "submit_claim", submit_claim)
        monkeypatch.setattr(PeerOutbox, "next_due", next_due)


@pytest.fixture
def paired(make_runtime: MakeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
           ) -> Iterator[tuple[Runtime, str, Calls]]:
    """A sender on the test's clock paired with a served receiver (real sockets); the
    device id and the links' journal calls, counted from before the pairing."""
    calls = Calls(monkeypatch)
    receiver = Runtime(db=f"sqlite:///{tmp_path / 'b' / 'b.db'}", brain=quiet_brain,
                       clock=SystemClock(), data_dir=tmp_path / "b").start()
    served = Served(receiver)
    try:
        sender = make_runtime(brain=quiet_brain, data_dir=tmp_path / "a")
        device = sender.peers.pair(served.http, served.invite(), name="b").device_id
        yield sender, device, calls
    finally:
        served.close()
        receiver.stop()


def asleep(rt: Runtime, device: str) -> Callable[[], bool]:
    """True once the device's link sleeps with no wake pending (the pairing woke it once
    more after its first look)."""
    def check() -> bool:
        link = rt.peers.links.get(device)
        return link is not None and link.asleep and not link.woken
    return check


def _delivered(rt: Runtime, sent: dict[str, Any]) -> bool:
    return bool(rt.context.journal.get(sent["message_id"])["status"] == "delivered")


def test_an_idle_link_claims_nothing_while_time_passes(
        paired: tuple[Runtime, str, Calls], clock: ManualClock) -> None:
    sender, device, calls = paired
    target = f"peer:{device}"
    wait_for(asleep(sender, device), 20, "the link's look, then its sleep")
    before = calls.claims[target]

    def time_passed_and_it_claimed() -> bool:
        clock.advance(1.0)  # each check, one more second of the runtime's time
        return calls.claims[target] > before

    # Three seconds of real time, hundreds of the runtime's: it claimed at each second of
    # both (each move of an injected clock woke every link).
    with pytest.raises(AssertionError, match="timed out"):
        wait_for(time_passed_and_it_claimed, 3, "an idle link's claim")
    me = sender.create_session(None, "sender").id
    [sent] = sender.peers.send_many(me, target, ["hello"])  # work wakes it at once
    wait_for(lambda: _delivered(sender, sent), 20, "the send delivered")


def test_a_send_committed_while_the_idle_link_goes_to_sleep_wakes_it(
        paired: tuple[Runtime, str, Calls], monkeypatch: pytest.MonkeyPatch) -> None:
    """The link's claim found nothing; before it sleeps, another thread's send commits
    (and wakes it). Deterministic: the send runs inside the link's look at its head, after
    the empty claim and the read that found no row, before the wait. The device scan is
    off: a wake lost there would be made good by the scan a second later, unseen."""
    monkeypatch.setattr(peers_module, "DEVICE_SCAN_SECONDS", 3600.0)
    sender, device, calls = paired
    target = f"peer:{device}"
    wait_for(asleep(sender, device), 20, "the link's look, then its sleep")
    me = sender.create_session(None, "sender").id
    sent: list[dict[str, Any]] = []

    def send_from_another_thread() -> None:
        def send() -> None:
            sent.extend(sender.peers.send_many(me, target, ["between claim and sleep"]))
        thread = threading.Thread(target=send)
        thread.start()
        thread.join(30)  # committed (and the link woken) before the link sleeps

    calls.on_look = send_from_another_thread
    looks = calls.looks[target]
    link = sender.peers.link_for(device)
    assert link is not None
    link.wake()  # one more look: empty claim, then the send, then the sleep
    wait_for(lambda: calls.looks[target] > looks and sent, 20, "the send inside the look")
    wait_for(lambda: _delivered(sender, sent[0]), 20,
             "the send committed as the link went to sleep, delivered")


def test_rows_another_process_queued_for_an_idle_link_are_sent(
        paired: tuple[Runtime, str, Calls], db_url: str, tmp_path: Path,
        clock: ManualClock) -> None:
    """A send-only runtime on the same database cannot wake this process's link: the
    device scan finds its rows (on SQLite nothing else says another process committed)."""
    sender, device, _ = paired
    wait_for(asleep(sender, device), 20, "the link's sleep")
    with Runtime(db=db_url, clock=clock, data_dir=tmp_path / "a") as poster:
        assert poster.send_only
        me = poster.create_session(None, "poster").id
        [sent] = poster.peers.send_many(me, f"peer:{device}", ["from another process"])
    wait_for(lambda: _delivered(sender, sent), 20, "the other process's row delivered")
