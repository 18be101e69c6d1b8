"""Peers inside runtimes this test drives: brains on the receiver, a sender that crashes,
and the peer store on both database backends."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from websockets.sync.client import ClientConnection

from kinbox.actors import Runtime, SystemClock, Turn
from kinbox.actors.peer_backend import PeerHttpBackend
from kinbox.actors.serve import app_for
from kinbox.persistence import ClaimedRow, NewMessage
from kinbox.persistence.peer_outbox import PeerOutbox
from kinbox.persistence.peers import INBOUND, OUTBOUND, PeerStore
from kinbox.transport.handshake import new_nonce
from kinbox.transport.invite_code import parse_code
from kinbox.transport.link import LinkState, SenderLink

from .conftest import Stores
from .helpers import quiet_brain, wait_for
from .peer_harness import Receiver, Served, opened_link

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def pair_of(tmp_path: Path) -> Iterator[tuple[Runtime, Runtime, Served, threading.Event]]:
    release = threading.Event()

    def brain(turn: Turn) -> str:
        if any(m.content == "work long" for m in turn.messages):
            turn.wait_stop_requested(30)
            return "stopped" if turn.stop_requested else "timed out"
        return "got: " + " | ".join(m.content for m in turn.messages)

    b = Runtime(db=f"sqlite:///{tmp_path / 'b' / 'b.db'}", brain=brain,
                clock=SystemClock()).start()
    a = Runtime(db=f"sqlite:///{tmp_path / 'a' / 'a.db'}",
                brain=quiet_brain, clock=SystemClock()).start()
    served = Served(b)
    yield a, b, served, release
    served.close()
    a.stop()
    b.stop()


def test_the_peer_turn_runs_where_the_brain_is_and_read_and_stop_reach_it(
        pair_of: tuple[Runtime, Runtime, Served, threading.Event]) -> None:
    a, b, served, _ = pair_of
    rec = a.peers.pair(served.http, served.invite(), name="b")
    project = a.project("default")
    assert project is not None
    tools = a.tools_for(a.create_session(project.id, "me").id)
    peer = f"peer:{rec.device_id}"
    tools.agent_send(peer, "hello there")
    session = f"suzent:{a.peers.identity.device_id}"
    wait_for(lambda: any(e.text == "got: hello there" for e in b.transcript(session)), 20,
             "the receiver's turn")
    assert "assistant: got: hello there" in tools.agent_read(peer)["transcript"]
    tools.agent_send(peer, "work long")
    wait_for(lambda: b.context.turns.is_running(session), 20, "the long turn to start")
    assert tools.agent_stop(peer) == {"agent_id": peer, "status": "stop_requested"}
    wait_for(lambda: any(e.text == "stopped" for e in b.transcript(session)), 20,
             "the turn to stop")
    with pytest.raises(Exception, match="is not active"):
        tools.agent_stop(peer)
    assert b.marker_counts() and set(b.marker_counts().values()) == {1}


def test_a_transcript_over_one_frame_is_read_with_its_newest_messages(
        pair_of: tuple[Runtime, Runtime, Served, threading.Event]) -> None:
    """Emoji within the read view's 20,000 characters can pass the result frame's 64 KiB:
    the reader's link died and the caller got "did not answer"."""
    a, b, served, _ = pair_of
    rec = a.peers.pair(served.http, served.invite(), name="b")
    tools = a.tools_for(a.create_session(None, "me").id)
    peer = f"peer:{rec.device_id}"
    for mark in ("first", "second"):
        tools.agent_send(peer, f"{mark} " + "\U0001f600" * 9_000)
    session = f"suzent:{a.peers.identity.device_id}"
    wait_for(lambda: sum(e.role == "assistant" for e in b.transcript(session)) == 2, 30,
             "both turns on the receiver")
    read = tools.agent_read(peer)["transcript"]
    assert "got: second" in read and "first" not in read and "earlier messages omitted" in read


def test_the_peer_endpoint_answers_the_hosts_the_http_api_answers(tmp_path: Path) -> None:
    """``--allow-host '*.example.com'``: the API answered foo.example.com, the peer routes
    refused it as a bad origin (retried by senders for 37 hours)."""
    import http.client

    b = Runtime(db=f"sqlite:///{tmp_path / 'h.db'}", brain=quiet_brain,
                clock=SystemClock()).start()
    sock = socket.create_server(("127.0.0.1", 0))  # bound here: nobody takes it meanwhile
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app_for(b, allowed_hosts=["*.example.com"],
                                                   allow_unauthenticated=True),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, args=([sock],), daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 30, "uvicorn to start")
        answers = {}
        for host in ("foo.example.com", "evil.test"):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/peers/link", headers={
                "Host": host, "Connection": "Upgrade", "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
            response = conn.getresponse()
            answers[host] = (response.status, response.read())
            conn.close()
        assert b"bad_origin" not in answers["foo.example.com"][1]  # past the Host check
        assert answers["evil.test"][0] in (400, 403)
    finally:
        server.should_exit = True
        thread.join(10)
        b.stop()


def test_a_sender_crash_mid_stream_rehydrates_the_link_from_its_rows(tmp_path: Path) -> None:
    receiver = Receiver(tmp_path / "r").start()
    url = f"sqlite:///{tmp_path / 'a' / 'a.db'}"
    try:
        rt = Runtime(db=url, brain=quiet_brain, clock=SystemClock()).start()
        rec = rt.peers.pair(receiver.http, receiver.invite())
        me = rt.peers.identity.device_id
        sender = rt.create_session(None, "s").id
        ids = [r["message_id"] for r in rt.peers.send_many(sender, f"peer:{rec.device_id}",
                                                           [f"m{i}" for i in range(1500)])]
        wait_for(lambda: len(receiver.peer_rows(me)) > 100, 30, "some deliveries")
        rt.crash()  # rows in flight stay leased to a dead owner
        assert len(rt.inbox(state="delivered")) < 1500, "the crash must come mid-stream"
        rt2 = Runtime(db=url, brain=quiet_brain, clock=SystemClock()).start()
        try:
            wait_for(lambda: len(rt2.inbox(state="delivered")) == 1500, 60, "every ack")
            assert receiver.peer_rows(me) == [f"peer-{me}-{mid}" for mid in ids]
        finally:
            rt2.stop()
    finally:
        receiver.stop()


def test_peer_store_redeems_an_invite_once_and_finds_grants_by_hash(stores: Stores) -> None:
    peers = PeerStore(stores.tables, stores.writer)
    peers.add_invite("h" * 64, frozenset({"agent"}), 10.0, 100.0)
    assert peers.invite("h" * 64) is not None
    assert not peers.redeem("h" * 64, 100.0, "0123456789ab", "x", "K" * 43, "t" * 64)  # expired
    assert peers.redeem("h" * 64, 50.0, "0123456789ab", "x", "K" * 43, "t" * 64)
    assert not peers.redeem("h" * 64, 51.0, "ba9876543210", "y", "L" * 43, "u" * 64)  # used
    grant = peers.by_token_hash("t" * 64)
    assert grant is not None and (grant.device_id, grant.status) == ("0123456789ab", "active")
    assert peers.by_token_hash("u" * 64) is None
    peers.set_status("0123456789ab", "paused", 60.0, direction=INBOUND)
    assert peers.device("0123456789ab", INBOUND).status == "paused"  # type: ignore[union-attr]


def test_peer_store_answers_a_redeeming_devices_retry_until_its_grant_was_used_or_changed(
        stores: Stores) -> None:
    """The retry of a device whose answer was lost: it gets its grant with the new token
    hash, on both backends, but nothing once the grant was used, closed or replaced."""
    peers, dev = PeerStore(stores.tables, stores.writer), "0123456789ab"
    peers.add_invite("h" * 64, frozenset({"agent"}), 10.0, 100.0)
    assert peers.redeem("h" * 64, 50.0, dev, "x", "K" * 43, "t" * 64)
    assert peers.invite("h" * 64).used_by == dev  # type: ignore[union-attr]
    assert not peers.redeem("h" * 64, 51.0, dev, "x", "L" * 43, "u" * 64)  # another key
    assert peers.redeem("h" * 64, 150.0, dev, "x", "K" * 43, "v" * 64)  # past the expiry too
    assert peers.by_token_hash("t" * 64) is None
    grant = peers.by_token_hash("v" * 64)
    assert grant is not None and (grant.device_id, grant.created_at) == (dev, 50.0)
    peers.set_status(dev, "paused", 151.0, direction=INBOUND)
    assert not peers.redeem("h" * 64, 152.0, dev, "x", "K" * 43, "w" * 64)
    peers.set_status(dev, "active", 153.0, direction=INBOUND)
    peers.touch(dev, INBOUND, 154.0)  # the device used its grant: it had its answer
    assert not peers.redeem("h" * 64, 155.0, dev, "x", "K" * 43, "w" * 64)
    peers.add_invite("i" * 64, frozenset({"agent"}), 10.0, 300.0)  # paired again since
    assert peers.redeem("i" * 64, 200.0, dev, "x", "K" * 43, "x" * 64)
    assert not peers.redeem("h" * 64, 201.0, dev, "x", "K" * 43, "w" * 64)
    assert peers.device(dev, INBOUND).token_hash == "x" * 64  # type: ignore[union-attr]


def test_a_link_that_opens_clears_a_noted_problem_but_not_why_a_device_closed(
        stores: Stores) -> None:
    peers = PeerStore(stores.tables, stores.writer)
    peers.save_outbound("0123456789ab", "b", "K" * 43, "http://127.0.0.1:1", "sealed",
                        frozenset({"agent"}), 1.0)
    peers.note_problem("0123456789ab", OUTBOUND, "a stranger refused", 2.0)
    assert peers.device("0123456789ab", OUTBOUND).last_error == "a stranger refused"  # type: ignore[union-attr]
    peers.touch("0123456789ab", OUTBOUND, 3.0)
    rec = peers.device("0123456789ab", OUTBOUND)
    assert rec is not None and (rec.last_error, rec.last_seen_at) == (None, 3.0)
    peers.set_status("0123456789ab", "revoked", 4.0, direction=OUTBOUND,
                     last_error="the peer refused this device (revoked)")
    peers.touch("0123456789ab", OUTBOUND, 5.0)  # the last acks of the link it closed
    rec = peers.device("0123456789ab", OUTBOUND)
    assert rec is not None and rec.last_error == "the peer refused this device (revoked)"


def test_window_claims_stop_at_a_row_waiting_for_its_backoff(stores: Stores) -> None:
    outbox = PeerOutbox(stores.tables, stores.writer)
    msgs = [NewMessage(f"m{i}", "peer:0123456789ab", f"t{i}", transport="suzent_peer",
                       destination_peer_id="0123456789ab") for i in range(5)]
    stores.journal.enqueue_many(msgs, 0.0)
    first = outbox.claim_window("w", "peer:0123456789ab", 0, 1.0, lease=30, limit=2)
    assert [r.message_id for r in first] == ["m0", "m1"]
    more = outbox.claim_window("w", "peer:0123456789ab", first[-1].seq, 1.0, lease=30, limit=9)
    assert [r.message_id for r in more] == ["m2", "m3", "m4"]
    stores.journal.retry("w", "m0", "down", 2.0)  # m0 waits 2 s; everything behind it waits
    stores.journal.release("w", ["m1", "m2", "m3", "m4"], 2.0)
    assert outbox.claim_window("w", "peer:0123456789ab", 0, 3.0, lease=30, limit=9) == []
    assert outbox.next_due("peer:0123456789ab") == 4.0
    again = outbox.claim_window("w", "peer:0123456789ab", 0, 4.0, lease=30, limit=9)
    assert [r.message_id for r in again] == ["m0", "m1", "m2", "m3", "m4"]
    assert stores.journal.claim("d", 5.0).rows == []  # the dispatcher never takes peer rows


def test_a_batch_of_peer_acks_with_one_lease_taken_over_acks_the_rest(stores: Stores) -> None:
    """One row of an ack batch whose lease another worker took (the link stalled past it)
    refused the whole batch: the others stayed processing, their leases renewed by the
    live link that had forgotten them, neither delivered nor sent again."""
    outbox = PeerOutbox(stores.tables, stores.writer)
    stores.journal.enqueue_many(
        [NewMessage(f"m{i}", "peer:0123456789ab", f"t{i}", transport="suzent_peer",
                    destination_peer_id="0123456789ab") for i in range(2)], 0.0)
    [m0] = outbox.claim_window("w1", "peer:0123456789ab", 0, 1.0, lease=10, limit=1)
    assert len(outbox.claim_window("w1", "peer:0123456789ab", m0.seq, 1.0, lease=100,
                                   limit=1)) == 1
    assert outbox.claim_window("w2", "peer:0123456789ab", 0, 20.0, lease=100, limit=1) == []
    [taken] = outbox.claim_window("w2", "peer:0123456789ab", 0, 22.0, lease=100, limit=1)
    assert (taken.message_id, taken.attempts) == ("m0", 1)  # the takeover counted, 2 s waited
    assert outbox.submit_ack("w1", ["m0", "m1"], 23.0).result(10) == ["m0"]  # not its own
    assert stores.journal.get("m1")["status"] == "delivered"
    row = stores.journal.get("m0")
    assert (row["status"], row["lease_owner"]) == ("processing", "w2")


def test_a_second_worker_finds_nothing_while_the_first_holds_the_window(stores: Stores) -> None:
    outbox = PeerOutbox(stores.tables, stores.writer)
    stores.journal.enqueue_many(
        [NewMessage(f"m{i}", "peer:0123456789ab", f"t{i}", transport="suzent_peer",
                    destination_peer_id="0123456789ab") for i in range(3)], 0.0)
    assert len(outbox.claim_window("w1", "peer:0123456789ab", 0, 1.0, lease=30, limit=2)) == 2
    assert outbox.claim_window("w2", "peer:0123456789ab", 0, 2.0, lease=30, limit=9) == []
    # w1's leases ran out: each of its rows counts the attempt and waits out its backoff
    assert outbox.claim_window("w2", "peer:0123456789ab", 0, 40.0, lease=30, limit=9) == []
    taken = outbox.claim_window("w2", "peer:0123456789ab", 0, 42.0, lease=30, limit=9)
    assert [r.message_id for r in taken] == ["m0"]  # alone: w1 may have died of it
    assert outbox.submit_ack("w2", ["m0"], 42.0).result(10) == []
    taken = outbox.claim_window("w2", "peer:0123456789ab", 0, 42.0, lease=30, limit=9)
    assert [r.message_id for r in taken] == ["m1"]
    assert outbox.submit_ack("w2", ["m1"], 42.0).result(10) == []
    taken = outbox.claim_window("w2", "peer:0123456789ab", 0, 42.0, lease=30, limit=9)
    assert [r.message_id for r in taken] == ["m2"]  # never leased by w1: a window again


@pytest.mark.timeout(60)
def test_on_postgres_a_device_row_numbered_first_and_committed_last_is_not_skipped(
        pg_url: str) -> None:
    """PostgreSQL numbers a row when it is written: a send from another process numbered
    first and committed after a later one was invisible to the link's claim, which went on
    after the later row, so the first was sent out of order, or not while the link stayed
    busy. The claim now takes nothing while that write is under way, then both, in
    order."""
    device, target = "0123456789ab", "peer:0123456789ab"

    def peer_row(message_id: str) -> NewMessage:
        return NewMessage(message_id, target, message_id, transport="suzent_peer",
                          destination_peer_id=device)

    here, other = Stores(pg_url), Stores(pg_url)  # two processes' connections and writers
    try:
        numbered, gate = threading.Event(), threading.Event()

        def slow_send() -> None:  # numbered now, committed once the gate opens
            def op() -> None:
                other.journal.enqueue_now(peer_row("first"), 1.0)
                numbered.set()
                assert gate.wait(20)
            other.writer.call(op)

        sender = threading.Thread(target=slow_send)
        sender.start()
        assert numbered.wait(10)
        here.journal.enqueue_many([peer_row("second")], 2.0)
        outbox = PeerOutbox(here.tables, here.writer)

        def claim() -> list[str]:
            return [r.message_id for r in outbox.claim_window("w", target, 0, 3.0, lease=30,
                                                              limit=9)]

        assert claim() == []  # a write of the device's rows is under way: not "second" alone
        gate.set()
        sender.join(10)
        assert claim() == ["first", "second"]
    finally:
        here.close()
        other.close()


@pytest.mark.timeout(60)
def test_on_postgres_two_processes_writing_and_claiming_one_devices_rows_do_not_deadlock(
        pg_url: str) -> None:
    """Each process's batch writes a row for the device (its lock, shared) and then its
    link claims the device's window in the same batch. A claim that waited for the lock
    waited for the other batch, which waited for it: PostgreSQL aborted one batch, every
    write in it. A claim never waits: it claims nothing while a write is under way (and
    what it finds once the other batch committed)."""
    target = "peer:0123456789ab"
    processes = [Stores(pg_url), Stores(pg_url)]
    both_wrote = threading.Barrier(2)
    outcomes: list[object] = []

    def batch(stores: Stores, message_id: str) -> None:
        def op() -> list[ClaimedRow]:
            stores.journal.enqueue_now(NewMessage(
                message_id, target, "hi", transport="suzent_peer",
                destination_peer_id="0123456789ab"), 1.0)
            both_wrote.wait(10)
            # The link's claim, in the same batch (as the writer would run it).
            return PeerOutbox(stores.tables, stores.writer)._claim_op(
                f"w-{message_id}", target, 0, 2.0, 30, 9).rows
        try:
            outcomes.append(stores.writer.call(op))
        except Exception as exc:
            outcomes.append(exc)

    try:
        threads = [threading.Thread(target=batch, args=(s, f"m{i}"))
                   for i, s in enumerate(processes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        # No batch aborted. A claim made after the other batch committed may take its row
        # (and its own): each at most once.
        assert len(outcomes) == 2 and all(isinstance(o, list) for o in outcomes), outcomes
        claimed = [row.message_id for o in outcomes for row in o]  # type: ignore[union-attr]
        assert len(claimed) == len(set(claimed)), claimed
    finally:
        for s in processes:
            s.close()


@pytest.mark.timeout(240)
def test_a_revoke_mid_stream_commits_nothing_after_it_and_acknowledges_what_it_committed(
        pair_of: tuple[Runtime, Runtime, Served, threading.Event]) -> None:
    """The watcher closed the link while a batch was in the writer: that batch committed
    on the receiver (its turns ran) and its acks were never sent, so the sender failed
    rows that were delivered (10-21 in two runs); batches kept committing until the next
    status poll (84-382 rows after the revoke)."""
    import time

    from kinbox.persistence.peers import INBOUND

    a, b, served, _ = pair_of
    rec = a.peers.pair(served.http, served.invite(), name="b")
    me = a.peers.identity.device_id
    sender = a.create_session(None, "bulk").id
    # Far more than the 300 below and the 84-382 rows the defect committed after the
    # revoke (385 delivered at the revoke, 1,115 failed, in a loaded run); each row left
    # fails by a commit of its own, and 4,000 took 45 s of the suite's time where 1,500
    # took 12.
    a.peers.send_many(sender, f"peer:{rec.device_id}", [f"m{i}" for i in range(1500)])
    wait_for(lambda: len(a.inbox(state="delivered")) > 300, 60, "progress before the revoke")
    b.peers.peers.set_status(me, "revoked", time.time(), direction=INBOUND)
    revoked_at = b.clock.now()
    # Over 60 s for 4,000 rows beside two other test suites on two cores.
    wait_for(lambda: not a.inbox(state="pending") and not a.inbox(state="processing"), 180,
             "every row settled on the sender")
    rows = b.context.journal.t.db.execute_sql(
        "SELECT message_id, created_at FROM agent_inbox_messages WHERE sender_chat_id = ?",
        (f"peer:{me}",)).fetchall()
    received = {mid for mid, _ in rows}
    failed = {r["message_id"] for r in a.inbox(state="failed")}
    assert failed and not {f"peer-{me}-{m}" for m in failed} & received
    assert {f"peer-{me}-{r['message_id']}" for r in a.inbox(state="delivered")} == received
    assert max(at for _, at in rows) <= revoked_at


@pytest.mark.timeout(120)
def test_acks_that_arrived_before_the_refusal_count_when_a_send_finds_the_link_closed(
        pair_of: tuple[Runtime, Runtime, Served, threading.Event]) -> None:
    """The receiver acknowledged a batch, refused (its grant was revoked) and closed the
    link while the sender was between reads, with a freed slot's deliver to send: the send
    raised ConnectionClosed, the acks and the refusal already received were never read, and
    the rows the receiver had committed went back as a lost link's, to fail at the next
    handshake's refusal: delivered rows reported failed (a retry delivers them twice)."""
    import time

    from websockets.protocol import State

    from kinbox.actors.peer_link import PeerLink
    from kinbox.transport import frames as f

    a, b, served, _ = pair_of
    rec = a.peers.pair(served.http, served.invite(), name="b")
    me = a.peers.identity.device_id
    link = a.peers.link_for(rec.device_id)
    assert link is not None
    # A window below the client's read buffer (16 frames): the receiver's close is read
    # behind the acks it sent first, not held up by them.
    link.window = 4
    read_acks = 0
    closed_unread = threading.Event()

    def b_rows() -> set[str]:
        rows = b.context.journal.t.db.execute_sql(
            "SELECT message_id FROM agent_inbox_messages WHERE sender_chat_id = ?",
            (f"peer:{me}",)).fetchall()
        return {mid for (mid,) in rows}

    def one_frame_at_a_time(ws: ClientConnection, sender: SenderLink, timeout: float) -> None:
        """Read one frame; at an ack that frees a slot for a queued row, let the receiver
        commit what it holds, revoke, and return once its close arrived, unread."""
        nonlocal read_acks
        if closed_unread.is_set():
            return PeerLink._receive(link, ws, sender, timeout)
        full = len(sender.held()) > sender.window  # a freed slot sends a queued row
        try:
            text = ws.recv(timeout)
        except TimeoutError:
            return None
        sender.receive(text)
        if isinstance(f.parse(text), f.Ack):
            read_acks += 1
            if full:
                wait_for(lambda: len(b_rows()) > read_acks, 30, "a commit not yet acked")
                b.peers.peers.set_status(me, "revoked", time.time(), direction=INBOUND)
                wait_for(lambda: ws.state is not State.OPEN, 30, "the receiver's close")
                closed_unread.set()
        return None

    link._receive = one_frame_at_a_time  # type: ignore[method-assign]
    sender = a.create_session(None, "bulk").id
    a.peers.send_many(sender, f"peer:{rec.device_id}", [f"m{i}" for i in range(300)])
    wait_for(closed_unread.is_set, 60, "the receiver to close with acks unread")
    wait_for(lambda: not a.inbox(state="pending") and not a.inbox(state="processing"), 60,
             "every row settled on the sender")
    received = b_rows()
    failed = {r["message_id"] for r in a.inbox(state="failed")}
    assert len(received) > read_acks
    assert failed and not {f"peer-{me}-{m}" for m in failed} & received
    assert {f"peer-{me}-{r['message_id']}" for r in a.inbox(state="delivered")} == received


def test_a_peer_stop_starts_the_stop_grace_like_a_local_one(tmp_path: Path) -> None:
    """Asked without a time, the stop never counted as ignored: past the grace (and past
    turn_timeout) nothing cancelled the turn."""
    release = threading.Event()
    rt = Runtime(db=f"sqlite:///{tmp_path / 'b.db'}", brain=lambda turn: release.wait(30),
                 clock=SystemClock()).start()
    try:
        project = rt.project("default")
        assert project is not None
        session = rt.create_session(project.id, "Device x", session_id="suzent:dev1").id
        now = rt.clock.now()  # dev1's grant: a closed one is answered with its refusal
        rt.peers.peers.add_invite("a" * 64, frozenset({"agent"}), now, now + 600)
        assert rt.peers.peers.redeem("a" * 64, now, "dev1", "x", "K" * 43, "t" * 64)
        rt.post(session, "work long")
        wait_for(lambda: rt.context.turns.is_running(session), 20, "the turn to start")
        assert PeerHttpBackend(rt.peers).answer("dev1", "t" * 64, "stop") == (
            "stop_requested", "")
        later = rt.clock.now() + 10
        assert rt.context.turns.ignoring_stop(later, 5.0) == [session]
    finally:
        release.set()
        rt.stop()


def test_a_pairing_that_fails_after_the_grant_leaves_the_code_unspent(
        pair_of: tuple[Runtime, Runtime, Served, threading.Event],
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, served, _ = pair_of
    code = served.invite()
    store = b.peers.peers
    real = store.ensure_session_now
    failed = threading.Event()

    def fail_once(*args: object, **kwargs: object) -> None:
        if not failed.is_set():
            failed.set()  # the failure falls between the grant's write and the session's
            raise OSError("disk full")
        real(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(store, "ensure_session_now", fail_once)
    with pytest.raises(Exception, match="pairing failed"):
        a.peers.pair(served.http, code, name="b")
    assert failed.is_set()
    me = a.peers.identity.device_id
    assert store.device(me, INBOUND) is None  # no grant without its session
    assert b.peers.ctx.store.session(f"suzent:{me}") is None
    rec = a.peers.pair(served.http, code, name="b")  # the code was not spent: it pairs now
    assert store.device(me, INBOUND) is not None
    assert b.peers.ctx.store.session(f"suzent:{me}") is not None
    assert rec.device_id == b.peers.identity.device_id


def test_a_read_or_stop_after_the_grant_closed_gets_the_refusal_not_an_answer(
        pair_of: tuple[Runtime, Runtime, Served, threading.Event],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The watcher closes a revoked link within STATUS_POLL_SECONDS; a request it has not
    # caught yet must be refused as a delivery is, not answered (slowed here to show it).

    from kinbox.transport import frames as f
    from kinbox.transport import inbound_link
    from kinbox.transport.link import Answer, LinkState, Terminal
    from kinbox.transport.peer_client import connect_link

    monkeypatch.setattr(inbound_link, "STATUS_POLL_SECONDS", 60.0)
    a, b, served, _ = pair_of
    rec = a.peers.pair(served.http, served.invite(), name="b")
    me = a.peers.identity.device_id
    token = a.peers.identity.unseal(rec.token_sealed or "")
    for action in (f.Read("r1"), f.Stop("s1")):
        b.peers.peers.set_status(me, "active", b.clock.now(), direction=INBOUND)
        with connect_link(served.http, token) as ws:
            link = opened_link(a, rec, token, ws)
            b.peers.peers.set_status(me, "revoked", b.clock.now(), direction=INBOUND)
            link.request(action)
            for text in link.frames_to_send():
                ws.send(text)
            link.receive(ws.recv(5))
        effects = link.effects()
        assert not any(isinstance(e, Answer) for e in effects), action
        assert any(isinstance(e, Terminal) for e in effects) and link.state is LinkState.CLOSED


def test_a_failed_grant_read_does_not_end_the_watch_of_a_live_link(
        pair_of: tuple[Runtime, Runtime, Served, threading.Event],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # One read of the grant that fails (a database lock wait past its timeout) ended the
    # watcher for good: an idle link whose grant was revoked later stayed open.

    from kinbox.persistence import DatabaseFailed
    from kinbox.transport.link import LinkState, Terminal
    from kinbox.transport.peer_client import connect_link

    a, b, served, _ = pair_of
    rec = a.peers.pair(served.http, served.invite(), name="b")
    me = a.peers.identity.device_id
    token = a.peers.identity.unseal(rec.token_sealed or "")
    real = PeerHttpBackend.grant_status
    failed = threading.Event()

    def grant_status(self: PeerHttpBackend, device_id: str, token_hash: str) -> str | None:
        if not failed.is_set():
            failed.set()
            raise DatabaseFailed("database is locked")
        return real(self, device_id, token_hash)
    monkeypatch.setattr(PeerHttpBackend, "grant_status", grant_status)
    with connect_link(served.http, token) as ws:
        link = opened_link(a, rec, token, ws)
        wait_for(failed.is_set, 10, "the watcher's failed read")
        b.peers.peers.set_status(me, "revoked", b.clock.now(), direction=INBOUND)
        link.receive(ws.recv(10))  # the signed refusal, within a poll or two
    [effect] = link.effects()
    assert isinstance(effect, Terminal) and link.state is LinkState.CLOSED


def _database_error(real: object, failed: threading.Event) -> object:
    """``real``, but its first call fails as a database does (a lock wait past its time)."""
    from kinbox.persistence.driver_errors import OperationalError

    def call(*args: object, **kwargs: object) -> object:
        if not failed.is_set():
            failed.set()
            raise OperationalError("database is locked")
        return real(*args, **kwargs)  # type: ignore[operator]
    return call


def test_a_grant_the_database_cannot_read_is_answered_unavailable_not_a_crash(
        pair_of: tuple[Runtime, Runtime, Served, threading.Event],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A database error reading the grant escaped the ASGI handler: a traceback in the
    server's log and a bare close 1011, where the sender should hear "try again later"."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from kinbox.transport import frames as f
    from kinbox.transport import handshake as hs

    a, b, served, _ = pair_of
    rec = a.peers.pair(served.http, served.invite(), name="b")
    token = a.peers.identity.unseal(rec.token_sealed or "")
    failed = threading.Event()
    monkeypatch.setattr(b.peers.peers, "by_token_hash",
                        _database_error(b.peers.peers.by_token_hash, failed))
    for attempt in ("the failing read", "the next one"):
        with connect(f"ws://127.0.0.1:{served.port}/peers/link", proxy=None, open_timeout=5,
                     additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            ch = f.parse(ws.recv(5))
            assert isinstance(ch, f.Challenge)
            ws.send(f.encode(hs.hello(a.peers.identity, ch, token,
                                      hs.new_nonce(os.urandom(32)), rec.device_id)))
            answer = f.parse(ws.recv(5))
            if attempt == "the failing read":
                assert failed.is_set()
                assert isinstance(answer, f.Error), answer
                assert (answer.id, answer.code) == (None, "unavailable")
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv(5)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
            else:
                assert isinstance(answer, f.Welcome)


def test_a_last_seen_stamp_the_database_refuses_does_not_end_the_link(
        pair_of: tuple[Runtime, Runtime, Served, threading.Event],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stamp written after the welcome escaped the handler and closed the link (1011)
    it had just welcomed; the stamp is bookkeeping, the link carries the delivery."""
    from kinbox.transport.link import Acked, Outgoing
    from kinbox.transport.peer_client import connect_link

    a, b, served, _ = pair_of
    rec = a.peers.pair(served.http, served.invite(), name="b")
    token = a.peers.identity.unseal(rec.token_sealed or "")
    failed = threading.Event()
    monkeypatch.setattr(b.peers.peers, "touch", _database_error(b.peers.peers.touch, failed))
    link = SenderLink(a.peers.identity, rec.device_id, rec.public_key, token, 1)
    link.offer([Outgoing("m1", "hello")])
    effects: list[object] = []
    with connect_link(served.http, token) as ws:
        link.connected(new_nonce(os.urandom(32)))
        while link.state is not LinkState.IDLE and not effects:
            for text in link.frames_to_send():
                ws.send(text)
            link.receive(ws.recv(5))
            effects += link.effects()
    assert failed.is_set()
    assert effects == [Acked(("m1",))]
    me = a.peers.identity.device_id
    assert b.context.journal.get(f"peer-{me}-m1")["content"] == "hello"


def test_a_pairing_the_database_cannot_store_is_answered_unavailable_and_spends_nothing(
        pair_of: tuple[Runtime, Runtime, Served, threading.Event],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A database error in the redemption escaped the handler (1011 and a traceback); the
    device pairing heard "pairing failed: ConnectionClosedError", not to try again."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from kinbox.transport import frames as f
    from kinbox.transport import handshake as hs
    from kinbox.transport.errors import PeerUnavailable
    from kinbox.transport.peer_client import pair_with

    a, b, served, _ = pair_of
    code = served.invite()
    store = b.peers.peers
    failed = threading.Event()
    monkeypatch.setattr(store, "redeem_now", _database_error(store.redeem_now, failed))
    with connect(f"ws://127.0.0.1:{served.port}/peers/pair", proxy=None,
                 open_timeout=5) as ws:
        ch = f.parse(ws.recv(5))
        assert isinstance(ch, f.Challenge)
        ws.send(f.encode(hs.pair(a.peers.identity, ch, parse_code(code),
                                 hs.new_nonce(os.urandom(32)),
                                 "a")))
        answer = f.parse(ws.recv(5))
        assert isinstance(answer, f.Error), answer
        assert (answer.id, answer.code) == (None, "unavailable")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    me = a.peers.identity.device_id
    invite = store.invite(parse_code(code).invite_hash)
    assert invite is not None and not invite.used and store.device(me, INBOUND) is None
    failed.clear()  # and a pairing client is told to try again, not that it was refused
    with pytest.raises(PeerUnavailable, match="try again"):
        pair_with(served.http, a.peers.identity, parse_code(code), "a",
                  hs.new_nonce(os.urandom(32)))
    rec = a.peers.pair(served.http, code, name="b")  # the code still pairs
    assert rec.device_id == b.peers.identity.device_id and store.device(me, INBOUND)


def test_a_redemption_slower_than_the_wait_for_it_is_answered_with_its_outcome(
        pair_of: tuple[Runtime, Runtime, Served, threading.Event],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A redemption whose batch ran past the writer's wait committed after the device was
    told to try again (or, before that, refused with "timeout"): the code spent, and a
    grant stored whose token nobody had. The answer now waits for the batch's outcome."""
    from kinbox.actors import peer_backend
    from kinbox.transport.grants import secret_hash

    monkeypatch.setattr(peer_backend, "WRITE_TIMEOUT", 0.1)
    a, b, served, _ = pair_of
    code = served.invite()
    store = b.peers.peers
    real = store.redeem_now
    slow = threading.Event()

    def redeem_now(*args: object, **kwargs: object) -> bool:
        slow.set()
        threading.Event().wait(1.0)  # a statement ten times slower than the wait for it
        return real(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(store, "redeem_now", redeem_now)
    rec = a.peers.pair(served.http, code, name="b")
    assert slow.is_set() and rec.device_id == b.peers.identity.device_id
    invite = store.invite(parse_code(code).invite_hash)
    grant = store.device(a.peers.identity.device_id, INBOUND)
    assert invite is not None and invite.used and grant is not None
    assert grant.token_hash == secret_hash(a.peers.identity.unseal(rec.token_sealed or ""))


def test_a_read_the_database_cannot_answer_is_answered_unavailable(
        pair_of: tuple[Runtime, Runtime, Served, threading.Event],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A database error in a read's answer ended the link's reader with no frame and no
    log line (the session gathers its tasks' errors and drops them): the caller heard
    "did not answer". It now hears that the device is unavailable, and may ask again."""

    from kinbox.transport import frames as f
    from kinbox.transport.link import Answer, Retry
    from kinbox.transport.peer_client import connect_link

    a, b, served, _ = pair_of
    rec = a.peers.pair(served.http, served.invite(), name="b")
    token = a.peers.identity.unseal(rec.token_sealed or "")
    failed = threading.Event()
    store = b.context.store
    monkeypatch.setattr(store, "transcript", _database_error(store.transcript, failed))
    outcomes = []
    for req in ("r1", "r2"):
        with connect_link(served.http, token) as ws:
            link = opened_link(a, rec, token, ws)
            link.request(f.Read(req))
            for text in link.frames_to_send():
                ws.send(text)
            link.receive(ws.recv(5))
        outcomes.append(link.effects())
    assert failed.is_set()
    [first], [second] = outcomes
    assert isinstance(first, Retry) and "unavailable" in first.reason
    assert isinstance(second, Answer) and second.frame.req == "r2"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("unusable", ["a dangling symlink", "a file for the folder",
                                      "a folder for the key"])
def test_a_device_key_that_cannot_be_read_or_made_is_a_config_error_naming_the_data_dir(
        tmp_path: Path, unusable: str) -> None:
    """A key file that is a symlink to nothing (a secrets mount not mounted), or a data
    folder that is a file, was a bare FileNotFoundError or NotADirectoryError from
    ``Runtime.start``, outside kinbox's exception tree; a key others could read was a
    ConfigError naming ``data_dir``, as every unusable key file should be."""
    from kinbox.actors import ConfigError

    data = tmp_path / "data"
    if unusable == "a file for the folder":
        data.write_text("not a folder")
    else:
        data.mkdir(mode=0o700)
        key = data / "device_key.pem"
        if unusable == "a dangling symlink":
            key.symlink_to(tmp_path / "unmounted" / "device_key.pem")
        else:
            key.mkdir(mode=0o700)
    rt = Runtime(db=f"sqlite:///{tmp_path / 'k.db'}", data_dir=data)
    with pytest.raises(ConfigError) as info:
        rt.start()
    assert info.value.field == "data_dir"
    assert rt.state != "running"
    assert not (tmp_path / "unmounted").exists()
