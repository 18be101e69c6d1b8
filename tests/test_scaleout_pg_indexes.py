"""PostgreSQL without the models' full inbox indexes (``persistence/open_indexes``).

Every status change of an inbox row writes an entry into each full index of
the table, so PostgreSQL drops the ones only SQLite's statements read. These
tests hold that to account: ``kinbox db upgrade`` drops them from an older
database (SQLite keeps them), and every statement the journal's claims,
commits, reads and operator actions run on the inbox, EXPLAINed on a large
analyzed table, reads an index, never the whole table, except the two
listings that read every row anyway or have no index to read (noted below).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kinbox.persistence import (
    NewMessage,
    TurnEntry,
    bind_tables,
    open_database,
    pending_changes,
    upgrade,
)
from kinbox.persistence.open_indexes import PG_INDEXES, SQLITE_ONLY_INDEXES

from .conftest import Stores

INBOX = "agent_inbox_messages"


def _index_names(db: Any, query: str) -> set[str]:
    return {r[0] for r in db.execute_sql(query)}


@pytest.mark.postgres
@pytest.mark.timeout(60)
def test_upgrade_drops_the_full_indexes_only_sqlite_reads(pg_url: str) -> None:
    db = open_database(pg_url)
    try:
        tables = bind_tables(db)
        upgrade(tables)
        query = "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
        have = _index_names(db, query)
        assert not have & set(SQLITE_ONLY_INDEXES) and set(PG_INDEXES) <= have
        # An older database: the models' indexes as peewee creates them.
        for model in (tables.inbox, tables.session):
            model._schema.create_indexes(safe=True)
        assert set(SQLITE_ONLY_INDEXES) <= _index_names(db, query)
        drops = [f"drop index {n} (SQLite's only)" for n in SQLITE_ONLY_INDEXES]
        assert pending_changes(tables) == drops
        assert upgrade(tables) == drops
        assert not _index_names(db, query) & set(SQLITE_ONLY_INDEXES)
        assert pending_changes(tables) == []
    finally:
        db.close()


@pytest.mark.timeout(60)
def test_sqlite_keeps_the_models_indexes(tmp_path: Path) -> None:
    db = open_database(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        upgrade(bind_tables(db))
        have = _index_names(db, "SELECT name FROM sqlite_master WHERE type = 'index'")
        assert set(SQLITE_ONLY_INDEXES) <= have
        assert not have & set(PG_INDEXES)
    finally:
        db.close()


class Recorder:
    """The inbox statements run through ``db.execute_sql`` (the real call, recorded)."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.real = db.execute_sql
        self.seen: list[tuple[str, Any]] = []

    def __call__(self, sql: str, params: Any = None, *args: Any, **kw: Any) -> Any:
        if INBOX in sql and not sql.lstrip().upper().startswith(("INSERT", "EXPLAIN")):
            # Named parameters stay a mapping; positional ones a tuple.
            self.seen.append((sql, params if isinstance(params, dict) else tuple(params or ())))
        return self.real(sql, params, *args, **kw)

    def during(self, action: Callable[[], object]) -> list[tuple[str, Any]]:
        start = len(self.seen)
        action()
        return self.seen[start:]


@pytest.fixture
def recorded(pg_url: str) -> Iterator[tuple[Stores, Recorder]]:
    stores = Stores(pg_url)
    recorder = Recorder(stores.tables.db)
    stores.tables.db.execute_sql = recorder  # type: ignore[method-assign]
    try:
        yield stores, recorder
    finally:
        stores.tables.db.execute_sql = recorder.real  # type: ignore[method-assign]
        stores.close()


def _table_reads(db: Any, sql: str, params: Any) -> list[str]:
    """The plan's nodes that read the whole inbox table (EXPLAIN, never executed)."""
    plan = db.execute_sql("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()[0][0]["Plan"]

    def nodes(n: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield n
        for child in n.get("Plans", []):
            yield from nodes(child)
    return [n["Node Type"] for n in nodes(plan)
            if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == INBOX]


@pytest.mark.postgres
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
        lambda: journal.claim_more("w", first.target, first.seq, now),
        lambda: journal.complete_turn("w", first.target, [first.message_id],
                                      [TurnEntry("assistant", "ok")], now, next_lease=30.0),
        lambda: journal.release("w", [second.message_id], now),
        lambda: journal.renew("w", [r.target for r in rows[2:]], now + 30, now),
        lambda: journal.has_due(now),
        lambda: journal.pending_count(first.target),
        lambda: journal.expire_leases(now, owners=["gone"]),
        lambda: journal.get("m000003"),
    ]
    operator: list[Callable[[], object]] = [
        journal.next_due, journal.lease_owners, journal.counts,
        lambda: journal.rows(state="failed"),
        lambda: journal.rows(state="pending", limit=10),
        lambda: journal.requeue_where(now, target="t001"),
    ]
    hot = [s for action in message_path for s in recorder.during(action)]
    cold = [s for action in operator for s in recorder.during(action)]
    assert len(hot) >= len(message_path) and len(cold) >= len(operator)
    after = [_table_reads(db, sql, params) for sql, params in hot + cold]
    with db.atomic() as tx:  # the same plans with the full indexes back (undone)
        for model in (stores.tables.inbox, stores.tables.session):
            model._schema.create_indexes(safe=True)
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
