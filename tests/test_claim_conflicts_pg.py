"""A claim that PostgreSQL aborts to resolve a conflict, outside the writer (PostgreSQL).

On PostgreSQL the dispatcher's claim runs on its own connection, not as a writer
operation (see ``InboxClaims.claim``): a lease statement, and for a takeover or a suspect
row a short transaction by the full rules. Either may be aborted by a deadlock (SQLSTATE
40P01) or a serialization failure (40001) like any transaction: nothing of it is written,
and the same claim in a new transaction may well succeed. The writer runs such work again
by itself; the claim must too, and what a conflict that keeps coming back leaves must be
the rows as they were, claimable at the next try.

The conflicts are made deterministic by a trigger the test installs on the inbox table:
the first ``n`` leases it sees fail with SQLSTATE 40P01 (counted by a sequence, which a
rollback does not undo). Both go with the test.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest

from kinbox.actors import Runtime, Turn
from kinbox.persistence import DatabaseFailed, NewMessage
from kinbox.persistence.batch_run import CONFLICT_RETRIES

from .conftest import Stores
from .helpers import end_backends, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]

LEASED_AFRESH = "OLD.status = 'pending' AND NEW.status = 'processing'"
"""A claim leasing a pending row (the plain lease, and the full rules' lease)."""
TAKEN_OVER = ("OLD.status = 'processing' AND NEW.status = 'processing' "
              "AND NEW.lease_owner IS DISTINCT FROM OLD.lease_owner")
"""A claim leasing a row another owner held (a takeover, by the full rules only)."""


class Conflicts:
    """The test's trigger: the first ``n`` updates of inbox rows matching ``when`` fail with
    a deadlock (40P01)."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg2.connect(url)
        self.conn.autocommit = True

    def arm(self, n: int, when: str) -> None:
        with self.conn.cursor() as cur:
            cur.execute("DROP TRIGGER IF EXISTS kinbox_test_conflict ON agent_inbox_messages")
            cur.execute("DROP SEQUENCE IF EXISTS kinbox_test_conflicts")
            cur.execute("CREATE SEQUENCE kinbox_test_conflicts")
            cur.execute(f"""
                CREATE OR REPLACE FUNCTION kinbox_test_conflict() RETURNS trigger AS $$
                BEGIN
                    IF nextval('kinbox_test_conflicts') <= {int(n)} THEN
                        RAISE EXCEPTION 'deadlock detected (made by the test)'
                            USING ERRCODE = '40P01';
                    END IF;
                    RETURN NEW;
                END $$ LANGUAGE plpgsql""")
            cur.execute(f"CREATE TRIGGER kinbox_test_conflict BEFORE UPDATE ON "
                        f"agent_inbox_messages FOR EACH ROW WHEN ({when}) "
                        f"EXECUTE FUNCTION kinbox_test_conflict()")

    def fired(self) -> int:
        """How many leases the trigger saw (failed or let through)."""
        with self.conn.cursor() as cur:
            cur.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END "
                        "FROM kinbox_test_conflicts")
            return int(cur.fetchone()[0])

    def remove(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("DROP TRIGGER IF EXISTS kinbox_test_conflict ON agent_inbox_messages")
            cur.execute("DROP FUNCTION IF EXISTS kinbox_test_conflict()")
            cur.execute("DROP SEQUENCE IF EXISTS kinbox_test_conflicts")
        self.conn.close()


@pytest.fixture
def any_db_url(pg_url: str) -> str:
    """conftest's ``stores``, on PostgreSQL alone."""
    return pg_url


@pytest.fixture
def conflicts(pg_url: str, stores: Stores) -> Iterator[Conflicts]:
    c = Conflicts(pg_url)  # after the tables: ``stores`` made them
    yield c
    c.remove()


def _row(stores: Stores, message_id: str) -> dict[str, Any]:
    m = stores.tables.inbox
    return m.select(m.status, m.lease_owner, m.attempts, m.suspect).where(
        m.message_id == message_id).dicts().get()


def _events(stores: Stores, message_id: str) -> list[str]:
    e = stores.tables.event
    return [r.event for r in e.select(e.event).where(e.message_id == message_id)]


def _taken_over_setup(stores: Stores, now: float) -> None:
    """m1 of t1 leased by ``dead`` until ``now + 1``, its turn started; m2 of t2 pending."""
    stores.journal.enqueue(NewMessage("m1", "t1", "hello", sender="u"), now)
    claimed = stores.journal.claim("dead", now, lease=1.0)
    assert [r.message_id for r in claimed.rows] == ["m1"]
    stores.journal.mark_turn_started("dead", "m1", now)
    stores.journal.enqueue(NewMessage("m2", "t2", "there", sender="u"), now)


def test_a_plain_lease_a_deadlock_aborted_is_claimed_again(
        stores: Stores, conflicts: Conflicts) -> None:
    """The common claim's lease statement fails once with 40P01: the claim runs again and
    leases the row; its caller never hears of the conflict."""
    now = time.time()
    stores.journal.enqueue(NewMessage("m1", "t1", "hello", sender="u"), now)
    conflicts.arm(1, LEASED_AFRESH)
    result = stores.journal.claim("w", now)
    assert [r.message_id for r in result.rows] == ["m1"]
    assert conflicts.fired() == 2  # failed once, then leased
    assert _row(stores, "m1")["lease_owner"] == "w"


def test_a_takeover_a_deadlock_aborted_is_undone_whole_and_claimed_again(
        stores: Stores, conflicts: Conflicts) -> None:
    """A takeover runs by the full rules in a transaction: it counts the interrupted turn
    (an event, the attempts), then leases. A deadlock at the lease undoes the whole
    transaction, so the claim run again counts the interruption once, not twice; the plain
    row leased before it is claimed as well."""
    now = time.time()
    _taken_over_setup(stores, now)
    conflicts.arm(1, TAKEN_OVER)
    result = stores.journal.claim("w2", now + 5)
    by_id = {r.message_id: r for r in result.rows}
    assert sorted(by_id) == ["m1", "m2"]
    assert by_id["m1"].taken_over and by_id["m1"].attempts == 1
    assert conflicts.fired() == 2
    assert _events(stores, "m1") == ["interrupted"]
    assert _row(stores, "m1")["attempts"] == 1
    assert {_row(stores, m)["lease_owner"] for m in ("m1", "m2")} == {"w2"}


def test_a_conflict_that_keeps_coming_back_fails_the_claim_and_leaves_the_rows_as_they_were(
        stores: Stores, conflicts: Conflicts) -> None:
    """Every try aborted: the caller gets the retryable error after a bounded number of
    tries, and nothing of any try stays: the taken-over row is still the dead owner's with
    no interruption counted, the plain row leased beside it is pending again, and the next
    claim, once the conflict is gone, takes both."""
    now = time.time()
    _taken_over_setup(stores, now)
    conflicts.arm(1000, TAKEN_OVER)
    with pytest.raises(DatabaseFailed) as caught:
        stores.journal.claim("w2", now + 5)
    assert caught.value.retryable and caught.value.sqlstate == "40P01"
    assert conflicts.fired() == CONFLICT_RETRIES + 1
    assert _row(stores, "m1") == {"status": "processing", "lease_owner": "dead", "attempts": 0,
                                  "suspect": None}
    assert _events(stores, "m1") == []
    assert _row(stores, "m2")["status"] == "pending"
    assert _row(stores, "m2")["lease_owner"] is None
    conflicts.arm(0, TAKEN_OVER)
    result = stores.journal.claim("w2", now + 6)
    assert sorted(r.message_id for r in result.rows) == ["m1", "m2"]


def test_a_claim_whose_connection_was_lost_fails_once_and_the_next_one_leases(
        pg_url: str, stores: Stores) -> None:
    """The server ends the claiming thread's connection between two claims (a restart, a
    failover): the next claim fails with a connection error (not retried: a statement
    the connection was lost under may have committed), leaves the row pending, and the
    claim after it connects again and leases the row."""
    now = time.time()
    stores.journal.enqueue(NewMessage("m1", "t1", "hello", sender="u"), now)
    end_backends(pg_url, [stores.db.execute_sql("SELECT pg_backend_pid()").fetchone()[0]])
    with pytest.raises(DatabaseFailed) as caught:
        stores.journal.claim("w", now)
    assert caught.value.kind in ("OperationalError", "InterfaceError")
    assert not caught.value.retryable
    assert _row(stores, "m1")["status"] == "pending"
    result = stores.journal.claim("w", now)
    assert [r.message_id for r in result.rows] == ["m1"]


def _conflicts_on(pg_url: str, n: int) -> Conflicts:
    c = Conflicts(pg_url)
    c.arm(n, LEASED_AFRESH)
    return c


@pytest.mark.timeout(60)
def test_a_runtime_delivers_a_message_whose_claim_a_deadlock_aborted_at_once(
        pg_url: str, runtimes: list[Runtime]) -> None:
    """The dispatcher's claim of a sent message fails with 40P01, as many times as a claim
    tries again. The runtime's tick is 30 s away, and a send nudges the dispatcher once or
    twice: the claim itself must run again, and the message is delivered within a few
    seconds, once."""
    seen: list[str] = []
    rt = Runtime(db=pg_url, brain=lambda turn: seen.append(turn.messages[0].content),
                 tick_interval=30.0, lease_seconds=120.0).start()
    runtimes.append(rt)
    sid = rt.create_session("default", "T").id
    conflicts = _conflicts_on(pg_url, CONFLICT_RETRIES)
    try:
        rt.post(sid, "first", sender="u")
        wait_for(lambda: seen == ["first"], timeout=10, what="the delivery")
        assert conflicts.fired() == CONFLICT_RETRIES + 1
        wait_for(lambda: rt.inbox(state="delivered") != [], timeout=10, what="the ack")
    finally:
        conflicts.remove()
    assert seen == ["first"]


@pytest.mark.timeout(90)
def test_a_dispatcher_outlives_claims_a_conflict_keeps_failing_and_delivers_after(
        pg_url: str, runtimes: list[Runtime], caplog: pytest.LogCaptureFixture) -> None:
    """Every claim fails with 40P01 for a while: the dispatcher lives on, says so at
    WARNING without the message's body, and delivers the message (once) at a tick after the
    conflict went."""
    seen: list[str] = []

    def brain(turn: Turn) -> None:
        seen.append(turn.messages[0].content)

    rt = Runtime(db=pg_url, brain=brain, tick_interval=0.2).start()
    runtimes.append(rt)
    sid = rt.create_session("default", "T").id
    conflicts = _conflicts_on(pg_url, 10_000)
    try:
        with caplog.at_level(logging.DEBUG, logger="kinbox"):
            rt.post(sid, "a secret body", sender="u")
            # several claims at the tick, each with all its tries, fail
            wait_for(lambda: conflicts.fired() >= 3 * (CONFLICT_RETRIES + 1), timeout=20,
                     what="claims failing")
            assert seen == []
            conflicts.arm(0, LEASED_AFRESH)
            wait_for(lambda: seen == ["a secret body"], timeout=10, what="the delivery")
    finally:
        conflicts.remove()
    assert rt.context.dispatcher is not None and rt.context.dispatcher.is_alive()
    claims = [r for r in caplog.records
              if r.name == "kinbox.dispatcher" and r.levelno > logging.DEBUG]
    assert claims and all(r.levelno == logging.WARNING for r in claims)
    assert all("secret" not in r.getMessage() for r in caplog.records
               if r.levelno > logging.DEBUG)
    rt.stop()
    assert seen == ["a secret body"]
