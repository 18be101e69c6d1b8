"""PostgreSQL's claim over the partial indexes of the open rows (``persistence/pg_claims``).

The claim walks the pending rows in ``seq`` order a window at a time; a head far
behind rows that cannot be claimed must still be found, the plans must stay on
the open-rows indexes once the table is large and analyzed (the plan that
walked the whole table is what made a 50,000-message drain stall), and an
older database gets the indexes from ``kinbox db upgrade``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from kinbox.persistence import NewMessage, bind_tables, open_database, pending_changes, upgrade
from kinbox.persistence.open_indexes import OPEN_INDEXES

from .conftest import Stores

pytestmark = pytest.mark.postgres


@pytest.mark.timeout(120)
def test_a_head_behind_thousands_of_a_busy_targets_rows_is_claimed(pg_url: str) -> None:
    stores = Stores(pg_url)
    try:
        journal, now = stores.journal, time.time()
        busy = [NewMessage(f"a{i:05d}", "busy", f"a {i}", sender="u") for i in range(3000)]
        journal.enqueue_many(busy, now)
        journal.enqueue_many([NewMessage("b0", "other", "b", sender="u")], now)
        first = journal.claim("w0", now, limit=1)
        assert [r.message_id for r in first.rows] == ["a00000"]
        # Every pending row before b0 is busy's, whose head w0 runs: not claimable.
        second = journal.claim("w1", now, limit=4)
        assert [r.message_id for r in second.rows] == ["b0"]
        # w0's own busy target, excluded by the caller, is left out the same way.
        assert journal.claim("w0", now, limit=4, exclude=["busy"]).rows == []
        # A pending head found past the first window: left out when its target is
        # excluded (the targets travel as one array literal, quotes and all), else leased.
        journal.enqueue_many([NewMessage("c0", 'th"ird\\', "c", sender="u")], now)
        assert journal.claim("w2", now, limit=4, exclude=['th"ird\\', "x,y"]).rows == []
        assert [r.message_id for r in journal.claim("w2", now, limit=4, exclude=["x,y"]).rows
                ] == ["c0"]
    finally:
        stores.close()


def _plan(stores: Stores, sql: str, params: Any, generic: bool = False) -> dict[str, Any]:
    """The executed plan (EXPLAIN ANALYZE, as JSON) of ``sql``, rolled back; ``generic``:
    of a prepared statement's generic plan (the one its plan cache may settle on)."""
    db = stores.tables.db
    with db.atomic() as tx:
        if generic:
            db.execute_sql("SET LOCAL plan_cache_mode = force_generic_plan")
        plan = db.execute_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()[0]
        tx.rollback()
    return plan[0]["Plan"]  # type: ignore[no-any-return]


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


@pytest.mark.timeout(180)
def test_the_claims_plans_stay_on_the_open_rows_indexes_on_a_large_table(
        pg_url: str) -> None:
    stores = Stores(pg_url)
    try:
        journal, now, db = stores.journal, time.time(), stores.tables.db
        for start in range(0, 20_000, 2000):
            journal.enqueue_many([NewMessage(f"m{i:06d}", f"t{i % 200:03d}", "x", sender="u")
                                  for i in range(start, start + 2000)], now)
        # Half of it delivered, as mid-drain (old row versions left behind: no vacuum).
        db.execute_sql("UPDATE agent_inbox_messages SET status = 'delivered' "
                       "WHERE seq <= (SELECT MIN(seq) + 10000 FROM agent_inbox_messages)")
        pg = stores.journal.bulk.pg
        assert pg is not None
        window = {"now": now, "transport": "local", "skip": [], "after": 0, "window": 32}
        for analyzed in (False, True):  # never analyzed (autovacuum off, a fresh bulk load)
            if analyzed:
                db.execute_sql("ANALYZE agent_inbox_messages")
            for _ in range(8):  # past the plan cache's first custom plans
                pg.first.run(window)
            # As text, as prepared (whatever plan the cache chose), and its generic plan.
            for nodes in (_nodes(_plan(stores, pg.sql_first, window)),
                          _nodes(_plan(stores, pg.first.execute_text, window)),
                          _nodes(_plan(stores, pg.first.execute_text, window, generic=True))):
                indexes = {n.get("Index Name") for n in nodes}
                assert {"agent_inbox_pending_seq", "agent_inbox_processing_seq",
                        "agent_inbox_open_target_seq"} <= indexes
                assert not any(n["Node Type"] == "Seq Scan" for n in nodes)
                # The head probe runs on the window's rows only, never once per pending
                # row (the plan that took seconds a claim on a large backlog).
                probes = [n for n in nodes
                          if n.get("Index Name") == "agent_inbox_open_target_seq"]
                assert all(n["Actual Loops"] <= 32 for n in probes)
            lock = _nodes(_plan(stores, pg.sql_lock, (["m010001", "m010002"], now, now)))
            assert not any(n["Node Type"] == "Seq Scan" for n in lock)
            probes = [n for n in lock if n.get("Index Name") == "agent_inbox_open_target_seq"
                      and n["Node Type"] != "Bitmap Index Scan"]
            assert probes and all(n["Actual Loops"] <= 2 for n in probes)
            lease = {"ids": ["m010001", "m010002"], "now": now, "owner": "w",
                     "until": now + 30, "limit": 2}
            pg.lease_plain.run({**lease, "ids": ["none"]})  # prepared on this connection
            for generic in (False, True):  # as a claim leases them (rolled back)
                leasing = _nodes(_plan(stores, pg.lease_plain.execute_text, lease, generic))
                assert not any(n["Node Type"] == "Seq Scan" for n in leasing)
            if analyzed:
                # With statistics the window is an ordered walk (no sort of the pending
                # rows) and the lock goes by primary key. Never analyzed, the planner
                # believes the partial indexes nearly empty and reads all of them (a few
                # ms at 10,000 pending rows): linear, not the per-row probes of before.
                assert not any(n["Node Type"] == "Sort" for n in nodes)
                assert "agent_inbox_messages_pkey" in {n.get("Index Name") for n in lock}
        rows = journal.claim("w", now, limit=64).rows
        assert len(rows) == 64 and all(int(r.message_id[1:]) > 10_000 for r in rows)
    finally:
        stores.close()


@pytest.mark.timeout(60)
def test_upgrade_adds_the_open_rows_indexes_an_older_database_lacks(pg_url: str) -> None:
    db = open_database(pg_url)
    try:
        tables = bind_tables(db)
        upgrade(tables)
        assert pending_changes(tables) == []
        db.execute_sql("DROP INDEX agent_inbox_pending_seq")
        assert pending_changes(tables) == ["create index agent_inbox_pending_seq"]
        assert upgrade(tables) == ["create index agent_inbox_pending_seq"]
        have = {r[0] for r in db.execute_sql(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'agent_inbox_messages'")}
        assert set(OPEN_INDEXES) <= have
        assert pending_changes(tables) == []
    finally:
        db.close()
