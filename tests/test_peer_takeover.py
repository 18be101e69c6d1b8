"""A peer row whose sender dies while sending it: taken over, counted, and in the end
``failed`` (a poison frame), not re-sent for ever.

The clock is the argument every claim takes, so a lease running out and a 37-hour
backoff schedule pass in microseconds; each backend is a real database."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
from websockets.asyncio.server import ServerConnection

from kinbox.actors import ManualClock, Runtime, peer_link
from kinbox.persistence import NewMessage
from kinbox.persistence.inbox_core import PEER
from kinbox.persistence.peer_outbox import PeerOutbox

from .conftest import Stores
from .helpers import quiet_brain, wait_for
from .peer_harness import FakePeer, Receiver

pytestmark = pytest.mark.timeout(120)

DEVICE = "0123456789ab"
TARGET = f"peer:{DEVICE}"
LEASE = 30.0


def _send(stores: Stores, *ids: str, at: float = 0.0) -> None:
    stores.journal.enqueue_many(
        [NewMessage(i, TARGET, f"text of {i}", transport="suzent_peer",
                    destination_peer_id=DEVICE) for i in ids], at)


def _claim(outbox: PeerOutbox, owner: str, now: float, after_seq: int = 0,
           limit: int = 64) -> list[str]:
    return [r.message_id for r in outbox.claim_window(owner, TARGET, after_seq, now,
                                                      lease=LEASE, limit=limit)]


def test_a_row_whose_sender_dies_every_time_ends_failed_at_its_attempt_limit(
        stores: Stores) -> None:
    """Each link that leases it dies before any ack or reported failure (its lease runs
    out). Counting nothing, the row was taken over and sent again for ever."""
    outbox = PeerOutbox(stores.tables, stores.writer)
    _send(stores, "poison")
    now, sends = 1.0, 0
    for k in range(3 * PEER.max_attempts):
        if _claim(outbox, f"process-{k}", now) == ["poison"]:
            sends += 1  # ... and the process dies sending it
        if stores.journal.get("poison")["status"] == "failed":
            break
        now += LEASE + PEER.cap + 1  # past its lease, and past any backoff
    row = stores.journal.get("poison")
    assert (row["status"], row["attempts"]) == ("failed", PEER.max_attempts)
    assert sends == PEER.max_attempts  # sent once per attempt, never after it failed
    assert "taken over" in row["last_error"] and "died" in row["last_error"]
    assert row["lease_owner"] is None


def test_rows_taken_over_go_one_at_a_time_so_only_the_one_that_kills_counts_again(
        stores: Stores) -> None:
    """A dead link held a window: each of its rows counts the takeover and waits out the
    peer backoff, then goes alone (it may be the one that killed its sender) while the rows
    behind it wait; a death while one is in flight is that row's alone."""
    outbox = PeerOutbox(stores.tables, stores.writer)
    _send(stores, "m0", "m1", "m2", "m3")
    assert _claim(outbox, "dead", 1.0, limit=3) == ["m0", "m1", "m2"]
    taken_over = 1.0 + LEASE + 1
    assert _claim(outbox, "next", taken_over) == []  # counted, each waits 2 s
    assert [stores.journal.get(m)["attempts"] for m in ("m0", "m1", "m2", "m3")] == [1, 1, 1, 0]
    assert outbox.next_due(TARGET) == taken_over + 2.0
    assert _claim(outbox, "next", taken_over + 1.0) == []  # the head's backoff holds all
    now = taken_over + 2.0
    [m0] = outbox.claim_window("next", TARGET, 0, now, lease=LEASE, limit=64)
    assert m0.message_id == "m0"  # alone
    assert _claim(outbox, "next", now, after_seq=m0.seq) == []  # nothing beside it
    assert outbox.submit_ack("next", ["m0"], now).result(10) == []
    [m1] = outbox.claim_window("next", TARGET, m0.seq, now, lease=LEASE, limit=64)
    assert m1.message_id == "m1"
    # "next" dies sending m1: only m1 counts it
    later = now + LEASE + 1
    assert _claim(outbox, "third", later) == []
    assert [stores.journal.get(m)["attempts"] for m in ("m1", "m2", "m3")] == [2, 1, 0]
    assert outbox.next_due(TARGET) == later + 4.0  # m1's second backoff
    assert _claim(outbox, "third", later + 4.0) == ["m1"]
    assert outbox.submit_ack("third", ["m1"], later + 4.0).result(10) == []
    assert _claim(outbox, "third", later + 4.0) == ["m2"]  # still alone: m2 was in flight
    assert outbox.submit_ack("third", ["m2"], later + 4.0).result(10) == []
    assert _claim(outbox, "third", later + 4.0) == ["m3"]  # never taken over: a window
    statuses = {m: stores.journal.get(m)["status"] for m in ("m0", "m1", "m2")}
    assert statuses == {"m0": "delivered", "m1": "delivered", "m2": "delivered"}


def test_a_suspect_row_behind_plain_ones_waits_to_be_the_head(stores: Stores) -> None:
    """A window stops before a suspect row; the next claim after the window's last row
    takes nothing while rows ahead of it are in flight."""
    outbox = PeerOutbox(stores.tables, stores.writer)
    _send(stores, "m0", "m1", "m2")
    assert _claim(outbox, "a", 1.0, limit=1) == ["m0"]
    stores.journal.release("a", ["m0"], 1.5)  # handed back unrun: pending, not suspect
    # m1 is leased by a link that dies, taken over behind m0 (pending, due)
    seq0 = stores.journal.get("m0")["seq"]
    assert _claim(outbox, "b", 2.0, after_seq=seq0, limit=1) == ["m1"]
    now = 2.0 + LEASE + 1
    first = outbox.claim_window("c", TARGET, 0, now, lease=LEASE, limit=64)
    assert [r.message_id for r in first] == ["m0"]  # m1 counted, waiting: the window ends
    assert stores.journal.get("m1")["attempts"] == 1
    assert _claim(outbox, "c", now + 5.0, after_seq=first[-1].seq) == []  # m0 in flight
    assert outbox.submit_ack("c", ["m0"], now + 5.0).result(10) == []
    assert _claim(outbox, "c", now + 5.0, after_seq=first[-1].seq) == ["m1"]  # the head now


def test_a_reported_failure_of_a_suspect_row_lets_windows_resume(stores: Stores) -> None:
    """A suspect row whose link dropped (a failure the sender lived to report) is retried
    as before and goes in a window again: its sender survived it."""
    outbox = PeerOutbox(stores.tables, stores.writer)
    _send(stores, "m0", "m1")
    assert _claim(outbox, "dead", 1.0, limit=1) == ["m0"]
    now = 1.0 + LEASE + 1
    assert _claim(outbox, "b", now) == []
    assert _claim(outbox, "b", now + 2.0) == ["m0"]
    out = stores.journal.retry("b", "m0", "the link closed", now + 2.0)
    assert out.attempts == 2
    assert _claim(outbox, "b", now + 2.0 + 4.0) == ["m0", "m1"]


@pytest.mark.timeout(90)
def test_a_link_sends_a_dead_links_rows_one_by_one_without_pausing_between_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Suspect rows go one at a time; the claim for the next one follows each ack. A claim
    already under way when the ack came answered "nothing" (the row was still out) and
    the link took that for a dry spell: a dry poll's pause a row (50 s for a dead link's
    128 rows at the default second, where the old link took 3 s). With the poll at 20 s
    (and the linger above it), three such pauses outlast the wait below; the link is woken
    when the backoff ends, so none is needed."""
    monkeypatch.setattr(peer_link, "LINGER_SECONDS", 30.0)
    monkeypatch.setattr(peer_link, "DRY_POLL_SECONDS", 20.0)
    receiver = Receiver(tmp_path / "b").start()
    url = f"sqlite:///{tmp_path / 'a' / 'a.db'}"
    try:
        with Runtime(db=url) as rt:  # send-only: pairs and queues, runs no link
            device = rt.peers.pair(receiver.http, receiver.invite()).device_id
            me = rt.peers.identity.device_id
            sent = rt.peers.send_many(rt.create_session(None, "sender").id,
                                      f"peer:{device}", [f"p {i}" for i in range(60)])
        with contextlib.closing(sqlite3.connect(tmp_path / "a" / "a.db")) as con, con:
            con.execute("UPDATE agent_inbox_messages SET status = 'processing', "
                        "lease_owner = 'a-runtime-that-died', lease_until = 0 "
                        "WHERE transport = 'suzent_peer'")
        with Runtime(db=url, brain=quiet_brain) as rt:
            wait_for(lambda: {r["status"] for r in rt.inbox()} == {"delivered"}, 60,
                     "the taken-over rows to be delivered")
            assert {r["attempts"] for r in rt.inbox()} == {1}  # one takeover each
        ids = [f"peer-{me}-{s['message_id']}" for s in sent]
        assert receiver.peer_rows(me) == ids  # once each, in order
    finally:
        receiver.stop()


def test_a_lease_renewed_after_the_claim_read_it_is_not_counted_as_taken_over(
        stores: Stores) -> None:
    """The window is read unlocked; on PostgreSQL the owner may renew the lease (or ack the
    row) between that read and the takeover's lock. The takeover is decided again under
    the lock: a renewed lease, or a row no longer in flight, is left alone."""
    outbox = PeerOutbox(stores.tables, stores.writer)
    _send(stores, "r1", "r2")
    assert _claim(outbox, "alive", 1.0, limit=2) == ["r1", "r2"]
    later = 1.0 + LEASE + 1
    stores.journal.renew("alive", [TARGET], later + LEASE, later)  # renewed in time after all
    stores.journal.ack("alive", ["r2"], later)  # and r2 answered
    stores.writer.call(lambda: outbox._count_takeovers(["r1", "r2"], later))
    r1, r2 = stores.journal.get("r1"), stores.journal.get("r2")
    assert (r1["status"], r1["lease_owner"], r1["attempts"]) == ("processing", "alive", 0)
    assert (r2["status"], r2["attempts"]) == ("delivered", 0)


def test_a_takeover_is_announced_as_a_reported_failure_is(tmp_path: Path) -> None:
    """The link that died could not report its rows' failed attempt; the claim that took
    them over counted it (history, backoff, ``failed`` at the limit) but told no observer:
    an operator watching ``peer_retry`` / ``peer_failed`` missed every sender's death."""
    path = tmp_path / "sender.db"
    url = f"sqlite:///{path}"
    peer = FakePeer(_never_answer)
    clock = ManualClock()
    try:
        with Runtime(db=url, brain=quiet_brain, clock=clock) as rt:
            device = peer.grant_to(rt)
            rt.peers.stop()  # queued, not sent: the dead runtime is simulated below
            me = rt.create_session(None, "sender").id
            ids = [r["message_id"] for r in
                   rt.peers.send_many(me, f"peer:{device}", ["a", "b", "poison"])]
        with contextlib.closing(sqlite3.connect(path)) as con, con:
            con.execute("UPDATE agent_inbox_messages SET status = 'processing', "
                        "lease_owner = 'a-runtime-that-died', lease_until = 0 "
                        "WHERE transport = 'suzent_peer'")
            con.execute("UPDATE agent_inbox_messages SET attempts = ? WHERE message_id = ?",
                        (PEER.max_attempts - 1, ids[2]))
        heard: dict[str, tuple[str, dict[str, object]]] = {}
        rt = Runtime(db=url, brain=quiet_brain, clock=clock)
        rt.subscribe(lambda event, data: heard.update(
            {str(data["message_id"]): (event, data)} if event.startswith("peer_") else {}))
        with rt.start():
            wait_for(lambda: len(heard) == 3, 20, "the takeovers to be announced")
            rows = {mid: rt.context.journal.get(mid) for mid in ids}
        assert {mid: (event, data["attempts"], data["error"], data["taken_over"])
                for mid, (event, data) in heard.items()} == {
            ids[0]: ("peer_retry", 1, rows[ids[0]]["last_error"], True),
            ids[1]: ("peer_retry", 1, rows[ids[1]]["last_error"], True),
            ids[2]: ("peer_failed", PEER.max_attempts, rows[ids[2]]["last_error"], True)}
        assert {rows[mid]["status"] for mid in ids} == {"pending", "failed"}
    finally:
        peer.close()


async def _never_answer(ws: ServerConnection) -> None:
    async for _text in ws:
        pass


def test_a_link_whose_rows_were_taken_over_under_it_claims_nothing_after_them(
        stores: Stores) -> None:
    """Why a window claim reads the device's head, not only what the link says it holds:
    a link that stalled past its lease still thinks it holds m0 and m1 (none of them
    suspect when it claimed them), but another claim took them over (suspect now, waiting
    out their backoff). Its next claim after m1 must take nothing: m2 would go out ahead
    of the suspects, beside them, instead of after them, each alone."""
    outbox = PeerOutbox(stores.tables, stores.writer)
    _send(stores, "m0", "m1", "m2")
    held = outbox.claim_window("stalled", TARGET, 0, 1.0, lease=LEASE, limit=2)
    assert [r.message_id for r in held] == ["m0", "m1"]
    later = 1.0 + LEASE + 1
    assert _claim(outbox, "other", later) == []  # m0, m1 counted: suspect, pending
    assert [stores.journal.get(m)["suspect"] for m in ("m0", "m1")] == [True, True]
    for now in (later, later + 2.0):  # before and after their backoff
        assert _claim(outbox, "stalled", now, after_seq=held[-1].seq) == []
    assert _claim(outbox, "other", later + 2.0) == ["m0"]


def test_rows_a_lost_claim_answer_left_leased_to_a_live_link_go_again_uncounted(
        stores: Stores) -> None:
    """A window claim's lease committed while its answer was lost with the connection (on
    PostgreSQL: a server restart, a failover, a cut network): the link took the claim for
    failed and holds none of the rows. Its next claim from the device's head found them
    leased to a live owner: nothing to send until the lease ran out, then each counted as
    taken over (an attempt, suspect, announced as its sender's death). A claim from the
    head by the same owner (its link holds nothing then) takes them again, uncounted."""
    outbox = PeerOutbox(stores.tables, stores.writer)
    _send(stores, "m0", "m1", "m2")
    assert _claim(outbox, "me", 1.0, limit=2) == ["m0", "m1"]  # its answer lost
    assert _claim(outbox, "other", 2.0) == []  # a live lease: no other owner's
    assert _claim(outbox, "me", 2.0) == ["m0", "m1", "m2"]
    rows = [stores.journal.get(m) for m in ("m0", "m1", "m2")]
    assert [(r["status"], r["lease_owner"], r["lease_until"], r["attempts"], bool(r["suspect"]))
            for r in rows] == [("processing", "me", 2.0 + LEASE, 0, False)] * 3
    # Past the window's last row, its own rows are the link's: nothing taken twice.
    assert _claim(outbox, "me", 3.0, after_seq=max(r["seq"] for r in rows)) == []
