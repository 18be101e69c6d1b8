"""The inbox without the models' old full indexes (``persistence/open_indexes``).

Every status change of an inbox row moves its entries in each index naming
``status``, so the full ``(status, seq)`` and ``(target, status, seq)``
indexes gave way, on both backends, to partial indexes over the open rows.
These tests hold that to account: ``kinbox db upgrade`` drops the full ones
from an older database and creates the partial ones, and every statement the
journal's claims, commits, reads and operator actions run on the inbox,
EXPLAINed on a large analyzed table, reads an index, never the whole table,
except the listings that read every row anyway (noted below).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from kinbox.persistence import (
    Lease,
    NewMessage,
    TurnEntry,
    bind_tables,
    is_postgres,
    open_database,
    pending_changes,
    upgrade,
)
from kinbox.persistence.open_indexes import FULL_INDEXES, INBOX_INDEXES, index_names
from kinbox.persistence.peer_outbox import PeerOutbox
from kinbox.persistence.pg_prepared import PreparedStatement

from .conftest import Stores
from .helpers import pg_seq_scans

INBOX = "agent_inbox_messages"


def _create_full_indexes(db: Any) -> None:
    """The indexes an older version created (what an upgrade finds there)."""
    for name, definition in FULL_INDEXES.items():
        db.execute_sql(f"CREATE INDEX IF NOT EXISTS {name} {definition}")


@pytest.mark.timeout(60)
def test_upgrade_drops_the_full_indexes_and_creates_the_open_rows_ones(
        any_db_url: str) -> None:
    db = open_database(any_db_url)
    try:
        tables = bind_tables(db)
        upgrade(tables)
        have = index_names(db)
        assert not have & set(FULL_INDEXES) and set(INBOX_INDEXES) <= have
        # An older database: the full indexes, and none of the partial ones.
        _create_full_indexes(db)
        for name in INBOX_INDEXES:
            db.execute_sql(f"DROP INDEX {name}")
        changes = ([f"create index {n}" for n in INBOX_INDEXES]
                   + [f"drop index {n} (replaced)" for n in FULL_INDEXES])
        assert pending_changes(tables) == changes
        assert upgrade(tables) == changes
        have = index_names(db)
        assert not have & set(FULL_INDEXES) and set(INBOX_INDEXES) <= have
        assert pending_changes(tables) == []
    finally:
        db.close()


class Recorder:
    """The inbox statements run through ``db.execute_sql`` (the real call, recorded)."""

    def __init__(self, db: Any, prepared: Sequence[PreparedStatement] = ()) -> None:
        self.db = db
        self.real = db.execute_sql
        self.seen: list[tuple[str, Any]] = []
        self.texts = {p.execute_text: p.sql for p in prepared}
        """A prepared statement's EXECUTE -> its text (what is EXPLAINed)."""

    def __call__(self, sql: str, params: Any = None, *args: Any, **kw: Any) -> Any:
        text = self.texts.get(sql, sql)
        # A PREPARE is its statement's text, EXPLAINed where its EXECUTE runs.
        if INBOX in text and not text.lstrip().upper().startswith(
                ("INSERT", "EXPLAIN", "PREPARE")):
            # Named parameters stay a mapping; positional ones a tuple.
            self.seen.append((text, params if isinstance(params, dict) else tuple(params or ())))
        return self.real(sql, params, *args, **kw)

    def during(self, action: Callable[[], object]) -> list[tuple[str, Any]]:
        start = len(self.seen)
        action()
        return self.seen[start:]


@pytest.fixture
def recorded(any_db_url: str) -> Iterator[tuple[Stores, Recorder]]:
    stores = Stores(any_db_url)
    pg = stores.journal.bulk.pg
    turns = stores.journal.bulk.pg_turns
    recorder = Recorder(stores.tables.db,
                        [pg.first, pg.lease_plain, turns.commit] if pg and turns else [])
    stores.tables.db.execute_sql = recorder  # type: ignore[method-assign]
    try:
        yield stores, recorder
    finally:
        stores.tables.db.execute_sql = recorder.real  # type: ignore[method-assign]
        stores.close()


def _table_reads(db: Any, sql: str, params: Any) -> list[str]:
    """The plan's steps that read the whole inbox table (EXPLAIN, never executed)."""
    if not is_postgres(db):
        # SQLite names a full read "SCAN <table or alias>", an index walk "SCAN x USING
        # INDEX ..." and a probe "SEARCH ...". A range walk of the whole table's seq index
        # ("SEARCH x USING INDEX agent_inbox_messages_seq (seq>?)") reads every later row
        # of every target: as good as a full read on the message path. Peewee quotes its
        # names ("agent_inbox_messages" AS "t1").
        aliases = {INBOX, *re.findall(rf'"?{INBOX}"?\s+(?:AS\s+)?"?(\w+)', sql)}
        steps = [r[3] for r in db.execute_sql("EXPLAIN QUERY PLAN " + sql, params)]
        return [s for s in steps if ((m := re.fullmatch(r"SCAN (\w+)", s)) and m[1] in aliases)
                or re.fullmatch(r"SEARCH \w+ USING (COVERING )?INDEX agent_inbox_messages_seq"
                                r" \(seq[<>]=?\?\)", s)]
    return pg_seq_scans(db, sql, params, INBOX)


@pytest.mark.timeout(180)
def test_no_journal_statement_reads_the_whole_inbox_without_the_full_indexes(
        recorded: tuple[Stores, Recorder]) -> None:
    stores, recorder = recorded
    journal, db, now = stores.journal, stores.tables.db, time.time()
    for start in range(0, 20_000, 2000):
        journal.enqueue_many([NewMessage(f"m{i:06d}", f"t{i % 200:03d}", "x", sender="u")
                              for i in range(start, start + 2000)], now)
    db.execute_sql("UPDATE agent_inbox_messages SET status = 'delivered' "
                   "WHERE seq <= (SELECT MIN(seq) + 10000 FROM agent_inbox_messages)")
    db.execute_sql("UPDATE agent_inbox_messages SET status = 'failed' "
                   "WHERE message_id IN ('m000001', 'm000002')")
    db.execute_sql("ANALYZE agent_inbox_messages")
    rows = journal.claim("w", now, limit=8).rows
    first, second = rows[0], rows[1]
    message_path: list[Callable[[], object]] = [
        lambda: journal.claim("w", now, limit=8),
        lambda: journal.claim_more("w", first.target, first.message_id, first.seq,
                                         now),
        lambda: journal.complete_turn("w", first.target, [first.message_id],
                                      [TurnEntry("assistant", "ok")], now, next_lease=30.0),
        lambda: journal.release("w", [second.message_id], now),
        lambda: journal.renew("w", [r.target for r in rows[2:]], now + 30, now),
        lambda: journal.has_due(now),
        lambda: journal.pending_count(first.target),
        lambda: journal.expire_leases(now, owners=["gone"]),
        lambda: journal.get("m000003"),
        lambda: journal.enqueue(NewMessage("fresh", "t-new", "x"), now, lease=Lease("w", 30)),
        lambda: journal.has_open_from("u", first.target),
        lambda: PeerOutbox(stores.tables, stores.writer).submit_claim(
            "w", first.target, first.seq, now, lease=30, limit=8).result(10),
    ]
    counts: list[Callable[[], object]] = [journal.counts]
    operator: list[Callable[[], object]] = [
        journal.next_due, journal.lease_owners,
        lambda: journal.rows(state="failed"),
        lambda: journal.rows(state="pending", limit=10),
        lambda: journal.requeue_where(now, target="t001"),
    ]
    if is_postgres(db):  # SQLite's counts read an index on status where there was one
        operator += counts
    hot = [s for action in message_path for s in recorder.during(action)]
    cold = [s for action in operator for s in recorder.during(action)]
    assert len(hot) >= len(message_path) and len(cold) >= len(operator)
    after = [_table_reads(db, sql, params) for sql, params in hot + cold]
    with db.atomic() as tx:  # the same plans with the full indexes back (undone)
        _create_full_indexes(db)
        before = [_table_reads(db, sql, params) for sql, params in hot + cold]
        tx.rollback()
    # Without the full indexes no statement reads the table more than with them ...
    for (sql, _), now_reads, then_reads in zip(hot + cold, after, before, strict=True):
        assert len(now_reads) <= len(then_reads), sql
    # ... and none on the message path reads it at all. (Of the operator's, the counts per
    # state and the earliest pending due time read every row or every pending one: the
    # planner reads the table for them with or without the indexes.)
    for (sql, _), reads in zip(hot, after[:len(hot)], strict=True):
        assert reads == [], sql


@pytest.mark.timeout(60)
def test_the_upgrade_drops_the_processing_index_it_replaced(pg_url: str) -> None:
    """Indexes a briefly current version made (agent_inbox_processing_target, then
    agent_inbox_processing_target_seq) are dropped by the upgrade: a database upgraded
    while one was current kept it, written on every lease and delivery."""
    from kinbox.persistence.open_indexes import index_names
    from kinbox.persistence.schema import pending_changes, upgrade

    stores = Stores(pg_url)
    try:
        stores.db.execute_sql(  # as d7d6b23's upgrade left it
            "CREATE INDEX agent_inbox_processing_target ON agent_inbox_messages "
            "(target_chat_id) WHERE status = 'processing'")
        upgrade(stores.tables)
        assert "agent_inbox_processing_target" not in index_names(stores.db), (
            f"old index kept; pending changes: {pending_changes(stores.tables)}")
    finally:
        stores.close()
