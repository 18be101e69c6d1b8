"""A clean stop of a sending runtime hands the rows its links hold back unrun: no attempt,
no backoff, no error; the next process sends them at once. A real websocket link on
127.0.0.1 to a peer that holds its acks, so the rows are surely in flight at the stop."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import socket
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from websockets.asyncio.server import ServerConnection

from kinbox.actors import ManualClock, Runtime
from kinbox.transport import frames as f
from kinbox.transport.grants import new_token
from kinbox.transport.identity import SEAL_NONCE_BYTES, DeviceIdentity

from .helpers import quiet_brain, wait_for
from .peer_harness import FakePeer

pytestmark = pytest.mark.timeout(60)


class HoldingPeer:
    """A peer that records every ``deliver`` and acknowledges only once told to; told to
    hang up, it closes the link once it has ``hang_up_after`` frames."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.answer = threading.Event()
        self.hang_up_after: int | None = None
        self.fake = FakePeer(self._serve)

    async def _serve(self, ws: ServerConnection) -> None:
        async for text in ws:
            frame = f.parse(text)
            if isinstance(frame, f.Deliver):
                self.seen.append(frame.id)
                if self.answer.is_set():
                    await ws.send(f.encode(f.Ack(frame.id)))
                if len(self.seen) == self.hang_up_after:
                    await ws.close()


def _rows(path: Path) -> dict[str, tuple[object, ...]]:
    """The peer rows as the database file holds them (no runtime on it)."""
    with contextlib.closing(sqlite3.connect(path)) as con:
        return {r[0]: r[1:] for r in con.execute(
            "SELECT message_id, status, attempts, available_at, last_error, lease_owner "
            "FROM agent_inbox_messages WHERE transport = 'suzent_peer'")}


def test_a_clean_stop_hands_the_rows_in_flight_back_unrun(tmp_path: Path) -> None:
    """The stop closed the socket under the link, which took that for a lost link: every
    row in flight counted a failed attempt and waited out the peer backoff (2 s), with an
    error saying the link closed, though nothing failed. (Unless the link happened to be
    between two reads at the stop: three stops in a row, each with every row out.)"""
    path = tmp_path / "sender.db"
    url = f"sqlite:///{path}"
    peer = HoldingPeer()
    clock = ManualClock()
    try:
        with Runtime(db=url, brain=quiet_brain, clock=clock) as rt:
            device = peer.fake.grant_to(rt)
            rt.peers.stop()  # the rows are queued first, for the links below to send
            me = rt.create_session(None, "sender").id
            rt.peers.send_many(me, f"peer:{device}", [f"m{i}" for i in range(5)])
        before = _rows(path)
        for stop in range(3):
            peer.seen.clear()
            with Runtime(db=url, brain=quiet_brain, clock=clock) as rt:
                wait_for(lambda: sorted(peer.seen) == sorted(before), 20, "every row sent")
                assert {r["status"] for r in rt.inbox()} == {"processing"}
            assert _rows(path) == {mid: ("pending", 0, row[2], None, None)
                                   for mid, row in before.items()}, f"stop {stop}"
        peer.answer.set()
        with Runtime(db=url, brain=quiet_brain, clock=clock) as rt:
            wait_for(lambda: {r["status"] for r in rt.inbox()} == {"delivered"}, 20,
                     "the rows to be delivered by the next link, the clock unmoved")
            assert {r["attempts"] for r in rt.inbox()} == {0}
    finally:
        peer.fake.close()


def test_a_link_the_peer_closes_still_counts_an_attempt(tmp_path: Path) -> None:
    """Only the runtime's own stop is no failure: a link lost while it runs is one."""
    peer = HoldingPeer()
    peer.hang_up_after = 3
    clock = ManualClock()
    try:
        with Runtime(db=f"sqlite:///{tmp_path / 'sender.db'}", brain=quiet_brain,
                     clock=clock) as rt:
            device = peer.fake.grant_to(rt)
            me = rt.create_session(None, "sender").id
            rt.peers.send_many(me, f"peer:{device}", ["a", "b", "c"])
            wait_for(lambda: {r["attempts"] for r in rt.inbox()} == {1}, 20,
                     "the lost link's rows to count an attempt")
            rows = rt.inbox()
            assert {(r["status"], r["available_at"]) for r in rows} == {
                ("pending", clock.now() + 2.0)}
            assert all("the link closed" in r["last_error"] for r in rows)
    finally:
        peer.fake.close()


@pytest.mark.timeout(90)
def test_a_stop_during_a_connect_that_never_answers_releases_its_rows(tmp_path: Path) -> None:
    """The link had leased its rows and was opening a socket to an address that accepts and
    says nothing (the stop cannot cut a connect short); the connect's time-out, met while
    stopping, is part of the stop: the rows go back unrun before the writer closes."""
    path = tmp_path / "sender.db"
    silent = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True).start()
    peer = HoldingPeer()
    try:
        rt = Runtime(db=f"sqlite:///{path}", brain=quiet_brain, clock=ManualClock()).start()
        try:
            me = rt.create_session(None, "sender").id
            device = peer.fake.grant_to(rt)
            rt.peers.stop()  # the link to the real peer: out of the way
            rec = rt.peers.peers.device(device, "outbound")
            assert rec is not None
            rt.peers.peers.save_outbound(device, "silent", rec.public_key,
                                         f"http://127.0.0.1:{silent.getsockname()[1]}",
                                         rec.token_sealed or "", frozenset({"agent"}),
                                         rt.clock.now())
            rt.peers.send_many(me, f"peer:{device}", ["a", "b"])
            before = _rows(path)
            rt.peers.start()
            wait_for(lambda: bool(accepted), 20, "the link to connect")
            assert {r["status"] for r in rt.inbox()} == {"processing"}
        finally:
            rt.stop()
        assert _rows(path) == {mid: ("pending", 0, row[2], None, None)
                               for mid, row in before.items()}
    finally:
        silent.close()
        for s in accepted:
            s.close()
        peer.fake.close()


class DeafPeers:
    """A server on 127.0.0.1 that completes each websocket upgrade and then neither reads
    nor writes: a link to it waits for a challenge, and its close is never answered (the
    client gives up after its close timeout, 2 s)."""

    GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.http = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.upgraded: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed by close()
            while True:
                conn, _ = self.server.accept()
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(4096)
                key = next(line.split(b":", 1)[1].strip() for line in request.split(b"\r\n")
                           if line.lower().startswith(b"sec-websocket-key:"))
                accept = base64.b64encode(hashlib.sha1(key + self.GUID.encode()).digest())
                conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                             b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept +
                             b"\r\n\r\n")
                self.upgraded.append(conn)

    def close(self) -> None:
        self.server.close()
        for conn in self.upgraded:
            conn.close()


@pytest.mark.timeout(120)
def test_a_stop_closes_its_links_at_once_not_one_after_another(tmp_path: Path) -> None:
    """Each link's close waits up to 2 s for the far end's answer, and the stop closed the
    links one after another: five links to peers that never answer held the stop over
    10 s. Closed together under one deadline, the stop takes one close's time, and every
    row the links held still goes back unrun."""
    path = tmp_path / "sender.db"
    deaf = DeafPeers()
    links = 5
    try:
        rt = Runtime(db=f"sqlite:///{path}", brain=quiet_brain, clock=ManualClock()).start()
        try:
            me = rt.create_session(None, "sender").id
            token = new_token(os.urandom(32))
            for i in range(links):
                peer = DeviceIdentity.generate()
                rt.peers.peers.save_outbound(
                    peer.device_id, f"deaf{i}", peer.public_key, deaf.http,
                    rt.peers.identity.seal(token, os.urandom(SEAL_NONCE_BYTES)),
                    frozenset({"agent"}), rt.clock.now())
                rt.peers.send_many(me, f"peer:{peer.device_id}", [f"m{i}"])
                rt.peers.link_for(peer.device_id)
            before = _rows(path)
            wait_for(lambda: len(deaf.upgraded) == links, 30, "every link to connect")
            wait_for(lambda: all(link.ws is not None for link in rt.peers.links.values()),
                     10, "every link to hold its socket")
            assert {r["status"] for r in rt.inbox()} == {"processing"}
            began = time.monotonic()
        finally:
            rt.stop()
        took = time.monotonic() - began
        # One after another the five would take over 10 s; the slack is a loaded machine's.
        assert took < 9.0, f"the stop took {took:.1f} s for {links} links"
        assert _rows(path) == {mid: ("pending", 0, row[2], None, None)
                               for mid, row in before.items()}
    finally:
        deaf.close()


def test_a_send_that_arrives_during_the_stop_starts_no_link(tmp_path: Path) -> None:
    """The stop takes the links it closes; a send arriving after that (a turn still
    committing) started a fresh link no stop ended, which held its rows until their lease
    ran out. Now its row waits in the journal, unleased, for the next start."""
    path = tmp_path / "sender.db"
    rt = Runtime(db=f"sqlite:///{path}", brain=quiet_brain, clock=ManualClock()).start()
    try:
        me = rt.create_session(None, "sender").id
        peer = DeviceIdentity.generate()
        rt.peers.peers.save_outbound(
            peer.device_id, "away", peer.public_key, "http://127.0.0.1:9",
            rt.peers.identity.seal(new_token(os.urandom(32)), os.urandom(SEAL_NONCE_BYTES)),
            frozenset({"agent"}), rt.clock.now())
        rt.peers.stop()  # the runtime's stop begins with its peer links
        [sent] = rt.peers.send_many(me, f"peer:{peer.device_id}", ["late"])
        assert rt.peers.link_for(peer.device_id) is None
        assert rt.peers.links == {}
    finally:
        rt.stop()
    assert _rows(path)[sent["message_id"]][0] == "pending"
