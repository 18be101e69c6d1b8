"""Focal's limit of 20 wake-ups holds across processes on PostgreSQL (FO7).

The limit is checked in the transaction that inserts the wake-up (``JobStore.create_now``):
a count of Focal's active wake-ups, then the insert. On SQLite every process's writes are
serial (``BEGIN IMMEDIATE``). On PostgreSQL, under READ COMMITTED, two processes admitting
at once each counted 19 (neither saw the other's uncommitted row) and both inserted: 21.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from kinbox.actors import ManualClock, Runtime, ToolError
from kinbox.actors.focal import FOCAL_ID
from kinbox.actors.focal_heartbeat_job import HEARTBEAT_JOB
from kinbox.actors.focal_schedule import MAX_WAKEUPS, WAKEUP_KINDS
from kinbox.persistence import JobRecord, JobStore

from .conftest import Stores
from .helpers import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]


def wakeup(job_id: str) -> JobRecord:
    return JobRecord(job_id, FOCAL_ID, "reminder", "", None, None, 5000.0, 5000.0, None, True,
                     0.0)


def active_wakeups(jobs: JobStore) -> int:
    return len([j for j in jobs.active(FOCAL_ID) if j.kind in WAKEUP_KINDS])


def waiting_on_a_lock(url: str) -> bool:
    """Does a session of this database wait for a lock (another transaction's row)?"""
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND wait_event_type = 'Lock'")
            row = cur.fetchone()
            return row is not None and row[0] > 0
    finally:
        conn.close()


def test_two_processes_admitting_the_twentieth_wake_up_at_once_admit_one(pg_url: str) -> None:
    """Deterministic: A's admission counts 19 and inserts, and holds its transaction open;
    B's admission runs meanwhile. B must wait for A (and then count 20), not admit too."""
    a, b = Stores(pg_url), Stores(pg_url)
    try:
        a.store.ensure_project("suzent-focal", "suzent-focal", "Focal", 0.0, hidden=True)
        a.store.create_session(FOCAL_ID, "suzent-focal", "SUZENT", "focal", 0.0)
        jobs_a, jobs_b = JobStore(a.tables, a.writer), JobStore(b.tables, b.writer)
        for i in range(MAX_WAKEUPS - 1):
            assert jobs_a.create(wakeup(f"w{i}"), limit_kinds=WAKEUP_KINDS,
                                 limit=MAX_WAKEUPS) is not None
        inside, go = threading.Event(), threading.Event()

        def a_holds_its_transaction() -> JobRecord | None:
            admitted = jobs_a.create_now(wakeup("from-a"), limit_kinds=WAKEUP_KINDS,
                                         limit=MAX_WAKEUPS)
            inside.set()
            assert go.wait(30)
            return admitted

        from_a = a.writer.submit(a_holds_its_transaction)
        assert inside.wait(10)
        with ThreadPoolExecutor(1) as pool:
            from_b = pool.submit(jobs_b.create, wakeup("from-b"), limit_kinds=WAKEUP_KINDS,
                                 limit=MAX_WAKEUPS)
            # B either admitted already (the race) or waits for A's lock (the fix).
            wait_for(lambda: from_b.done() or waiting_on_a_lock(pg_url), 10,
                     "B's admission to end or to wait for A's")
            go.set()
            admitted = [from_a.result(10), from_b.result(10)]
        assert [r is not None for r in admitted] == [True, False]
        assert active_wakeups(jobs_a) == MAX_WAKEUPS
    finally:
        go.set()
        a.close()
        b.close()


def test_two_runtimes_scheduling_at_once_never_hold_more_than_the_limit(
        pg_url: str, tmp_path: object) -> None:
    """Through two runtimes on one database: 2 x 15 schedule_wakeup calls at once, from
    threads of both; exactly 20 are admitted, the other 10 are refused with the limit's
    error, and Focal holds 20 wake-ups."""
    clock = ManualClock(1000.0)
    with Runtime(db=pg_url, clock=clock) as one, Runtime(db=pg_url, clock=clock) as two:
        one.get_or_create_focal_chat()
        barrier = threading.Barrier(6)

        def schedule(rt: Runtime, start: int) -> list[bool]:
            tools = rt.tools_for(FOCAL_ID)
            barrier.wait(10)
            outcomes = []
            for i in range(start, start + 5):
                try:
                    tools.schedule_wakeup("reminder", at=5000.0 + i)
                    outcomes.append(True)
                except ToolError as exc:
                    assert exc.code == "execution_failed"
                    outcomes.append(False)
            return outcomes

        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(schedule, rt, 5 * k)
                       for k, rt in enumerate([one, two, one, two, one, two])]
            outcomes = [o for f in futures for o in f.result(30)]
        assert outcomes.count(True) == MAX_WAKEUPS and outcomes.count(False) == 10
        assert len(one.focal.panel()["wakeups"]) == MAX_WAKEUPS


def test_two_runtimes_opening_focal_for_the_first_time_at_once_both_get_it(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes' first ``get_or_create_focal_chat`` at once (two servers' ``GET
    /focal``): both read the chat before either marked its heartbeat made, and both read
    no heartbeat job before either inserted it. The chat's creation took that race into
    account; the heartbeat's did not: the second insert's DuplicateError came out of
    ``get_or_create_focal_chat``. The interleaving is forced by two barriers."""
    clock = ManualClock(1000.0)
    with Runtime(db=pg_url, clock=clock, data_dir=tmp_path / "one") as one, \
            Runtime(db=pg_url, clock=clock, data_dir=tmp_path / "two") as two:
        both_read_the_chat, both_read_no_job = threading.Barrier(2), threading.Barrier(2)
        for rt in (one, two):
            store, jobs = rt.context.store, rt.focal.schedule.jobs

            def patch_config(session_id: str, patch: dict[str, Any], now: float,
                             real: Callable[..., None] = store.patch_config) -> None:
                if "focal_heartbeat_initialized" in patch:
                    both_read_the_chat.wait(10)
                real(session_id, patch, now)

            def get(job_id: str, real: Callable[[str], JobRecord | None] = jobs.get
                    ) -> JobRecord | None:
                found = real(job_id)
                if job_id == HEARTBEAT_JOB:
                    both_read_no_job.wait(10)
                return found

            monkeypatch.setattr(store, "patch_config", patch_config)
            monkeypatch.setattr(jobs, "get", get)
        with ThreadPoolExecutor(2) as pool:
            opened = [pool.submit(rt.get_or_create_focal_chat) for rt in (one, two)]
            chats = [f.result(30) for f in opened]
        assert [c.id for c in chats] == [FOCAL_ID, FOCAL_ID]
        assert [j.id for j in one.focal.schedule.jobs.active()] == [HEARTBEAT_JOB]
