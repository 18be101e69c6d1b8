"""The link of a device revoked (or paused) here ends once it has failed the device's rows.

A revoked grant is never active again (pairing anew makes a new one). Its link still ran
for as long as the runtime did: a thread per revoked device, each claiming through the
writer and reading the journal every second, however long ago the device was revoked.
Now the link ends when it finds nothing more to fail; a later send to the device (here,
or from another process, which the device scan finds) starts one that fails it and ends.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from kinbox.actors import ManualClock, Runtime
from kinbox.persistence.peers import OUTBOUND
from kinbox.transport.grants import new_token
from kinbox.transport.identity import SEAL_NONCE_BYTES, DeviceIdentity

from .helpers import quiet_brain, wait_for

pytestmark = pytest.mark.timeout(90)


def link_threads(device_id: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate()
            if t.name == f"kinbox-peer-{device_id}" and t.is_alive()]


def status_of(rt: Runtime, message_id: str) -> str:
    return next(r["status"] for r in rt.inbox() if r["message_id"] == message_id)


def paired_device(rt: Runtime, name: str, status: str) -> str:
    """A device paired outbound (at an address nothing answers), in ``status``: its id."""
    peer = DeviceIdentity.generate()
    rt.peers.peers.save_outbound(
        peer.device_id, name, peer.public_key, "http://127.0.0.1:9",
        rt.peers.identity.seal(new_token(os.urandom(32)), os.urandom(SEAL_NONCE_BYTES)),
        frozenset({"agent"}), rt.clock.now())
    rt.peers.peers.set_status(peer.device_id, status, rt.clock.now(), direction=OUTBOUND)
    return peer.device_id


def test_a_revoked_devices_link_ends_and_a_later_send_still_fails(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    rt = Runtime(db=url, brain=quiet_brain, clock=ManualClock(),
                 data_dir=tmp_path / "data").start()
    try:
        me = rt.create_session(None, "sender").id
        device = paired_device(rt, "gone", "revoked")
        [sent] = rt.peers.send_many(me, f"peer:{device}", ["hello"])
        wait_for(lambda: status_of(rt, sent["message_id"]) == "failed", 30,
                 "the row to the revoked device to fail")
        wait_for(lambda: not link_threads(device), 30, "the revoked device's link to end")
        assert device not in rt.peers.links
        rt.peers._link_every_device()  # the device scan: nothing to fail, no link
        assert not link_threads(device) and device not in rt.peers.links

        [again] = rt.peers.send_many(me, f"peer:{device}", ["hello again"])
        wait_for(lambda: status_of(rt, again["message_id"]) == "failed", 30,
                 "a later send to the revoked device to fail")
        wait_for(lambda: not link_threads(device), 30, "its link to end again")

        # A row another process queued (a send-only runtime: it runs no link) is found by
        # the device scan and failed, and that link ends too.
        with Runtime(db=url, data_dir=tmp_path / "data") as sender:
            [queued] = sender.peers.send_many(me, f"peer:{device}", ["from elsewhere"])
        wait_for(lambda: status_of(rt, queued["message_id"]) == "failed", 30,
                 "the row another process queued to fail")
        wait_for(lambda: not link_threads(device), 30, "its link to end")
    finally:
        rt.stop()


def test_a_send_racing_the_revoked_links_let_go_keeps_it_looking(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A send woke the link it looked up outside the service's lock: the link, having found
    nothing to fail, could let go in between, and the wake fell on a link that had ended.
    The row then waited for the device scan (up to a second, more under load) instead of
    being failed at once. Here the test plays the link's part and lets go exactly there."""
    from kinbox.actors import peers as peers_module

    outcomes: list[bool] = []
    racers: list[threading.Thread] = []

    class RacingLink(peers_module.PeerLink):
        armed = True

        def start(self) -> None:
            pass  # no thread of its own: the test says when it lets go

        def wake(self) -> None:
            if RacingLink.armed:
                RacingLink.armed = False
                lock = self.svc._lock  # which side of the lock the wake is on
                if lock.locked():  # woken under the lock: its let_go can only come after
                    racers.append(threading.Thread(
                        target=lambda: outcomes.append(self.svc.let_go(self))))
                    racers[-1].start()
                else:  # woken outside it: the link's let_go fits before the wake
                    outcomes.append(self.svc.let_go(self))
            super().wake()

    monkeypatch.setattr(peers_module, "PeerLink", RacingLink)
    monkeypatch.setattr(peers_module, "DEVICE_SCAN_SECONDS", 3600.0)  # no scan to rescue it
    url = f"sqlite:///{tmp_path / 'k.db'}"
    rt = Runtime(db=url, brain=quiet_brain, clock=ManualClock(),
                 data_dir=tmp_path / "data").start()
    try:
        me = rt.create_session(None, "sender").id
        device = paired_device(rt, "gone", "revoked")
        link = rt.peers.link_for(device)  # the revoked device's link, found nothing yet
        assert isinstance(link, RacingLink)
        rt.peers.send_many(me, f"peer:{device}", ["hello"])
        for t in racers:
            t.join(30)
        assert outcomes == [False], "the link let go of a device a send had just woken"
        assert rt.peers.links.get(device) is link and link.woken
    finally:
        rt.stop()


def test_a_paused_devices_link_ends_and_a_resume_starts_it_again(tmp_path: Path) -> None:
    """A paused device's link claimed through the writer and read the journal every second
    for as long as the device stayed paused, a thread per paused device, for nothing: its
    rows fail at once, and a send wakes it. Now it ends as a revoked one's does; a send, or
    rows another process queued, start one that fails them, and a resume (here, or by
    another process's `kinbox peers resume`) is found by the device scan, which starts the
    link that sends again."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    rt = Runtime(db=url, brain=quiet_brain, clock=ManualClock(),
                 data_dir=tmp_path / "data").start()
    try:
        me = rt.create_session(None, "sender").id
        device = paired_device(rt, "laptop", "paused")
        [sent] = rt.peers.send_many(me, f"peer:{device}", ["hello"])
        wait_for(lambda: status_of(rt, sent["message_id"]) == "failed", 30,
                 "the row to the paused device to fail")
        wait_for(lambda: not link_threads(device), 30, "the paused device's link to end")
        rt.peers._link_every_device()  # the device scan: nothing to fail, no link
        assert not link_threads(device) and device not in rt.peers.links

        with Runtime(db=url, data_dir=tmp_path / "data") as sender:  # runs no link
            [queued] = sender.peers.send_many(me, f"peer:{device}", ["from elsewhere"])
        wait_for(lambda: status_of(rt, queued["message_id"]) == "failed", 30,
                 "the row another process queued to fail")
        wait_for(lambda: not link_threads(device), 30, "its link to end again")

        # Resumed by another process: the scan starts the link, which tries the device.
        with Runtime(db=url, data_dir=tmp_path / "data") as other:
            other.peers.peers.set_status(device, "active", other.clock.now(),
                                         direction=OUTBOUND)
        wait_for(lambda: device in rt.peers.links, 30, "the resumed device's link to start")
        [resumed] = rt.peers.send_many(me, f"peer:{device}", ["back again"])
        row = lambda: next(r for r in rt.inbox() if r["message_id"] == resumed["message_id"])  # noqa: E731
        wait_for(lambda: row()["status"] == "pending" and row()["attempts"] == 1, 30,
                 "the link to try the unreachable device")
        assert link_threads(device)
    finally:
        rt.stop()
