"""Reads that grow with a database's age walk an index of their own, on SQLite and
PostgreSQL: the plan of the statement the store runs names it.

``TaskStore.last_updates`` (the Focal heartbeat's look at a project) read every task the
project ever had from the table through ``tasks_project_id`` and grouped them in a temp
B-tree (SQLite) or a hash (PostgreSQL); it now reads the index
``tasks_project_id_chat_id_updated_at`` alone, grouped in its order. A page of
``SessionStore.sessions_page`` walks ``sessions_created_at_id`` (per project,
``sessions_project_id_created_at_id``) from its cursor. An older database gets the
indexes from ``upgrade``, which drops the one they replace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kinbox.persistence import (
    CronJobRecord,
    CronStore,
    TaskStore,
    is_postgres,
    paging,
    pending_changes,
    upgrade,
)
from kinbox.persistence.open_indexes import index_names

from .conftest import Stores

pytestmark = pytest.mark.timeout(120)

TASKS_INDEX = "tasks_project_id_chat_id_updated_at"


@pytest.fixture
def crowded(stores: Stores) -> Iterator[Stores]:
    """3,000 tasks of 10 projects and 300 sessions, and 3,000 sessions of 10 projects;
    the planner's statistics up to date (autovacuum's work on PostgreSQL)."""
    t = stores.tables
    tasks = [{"id": f"t{i}", "project_id": f"p{i % 10}", "chat_id": f"c{i % 300}",
              "title": "x", "status": "completed" if i % 3 else "pending",
              "created_at": i, "updated_at": i + (i * 7919) % 1000} for i in range(3000)]
    sessions = [{"id": f"s{i:04d}", "project_id": f"p{i % 10}", "title": "s",
                 "kind": "cron", "status": "idle", "config": "{}", "created_at": i // 3,
                 "updated_at": i} for i in range(3000)]

    def write() -> None:
        for first in range(0, 3000, 500):
            t.task.insert_many(tasks[first:first + 500]).execute()
            t.session.insert_many(sessions[first:first + 500]).execute()
    stores.writer.call(write)
    analyse(stores)
    yield stores


def analyse(stores: Stores) -> None:
    if is_postgres(stores.db):
        stores.db.execute_sql("VACUUM ANALYZE tasks")
        stores.db.execute_sql("VACUUM ANALYZE sessions")
    else:
        stores.db.execute_sql("ANALYZE")


def plan_of(stores: Stores, monkeypatch: pytest.MonkeyPatch, read: Callable[[], Any],
            table: str) -> str:
    """The plan of the statement ``read`` runs on ``table`` (captured as it runs)."""
    ran: list[tuple[str, Any]] = []
    execute = stores.db.execute_sql

    def recording(sql: str, params: Any = None, *args: Any, **kwargs: Any) -> Any:
        if f'FROM "{table}"' in sql:
            ran.append((sql, params))
        return execute(sql, params, *args, **kwargs)
    monkeypatch.setattr(stores.db, "execute_sql", recording)
    read()
    monkeypatch.undo()
    assert len(ran) == 1, ran
    sql, params = ran[0]
    prefix = "EXPLAIN " if is_postgres(stores.db) else "EXPLAIN QUERY PLAN "
    return "\n".join(str(r[-1]) for r in stores.db.execute_sql(prefix + sql, params))


def test_last_updates_reads_the_composite_index_alone(crowded: Stores,
                                                      monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    tasks = TaskStore(crowded.tables, crowded.writer)
    plan = plan_of(crowded, monkeypatch, lambda: tasks.last_updates("p3"), "tasks")
    if is_postgres(crowded.db):
        assert f"Index Only Scan using {TASKS_INDEX}" in plan, plan
    else:
        assert f"USING COVERING INDEX {TASKS_INDEX}" in plan, plan
        assert "TEMP B-TREE" not in plan, plan  # grouped in the index's order
    # And its answer is the latest change of each session's tasks.
    expected: dict[str, float] = {}
    for t in tasks.for_project("p3"):
        expected[t.chat_id] = max(expected.get(t.chat_id, 0.0), t.updated_at)
    assert tasks.last_updates("p3") == expected and len(expected) == 30


@pytest.mark.parametrize("project_id", [None, "p4"])
def test_a_sessions_page_walks_the_creation_index_from_its_cursor(
        crowded: Stores, monkeypatch: pytest.MonkeyPatch, project_id: str | None) -> None:
    store = crowded.store
    after = paging.Keyset(500.0, "s1501").token()
    plan = plan_of(crowded, monkeypatch, lambda: store.sessions_page(
        project_id=project_id, limit=20, after=after), "sessions")
    # A project's page may walk either: the planner weighs how many sessions are the
    # project's (PostgreSQL takes the walk over all and filters when they are many).
    indexes = ["sessions_created_at_id"] + (["sessions_project_id_created_at_id"]
                                            if project_id else [])
    if is_postgres(crowded.db):
        assert any(f"Index Scan Backward using {i} " in plan for i in indexes), plan
        assert "Sort" not in plan, plan  # read in the order, not sorted
    else:
        assert any(f"USING INDEX {i} " in plan for i in indexes), plan
        assert "TEMP B-TREE" not in plan, plan
    page = store.sessions_page(project_id=project_id, limit=20, after=after)
    assert all((s.created_at, s.id) < (500.0, "s1501") for s in page.sessions)
    assert len(page.sessions) == 20 and page.after is not None


def test_an_older_database_gets_the_indexes_from_upgrade(stores: Stores) -> None:
    """As an older version left it: the tasks indexed by project alone, no composite."""
    db = stores.db
    for name in (TASKS_INDEX, "sessions_created_at_id", "sessions_project_id_created_at_id"):
        db.execute_sql(f"DROP INDEX {name}")
    db.execute_sql("CREATE INDEX tasks_project_id ON tasks (project_id)")
    changes = pending_changes(stores.tables)
    assert {f"create index {TASKS_INDEX}", "create index sessions_created_at_id",
            "create index sessions_project_id_created_at_id",
            "drop index tasks_project_id (replaced)"} <= set(changes), changes
    upgrade(stores.tables)
    have = index_names(db)
    assert TASKS_INDEX in have and "tasks_project_id" not in have
    assert {"sessions_created_at_id", "sessions_project_id_created_at_id"} <= have
    assert pending_changes(stores.tables) == []


RUNS_INDEX = "cron_runs_job_id_started_at_id"


@pytest.fixture
def long_run_history(stores: Stores) -> Iterator[Stores]:
    """3,000 finished runs of 10 jobs (an every-minute job's two days, ten times over)."""
    t = stores.tables
    runs = [{"id": f"j{i % 10}@{i}", "job_id": f"j{i % 10}", "scheduled_for": i * 6.0,
             "started_at": i * 6.0, "finished_at": i * 6.0 + 1, "status": "success",
             "attempts": 1} for i in range(3000)]

    def write() -> None:
        for first in range(0, 3000, 500):
            t.cron_run.insert_many(runs[first:first + 500]).execute()
    stores.writer.call(write)
    if is_postgres(stores.db):
        stores.db.execute_sql("VACUUM ANALYZE cron_runs")
    else:
        stores.db.execute_sql("ANALYZE")
    yield stores


def test_a_jobs_last_runs_walk_an_index_in_their_order(long_run_history: Stores,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """What every run's reminder reads (its job's last runs): with ``job_id`` alone
    indexed, all of the job's runs were read and sorted, at every run."""
    crons = CronStore(long_run_history.tables, long_run_history.writer)
    plan = plan_of(long_run_history, monkeypatch, lambda: crons.runs("j3", limit=5),
                   "cron_runs")
    if is_postgres(long_run_history.db):
        assert f"Index Scan Backward using {RUNS_INDEX}" in plan, plan
        assert "Sort" not in plan, plan
    else:
        assert f"USING INDEX {RUNS_INDEX}" in plan, plan
        assert "TEMP B-TREE" not in plan, plan
    assert [r.id for r in crons.runs("j3", limit=5)] == [
        f"j3@{i}" for i in (2993, 2983, 2973, 2963, 2953)]


def test_an_older_database_gets_the_run_index_from_upgrade(stores: Stores) -> None:
    """As an older version left it: the runs indexed by job alone."""
    db = stores.db
    db.execute_sql(f"DROP INDEX {RUNS_INDEX}")
    db.execute_sql("CREATE INDEX IF NOT EXISTS cron_runs_job_id ON cron_runs (job_id)")
    assert sorted(pending_changes(stores.tables)) == [
        f"create index {RUNS_INDEX}", "drop index cron_runs_job_id (replaced)"]
    upgrade(stores.tables)
    have = index_names(db)
    assert RUNS_INDEX in have and "cron_runs_job_id" not in have
    assert pending_changes(stores.tables) == []


def test_a_prunes_read_of_a_jobs_old_runs_stops_at_the_cutoff(
        long_run_history: Stores, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prune's batch walks the job's index from its oldest runs to the cutoff, not on
    through every recent run below its newest kept (the whole history, for a job whose
    runs are nearly all recent)."""
    stores = long_run_history
    CronStore(stores.tables, stores.writer).create(CronJobRecord(
        "j3", "j3", "* * * * *", "UTC", "p", True, "none", 0, None, None, None, None, 0, 0))
    ran: list[tuple[str, Any]] = []
    execute = stores.db.execute_sql

    def recording(sql: str, params: Any = None, *args: Any, **kwargs: Any) -> Any:
        if 'FROM "cron_runs"' in sql:
            ran.append((sql, params))
        return execute(sql, params, *args, **kwargs)
    monkeypatch.setattr(stores.db, "execute_sql", recording)
    step = stores.journal.prune_cron_batch(600.0, batch=1000)
    monkeypatch.undo()
    assert step.runs == 10  # j3's runs started (and finished) before 600
    [(sql, params)] = [(sql, params) for sql, params in ran  # the read of the candidates
                       if sql.startswith("SELECT") and "LIMIT" in sql and "DESC" not in sql
                       and "FOR UPDATE" not in sql]
    if is_postgres(stores.db):
        plan = "\n".join(str(r[0]) for r in stores.db.execute_sql("EXPLAIN " + sql, params))
        assert RUNS_INDEX in plan and "started_at < " in plan.split("Filter")[0], plan
    else:
        plan = "\n".join(str(r[-1]) for r in stores.db.execute_sql(
            "EXPLAIN QUERY PLAN " + sql, params))
        assert f"USING INDEX {RUNS_INDEX} (job_id=? AND started_at<?)" in plan, plan
