"""A session's status and recency, read off the journal (``persistence/session_view``).

The message path writes no session row: a session is active while one of its
inbox rows is processing or a direct turn runs, and its ``updated_at`` is the
later of its row's and its newest transcript entry's. These tests check what
readers see at each step, that the stored row stays untouched while they see
it change, that an older version's leftovers mean nothing, and that the reads
are index probes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import ManualClock
from kinbox.persistence import NewMessage, TurnEntry, is_postgres, pending_changes, upgrade
from kinbox.persistence.open_indexes import FULL_INDEXES

from .conftest import Stores
from .helpers import wait_for
from .test_cron import MINUTE, START, CronBrain, MakeRuntime, every_minute

T0 = 1000.0


def _stored(stores: Stores, session_id: str) -> tuple[Any, ...]:
    """The session row's own status and updated_at columns."""
    row = stores.tables.db.execute_sql(
        "SELECT status, updated_at FROM sessions WHERE id = " + stores.journal.hot.p,
        [session_id]).fetchone()
    return tuple(row)


def _seen(stores: Stores, session_id: str) -> tuple[str, float]:
    s = stores.store.session(session_id)
    assert s is not None
    return s.status, s.updated_at


@pytest.mark.timeout(60)
def test_status_and_recency_follow_the_rows_and_the_transcript_without_a_session_write(
        stores: Stores) -> None:
    journal = stores.journal
    stores.store.create_session("s1", None, "S1", "interactive", 0.0)
    journal.enqueue(NewMessage("m1", "s1", "x"), T0)
    journal.enqueue(NewMessage("m2", "s1", "y"), T0)
    assert _seen(stores, "s1") == ("idle", 0.0)  # pending rows are not a running turn
    [row] = journal.claim("w", T0 + 1).rows
    assert _seen(stores, "s1") == ("active", 0.0)
    following = journal.complete_turn("w", "s1", [row.message_id],
                                      [TurnEntry("assistant", "ok")], T0 + 2, next_lease=30.0)
    assert following is not None and following.message_id == "m2"
    assert _seen(stores, "s1") == ("active", T0 + 2)  # the chained head is processing
    assert journal.complete_turn("w", "s1", ["m2"], [TurnEntry("assistant", "ok")], T0 + 3,
                                 next_lease=30.0) is None
    assert _seen(stores, "s1") == ("idle", T0 + 3)
    assert _stored(stores, "s1") == ("idle", 0.0)  # never written on the way


@pytest.mark.timeout(60)
def test_a_failed_attempt_leaves_its_session_idle(stores: Stores) -> None:
    journal = stores.journal
    stores.store.create_session("s1", None, "S1", "interactive", 0.0)
    journal.enqueue(NewMessage("m1", "s1", "x"), T0)
    [row] = journal.claim("w", T0).rows
    assert _seen(stores, "s1")[0] == "active"
    journal.retry("w", row.message_id, "boom", T0 + 1)
    assert _seen(stores, "s1") == ("idle", 0.0)
    assert journal.get("m1")["status"] == "pending"


@pytest.mark.timeout(60)
def test_what_an_older_version_stored_in_the_status_column_is_ignored(stores: Stores) -> None:
    stores.store.create_session("s1", None, "S1", "interactive", 0.0)
    # An older version marked a session active at each claim; a crash could leave it so.
    stores.tables.db.execute_sql("UPDATE sessions SET status = 'active'")
    assert _seen(stores, "s1")[0] == "idle"


@pytest.mark.timeout(60)
def test_listings_order_by_the_newest_activity_of_either_kind(stores: Stores) -> None:
    store = stores.store
    for i, sid in enumerate(("a", "b", "c")):
        store.create_session(sid, "p", sid.upper(), "interactive", T0 + i)
    assert [s.id for s in store.sessions(project_id="p")] == ["c", "b", "a"]
    store.append("a", [TurnEntry("user", "hi")], T0 + 10)  # a transcript entry
    assert [s.id for s in store.sessions(project_id="p")] == ["a", "c", "b"]
    store.update_session("b", T0 + 20, title="B2")  # a change of the row itself
    assert [(s.id, s.updated_at) for s in store.sessions(project_id="p", limit=2)] == [
        ("b", T0 + 20), ("a", T0 + 10)]
    # The row's time counts when it is the later one, the entry's when it is.
    assert _seen(stores, "a") == ("idle", T0 + 10) and _seen(stores, "b") == ("idle", T0 + 20)
    family = {s.id: s.updated_at for s in store.family(store.session("a"))}  # type: ignore[arg-type]
    assert family == {"a": T0 + 10, "b": T0 + 20, "c": T0 + 2}


@pytest.mark.timeout(60)
def test_the_derived_columns_are_index_probes_on_sqlite(tmp_path: Path) -> None:
    stores = Stores(f"sqlite:///{tmp_path / 'plan.db'}")
    try:
        db = stores.tables.db
        assert not is_postgres(db)
        sql, params = stores.store._select().where(stores.tables.session.id == "s1").sql()
        plan = " | ".join(r[-1] for r in db.execute_sql("EXPLAIN QUERY PLAN " + sql, params))
        assert "USING INDEX agent_inbox_open_target_seq" in plan, plan
        assert "USING COVERING INDEX transcript_entries_session_id_id" in plan or (
            "USING INDEX transcript_entries_session_id_id" in plan), plan
        assert "SCAN" not in plan.replace("SCAN CONSTANT ROW", ""), plan
    finally:
        stores.close()


@pytest.mark.timeout(60)
def test_an_older_database_gets_the_transcript_index_by_session_and_id(
        stores: Stores) -> None:
    db, new, old = stores.tables.db, "transcript_entries_session_id_id", (
        "transcript_entries_session_id")
    db.execute_sql(f"DROP INDEX {new}")
    db.execute_sql(f"CREATE INDEX {old} {FULL_INDEXES[old]}")  # as an older version made it
    assert f"drop index {old} (replaced)" in upgrade(stores.tables)
    names = {r[0] for r in db.execute_sql(
        "SELECT indexname FROM pg_indexes WHERE tablename = 'transcript_entries'"
        if is_postgres(db) else
        "SELECT name FROM sqlite_master WHERE tbl_name = 'transcript_entries'")}
    assert new in names and old not in names and pending_changes(stores.tables) == []


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.mark.timeout(60)
def test_a_direct_turn_shows_active_while_it_runs_and_idle_after(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    brain = CronBrain()
    brain.hold.set()
    rt = make_runtime(brain=brain)
    session_id = f"cron-{every_minute(rt)}"
    clock.advance(MINUTE)
    assert brain.holding.wait(5)  # a cron run: a direct turn, no inbox row
    wait_for(lambda: rt.session(session_id).status == "active",  # type: ignore[union-attr]
             5, "the direct turn to show")
    brain.failing = "no"
    brain.release.set()
    rt.run_until_idle()
    assert rt.session(session_id).status == "idle"  # type: ignore[union-attr]
    brain.failing = None
    clock.advance(MINUTE)
    rt.run_until_idle()
    session = rt.session(session_id)
    assert session is not None and session.status == "idle"
    assert session.updated_at == rt.transcript(session_id)[-1].created_at
