"""A session's status and recency, read off the journal (``persistence/session_view``).

The message path writes no session row: a session is active while one of its
inbox rows is processing or a direct turn runs, and its ``updated_at`` is the
later of its row's and its newest transcript entry's. These tests check what
readers see at each step, that the stored row stays untouched while they see
it change, that an older version's leftovers mean nothing, and that the reads
are index probes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import peewee as pw
import pytest

from kinbox.actors import ManualClock, Message, Turn
from kinbox.persistence import NewMessage, TurnEntry, is_postgres, pending_changes, upgrade
from kinbox.persistence.open_indexes import FULL_INDEXES, index_names

from .conftest import Stores
from .helpers import pg_seq_scans, quiet_brain, wait_for
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
    assert pending_changes(stores.tables) == [f"create index {new}"]  # with neither
    db.execute_sql(f"CREATE INDEX {old} {FULL_INDEXES[old]}")  # as an older version made it
    assert upgrade(stores.tables) == [f"create index {new}", f"drop index {old} (replaced)"]
    names = index_names(db)
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
    assert brain.holding.wait(20)  # a cron run: a direct turn, no inbox row
    wait_for(lambda: rt.session(session_id).status == "active",  # type: ignore[union-attr]
             20, "the direct turn to show")
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
    row = rt.context.store.t.db.execute_sql(
        "SELECT status FROM sessions WHERE id = ?", [session_id]).fetchone()
    assert row[0] == "idle"  # the stored status is never the mark


@pytest.mark.timeout(60)
def test_a_direct_turn_whose_commit_fails_outside_the_journal_ends_its_mark(
        make_runtime: MakeRuntime) -> None:
    rt = make_runtime(brain=lambda turn: "ok")
    sid = rt.create_session(rt.create_project("p").id, "s").id

    def refusing(_turn: Turn) -> list[Callable[[], object]]:
        raise RuntimeError("the caller's write could not be built")

    direct = rt._services.direct  # the runtime's direct turns (cron runs, social events use them)
    assert direct is not None
    with pytest.raises(RuntimeError):
        direct.run(sid, [Message("d1", "cron", "tick", None, {})], commit_ops=refusing)
    assert rt.session(sid).status == "idle"  # type: ignore[union-attr]
    assert rt.transcript(sid) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ending", ["commits", "fails"])
def test_a_direct_turn_ends_only_its_own_mark(make_runtime: MakeRuntime, ending: str) -> None:
    """While the turn ran, its runtime's mark was ended as a gone one's (its connection
    dropped, say) and another runtime's direct turn marked the session: ending this turn,
    committed or failed, leaves that runtime's mark in place."""
    def brain(turn: Turn) -> str:
        store, now = rt.context.store, rt.clock.now()
        assert store.end_direct_turn_marks(now, {rt.owner}) == 1
        assert store.take_direct_turn(turn.session_id, "vm:2:other", "its-turn", now)
        if ending == "fails":
            raise RuntimeError("the model is down")
        return "ok"

    rt = make_runtime(brain=brain)
    sid = rt.create_session(rt.create_project("p").id, "s").id
    direct = rt._services.direct
    assert direct is not None
    outcome = direct.run(sid, [Message("d1", "cron", "tick", None, {})])
    assert outcome.committed is (ending == "commits")
    assert rt.context.store.direct_turn(sid) == ("vm:2:other", "its-turn")


@pytest.mark.timeout(60)
def test_a_runtime_that_holds_the_database_alone_ends_a_dead_ones_direct_turn_marks(
        db_url: str, clock: ManualClock) -> None:
    from kinbox.actors import Runtime

    first = Runtime(db=db_url, clock=clock, brain=lambda turn: None).start()
    sid = first.create_session(first.create_project("p").id, "s").id
    assert first.context.store.take_direct_turn(sid, "gone-1", "t1", clock.now())  # it died
    assert first.session(sid).status == "active"  # type: ignore[union-attr]
    first.stop()
    second = Runtime(db=db_url, clock=clock, brain=lambda turn: None).start()
    try:
        assert second.session(sid).status == "idle"  # type: ignore[union-attr]
    finally:
        second.stop()


@pytest.mark.timeout(120)
def test_the_derived_columns_are_index_probes_on_postgres(pg_url: str) -> None:
    stores = Stores(pg_url)
    try:
        db, journal, store = stores.tables.db, stores.journal, stores.store
        store.create_many([(f"s{i:03d}", "p", f"s{i}", "interactive") for i in range(200)], T0)
        for start in range(0, 10_000, 2000):
            journal.enqueue_many([NewMessage(f"m{i:05d}", f"s{i % 200:03d}", "x", sender="u")
                                  for i in range(start, start + 2000)], T0)
            store.append("s000", [TurnEntry("user", f"e{i}") for i in range(start, start + 50)],
                         T0)
        db.execute_sql("UPDATE agent_inbox_messages SET status = 'delivered' "
                       "WHERE seq <= (SELECT MIN(seq) + 8000 FROM agent_inbox_messages)")
        db.execute_sql("ANALYZE")
        for query in (store._select().where(stores.tables.session.id == "s001"),
                      store._select().order_by(pw.SQL("recent").desc()).limit(20)):
            sql, params = query.sql()
            for table in ("agent_inbox_messages", "transcript_entries"):
                assert pg_seq_scans(db, sql, params, table) == [], (table, sql)
        assert [s.id for s in store.sessions(project_id="p", limit=1)] == ["s000"]
    finally:
        stores.close()


@pytest.mark.timeout(60)
def test_on_postgres_a_gone_runtimes_direct_turn_mark_ends_and_a_live_ones_stays(
        pg_url: str, tmp_path: Path) -> None:
    from kinbox.actors import Runtime

    a = Runtime(db=pg_url, brain=quiet_brain, data_dir=str(tmp_path), tick_interval=0.05).start()
    b = Runtime(db=pg_url, brain=quiet_brain, data_dir=str(tmp_path), tick_interval=0.05).start()
    try:
        project = a.create_project("p")
        live, dead = (a.create_session(project.id, name).id for name in ("live", "dead"))
        now = a.clock.now()
        store = a.context.store
        assert store.take_direct_turn(live, b.owner, "t1", now)  # b runs it and is alive
        assert store.take_direct_turn(dead, "vm:1:gone", "t2", now)  # no life lock held
        assert {a.session(s).status for s in (live, dead)} == {"active"}  # type: ignore[union-attr]
        wait_for(lambda: a.session(dead).status == "idle", 10,  # type: ignore[union-attr]
                 "the gone runtime's mark to end")
        assert a.session(live).status == "active"  # type: ignore[union-attr]  # same check
        b.stop()  # its life lock is free now: its marks are a gone runtime's
        wait_for(lambda: a.session(live).status == "idle", 10,  # type: ignore[union-attr]
                 "the stopped runtime's mark to end")
    finally:
        b.stop()
        a.stop()
