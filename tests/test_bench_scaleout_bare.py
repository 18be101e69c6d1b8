"""``bare_pg``, the scaleout bench's same-guarantee yardstick, on a real PostgreSQL: two worker
processes deliver every message once and in per-session order, and a worker that lost its lease
commits nothing. No test asserts a speed."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import psycopg2
import pytest

from kinbox.actors.bench_scaleout import Workers, wait_done
from kinbox.actors.bench_scaleout_bare import ack, claim
from kinbox.actors.bench_scaleout_systems import Producer, scratch_producer

from .helpers import wait_for

pytestmark = pytest.mark.postgres


def _rows(producer: Producer, sql: str) -> list[tuple[Any, ...]]:
    return producer.query(sql)


class AcksHeld:
    """Hold every ack (its insert into ``markers`` waits on a table lock) until two workers
    hold leases in ``inbox``: both take a share whatever the scheduler does, where a worker
    starved of CPU on a loaded machine could otherwise see the other drain everything.
    Taken after the backlog, whose ANALYZE the lock would block; waited for well inside the
    30 s lease, past which the first worker's rows would be taken over."""

    def __init__(self, producer: Producer, inbox: str, markers: str) -> None:
        self.producer, self.inbox = producer, inbox
        self.conn = psycopg2.connect(producer.url)
        with self.conn.cursor() as cur:
            cur.execute(f"LOCK TABLE {markers} IN SHARE MODE")  # an insert's lock conflicts

    def release_once_both_lease(self) -> None:
        wait_for(lambda: _rows(self.producer, f"SELECT COUNT(DISTINCT lease_owner) FROM"
                                              f" {self.inbox} WHERE lease_owner IS NOT NULL"
                               )[0][0] == 2, 20, "both workers holding leases")
        self.release()

    def __enter__(self) -> AcksHeld:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Idempotent; before the workers stop, which they cannot while an ack waits."""
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()


@pytest.mark.timeout(120)
def test_two_bare_workers_deliver_every_message_once_in_session_order(pg_url: str) -> None:
    with scratch_producer("bare_pg", pg_url, 200, 100) as producer:
        producer.backlog(3000)
        with AcksHeld(producer, "bare_inbox", "bare_markers") as held:
            pool = Workers("bare_pg", producer.url, 2)
            try:
                # A claim leases 64 of the 200 heads, so both workers find heads free and each
                # session's turns pass between them, in turn.
                held.release_once_both_lease()
                wait_done(producer, 90)
            finally:
                held.release()
                reports = pool.stop()
        assert producer.audit() == {"lost": 0, "duplicate": 0}
        started = [(t, int(mid)) for r in reports for mid, t in r["starts"]]
        assert sorted(m for _, m in started) == [r[0] for r in _rows(
            producer, "SELECT id FROM bare_inbox ORDER BY id")]  # each started once
        assert all(r["starts"] for r in reports)  # both workers took a share
        session_of = dict(_rows(producer, "SELECT id, session FROM bare_inbox"))
        by_session: dict[str, list[int]] = defaultdict(list)
        for _, mid in sorted(started):
            by_session[session_of[mid]].append(mid)
        assert all(ids == sorted(ids) for ids in by_session.values())
        # The committed transcript: per session, user then assistant for each message in
        # id order (a later turn's entries cannot be written before the earlier one's ack).
        entries: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for session, mid, role in _rows(producer, "SELECT session, message_id, role "
                                        "FROM bare_transcript ORDER BY id"):
            entries[session].append((mid, role))
        for session, ids in by_session.items():
            assert entries[session] == [(m, r) for m in ids for r in ("user", "assistant")]


@pytest.mark.timeout(60)
def test_an_ack_after_the_lease_was_lost_writes_nothing(pg_url: str) -> None:
    with scratch_producer("bare_pg", pg_url, 2, 100) as producer:
        a = psycopg2.connect(producer.url)
        b = psycopg2.connect(producer.url)
        a.autocommit = b.autocommit = True
        try:
            producer.backlog(4)  # sessions s0, s1: two rows each
            held = claim(a.cursor(), "A")
            assert [r[2] for r in held] == [r[2] for r in _rows(
                producer, "SELECT id, session, body FROM bare_inbox ORDER BY id LIMIT 2")]
            assert claim(b.cursor(), "B") == []  # both heads leased; the second rows are no heads
            # A's leases run out (the server's clock moved past them): B takes them over.
            producer.query("UPDATE bare_inbox SET lease_until = now() - interval '1 second' "
                           "WHERE lease_owner = 'A'")
            taken = claim(b.cursor(), "B")
            assert [r[0] for r in taken] == [r[0] for r in held]
            assert ack(a.cursor(), "A", [(r[0], "late") for r in held]) == set()
            assert _rows(producer, "SELECT COUNT(*) FROM bare_transcript")[0][0] == 0
            assert _rows(producer, "SELECT COUNT(*) FROM bare_markers")[0][0] == 0
            assert ack(b.cursor(), "B", [(r[0], "ok") for r in taken]) == {r[0] for r in taken}
            assert _rows(producer, "SELECT role, text FROM bare_transcript ORDER BY id")[1] == (
                "assistant", "ok")
            # An expired lease nobody took over is refused too, and its row stays claimable.
            second = claim(a.cursor(), "A")
            producer.query("UPDATE bare_inbox SET lease_until = now() - interval '1 second' "
                           "WHERE lease_owner = 'A'")
            assert ack(a.cursor(), "A", [(r[0], "late") for r in second]) == set()
            assert [r[0] for r in claim(b.cursor(), "B")] == [r[0] for r in second]
            assert producer.audit() == {"lost": 2, "duplicate": 0}
        finally:
            a.close()
            b.close()


# -- bare_pg_rows: the same loop over kinbox's own rows ------------------------------------

def _catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    tables = ("agent_inbox_messages", "transcript_entries", "delivery_markers")
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT table_name, column_name, data_type, character_maximum_length,"
                        " is_nullable, ordinal_position FROM information_schema.columns"
                        " WHERE table_schema = current_schema() AND table_name = ANY(%s)"
                        " ORDER BY 1, 6", (list(tables),))
            columns = cur.fetchall()
            cur.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname ="
                        " current_schema() AND tablename = ANY(%s) ORDER BY 1", (list(tables),))
            indexes = cur.fetchall()
            cur.execute("SELECT sequencename FROM pg_sequences WHERE schemaname ="
                        " current_schema() ORDER BY 1")
            sequences = cur.fetchall()
        return {"columns": columns, "indexes": indexes, "sequences": sequences}
    finally:
        conn.close()


@pytest.mark.timeout(120)
def test_bare_pg_rows_creates_the_tables_and_indexes_kinbox_creates(pg_url: str) -> None:
    from kinbox.actors import Runtime

    with scratch_producer("kinbox", pg_url, 1, 100) as kinbox:
        assert isinstance(kinbox.rt, Runtime)
        theirs = _catalog(kinbox.url)
    with scratch_producer("bare_pg_rows", pg_url, 1, 100) as rows:
        ours = _catalog(rows.url)
    assert len(theirs["indexes"]) == 10 and len(theirs["columns"]) == 21 + 9 + 4
    assert ours["columns"] == theirs["columns"]
    assert ours["indexes"] == theirs["indexes"]
    # every sequence the message path uses (kinbox's database has more, for its other tables)
    assert set(ours["sequences"]) <= set(theirs["sequences"])
    assert ("agent_inbox_seq",) in ours["sequences"]


@pytest.mark.timeout(120)
def test_two_bare_rows_workers_deliver_every_message_once_in_session_order(pg_url: str) -> None:
    with scratch_producer("bare_pg_rows", pg_url, 200, 100) as producer:
        producer.backlog(3000)
        with AcksHeld(producer, "agent_inbox_messages", "delivery_markers") as held:
            pool = Workers("bare_pg_rows", producer.url, 2)
            try:
                producer.send(3000)  # a durable send too: the closed loop's
                held.release_once_both_lease()
                wait_done(producer, 90)
            finally:
                held.release()
                reports = pool.stop()
        assert producer.audit() == {"lost": 0, "duplicate": 0}
        started = [(t, mid) for r in reports for mid, t in r["starts"]]
        seq_of = dict(_rows(producer, "SELECT message_id, seq FROM agent_inbox_messages"))
        assert sorted(m for _, m in started) == sorted(seq_of)  # each started once
        assert all(r["starts"] for r in reports)  # both workers took a share
        session_of = dict(_rows(producer, "SELECT message_id, target_chat_id"
                                          " FROM agent_inbox_messages"))
        by_session: dict[str, list[int]] = defaultdict(list)
        for _, mid in sorted(started):
            by_session[session_of[mid]].append(seq_of[mid])
        assert all(seqs == sorted(seqs) for seqs in by_session.values())
        # one entry a turn, the user's (the brain replied nothing), as kinbox writes
        assert _rows(producer, "SELECT role, COUNT(*) FROM transcript_entries GROUP BY role"
                     ) == [("user", 3001)]


@pytest.mark.timeout(60)
def test_a_bare_rows_ack_after_the_lease_was_lost_writes_nothing(pg_url: str) -> None:
    from kinbox.actors import bench_scaleout_bare_rows as rows

    with scratch_producer("bare_pg_rows", pg_url, 2, 100) as producer:
        a = psycopg2.connect(producer.url)
        b = psycopg2.connect(producer.url)
        a.autocommit = b.autocommit = True
        try:
            producer.backlog(4)  # sessions s0, s1: two rows each
            held = rows.claim(a.cursor(), "A")
            assert [r[1] for r in held] == ["s000000", "s000001"]
            assert rows.claim(b.cursor(), "B") == []  # both heads leased
            producer.query("UPDATE agent_inbox_messages SET lease_until = lease_until - 3600"
                           " WHERE lease_owner = 'A'")
            taken = rows.claim(b.cursor(), "B")
            assert [r[0] for r in taken] == [r[0] for r in held]
            assert rows.ack(a.cursor(), "A", [(r[0], "late") for r in held]) == set()
            assert _rows(producer, "SELECT COUNT(*) FROM transcript_entries")[0][0] == 0
            assert _rows(producer, "SELECT COUNT(*) FROM delivery_markers")[0][0] == 0
            assert rows.ack(b.cursor(), "B", [(r[0], None) for r in taken]) == {
                r[0] for r in taken}
            assert producer.audit() == {"lost": 2, "duplicate": 0}
        finally:
            a.close()
            b.close()
