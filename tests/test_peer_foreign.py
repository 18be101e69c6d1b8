"""Peers that are not this version's kinbox receiver: fake servers on 127.0.0.1 that prove
the paired key and then answer as no kinbox receiver does. The sender must neither hang
nor hold a row forever, whatever a peer of another version (or a foreign one) says."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import HTTPServer, SimpleHTTPRequestHandler
from pathlib import Path

import pytest
from websockets.asyncio.server import ServerConnection

from kinbox.actors import ManualClock, Runtime
from kinbox.persistence.inbox_core import PEER, backoff_delay
from kinbox.transport import frames as f
from kinbox.transport.errors import PeerUnavailable
from kinbox.transport.identity import DeviceIdentity
from kinbox.transport.invite_code import new_code, parse_code
from kinbox.transport.peer_client import pair_with

from .helpers import quiet_brain, wait_for
from .peer_harness import FakePeer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def sender(tmp_path: Path, clock: ManualClock) -> Iterator[Runtime]:
    rt = Runtime(db=f"sqlite:///{tmp_path / 'sender.db'}", brain=quiet_brain, clock=clock)
    rt.start()
    yield rt
    rt.stop()


def send(rt: Runtime, device_id: str, text: str = "hello") -> str:
    me = rt.create_session(None, "sender").id
    return str(rt.peers.send(me, f"peer:{device_id}", text)["message_id"])


def test_an_error_naming_no_message_breaks_the_link_and_the_row_goes_back_with_the_backoff(
        sender: Runtime, clock: ManualClock) -> None:
    """A peer answering each ``deliver`` with ``error`` (no id, ``bad_frame``) left the row
    ``processing`` for ever: its lease renewed, no attempt counted, the link never idle."""

    async def refuse_every_frame(ws: ServerConnection) -> None:
        async for _text in ws:
            await ws.send(f.encode(f.Error(None, "bad_frame", "what is this?")))

    peer = FakePeer(refuse_every_frame)
    try:
        mid = send(sender, peer.grant_to(sender))
        journal = sender.context.journal
        for attempt in (1, 2):
            wait_for(lambda a=attempt: journal.get(mid)["attempts"] == a, 20,
                     f"attempt {attempt} to count")
            row = journal.get(mid)
            assert row["status"] == "pending" and "bad_frame" in row["last_error"]
            delay = backoff_delay(attempt, PEER.cap)
            assert row["available_at"] == pytest.approx(clock.now() + delay)
            clock.advance(delay)
        assert peer.opened >= 2  # a new link for each attempt
    finally:
        peer.close()


def test_a_peer_that_keeps_talking_without_answering_a_read_is_given_up_in_time(
        sender: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """``agent_read`` waited REQUEST_TIMEOUT for each frame, not for the answer: a peer
    sending pings (or any frame but the result) kept the calling turn waiting for ever."""
    import asyncio
    import threading

    from kinbox.actors import ToolError, peers

    monkeypatch.setattr(peers, "REQUEST_TIMEOUT", 1.0)

    async def chatter(ws: ServerConnection) -> None:
        for n in range(10_000):
            await ws.send(f.encode(f.Ping(f"p{n}")))
            await asyncio.sleep(0.1)  # the pace of the chatter, not a wait for a condition

    peer = FakePeer(chatter)
    outcome: list[BaseException | object] = []
    try:
        device_id = peer.grant_to(sender)
        call = threading.Thread(target=lambda: outcome.append(
            _outcome(lambda: sender.peers.request(f"peer:{device_id}", "read"))), daemon=True)
        call.start()
        call.join(10)
        assert not call.is_alive(), "the read still waits on a peer that never answers"
    finally:
        peer.close()
    [error] = outcome
    assert isinstance(error, ToolError) and error.code == "execution_failed"
    assert "did not answer" in error.message and "1 s" in error.message


def _outcome(fn: object) -> BaseException | object:
    try:
        return fn()  # type: ignore[operator]
    except Exception as exc:
        return exc


@pytest.mark.parametrize("status", ["paused", "revoked"])
def test_this_sides_pause_or_revoke_waits_for_the_acks_of_frames_in_flight(
        sender: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        status: str) -> None:
    """Closing the grant here (``peers pause|revoke --direction outbound``) closed a live
    link at once: rows the receiver had committed but not yet acknowledged were marked
    failed, though delivered. The link now sends nothing more and waits (a bounded time)
    for the acks of what it sent; a row whose ack does not come fails with the grant."""
    import asyncio
    import threading

    from kinbox.actors import peer_link
    from kinbox.persistence.peers import OUTBOUND

    monkeypatch.setattr(peer_link, "DRAIN_SECONDS", 1.0)
    caplog.set_level("INFO", logger="kinbox.peers")
    got: list[str] = []
    release = threading.Event()

    async def slow_commits(ws: ServerConnection) -> None:
        async for text in ws:
            frame = f.parse(text)
            if isinstance(frame, f.Deliver):
                got.append(frame.id)
                if len(got) == 3:  # the commit of all three is under way; two of them end
                    await asyncio.to_thread(release.wait, 20)
                    for mid in got[:2]:
                        await ws.send(f.encode(f.Ack(mid)))

    peer = FakePeer(slow_commits)
    try:
        device_id = peer.grant_to(sender)
        me = sender.create_session(None, "sender").id
        ids = [r["message_id"] for r in
               sender.peers.send_many(me, f"peer:{device_id}", ["a", "b", "c"])]
        wait_for(lambda: len(got) == 3, 20, "three frames in flight")
        sender.peers.peers.set_status(device_id, status, sender.clock.now(),
                                      direction=OUTBOUND)
        wait_for(lambda: f"its grant here is {status}" in caplog.text, 10,
                 "the link to see the grant closed")
        release.set()
        journal = sender.context.journal
        wait_for(lambda: all(journal.get(m)["status"] in ("delivered", "failed") for m in ids),
                 20, "every row to settle")
        assert [journal.get(m)["status"] for m in ids] == ["delivered", "delivered", "failed"]
        assert status in journal.get(ids[2])["last_error"]
        assert got == ids  # nothing sent after the grant closed, nothing twice
    finally:
        release.set()
        peer.close()


@pytest.mark.parametrize("code", ["rejected", "unavailable"])
def test_a_peers_error_text_is_stored_escaped_for_the_terminals_that_show_it(
        sender: Runtime, code: str) -> None:
    """The reason of an ``error`` naming a message went into the row's ``last_error`` as the
    peer wrote it: escape sequences that rewrite the terminal of whoever lists the rows."""
    hostile = "\x1b]0;owned\x07\x1b[2Jall is well\u202e"

    async def answer_with_escapes(ws: ServerConnection) -> None:
        async for text in ws:
            frame = f.parse(text)
            if isinstance(frame, f.Deliver):
                await ws.send(f.encode(f.Error(frame.id, code, hostile)))

    peer = FakePeer(answer_with_escapes)
    try:
        mid = send(sender, peer.grant_to(sender))
        journal = sender.context.journal
        wait_for(lambda: journal.get(mid)["attempts"] >= 1, 20, "the error to count")
        error = journal.get(mid)["last_error"]
        assert "all is well" in error and error.isprintable(), error
        assert [e["detail"].isprintable() for e in journal.history(mid)] == [True]
    finally:
        peer.close()


def test_pairing_with_an_address_that_is_no_kinbox_says_so(tmp_path: Path) -> None:
    """``kinbox peers pair`` at a plain web server (a wrong port) said only "peer
    unavailable (cannot connect: InvalidMessage)"; it now says the address does not answer
    as a kinbox serve, still a PeerUnavailable with no HTTP status."""
    server = HTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(PeerUnavailable) as refused:
            pair_with(f"http://127.0.0.1:{server.server_port}",
                      DeviceIdentity.generate(),
                      parse_code(new_code(DeviceIdentity.generate().public_key, b"A" * 32)),
                      "phone", "n" * 43)
    finally:
        server.shutdown()
        server.server_close()
    assert refused.value.status is None
    assert "did not complete a kinbox serve's handshake" in str(refused.value)
