"""Focal wake-ups fire once across processes on PostgreSQL: several job stores, each on its
own connection and writer as separate runtimes would be, race to fire the same due jobs.
(Cron across processes: tests/test_cron_pg.py.)"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import Runtime, Turn, focal_schedule
from kinbox.actors.focal import FOCAL_ID
from kinbox.actors.focal_schedule import next_after
from kinbox.persistence import JobRecord, JobStore, TaskChange, open_database

from .conftest import Stores
from .helpers import wait_for

pytestmark = pytest.mark.postgres
RACERS = 3
JOBS = 20


@pytest.mark.timeout(60)
def test_every_due_wakeup_fires_once_when_three_stores_race_on_postgres(pg_url: str) -> None:
    stores = [Stores(pg_url) for _ in range(RACERS)]
    try:
        jobs = [JobStore(s.tables, s.writer) for s in stores]
        for i in range(JOBS):  # one-shot wake-ups, all due at 10
            jobs[0].create(JobRecord(f"j{i}", FOCAL_ID, "reminder", "", None, None, 10, 10,
                                     None, True, 0))
        fired: Counter[str] = Counter()
        lock = threading.Lock()
        barrier = threading.Barrier(RACERS)

        def on_fire(job: JobRecord, now: float) -> None:
            with lock:
                fired[job.id] += 1

        def race(store: JobStore) -> None:
            barrier.wait()
            for now in (11, 12, 13):  # and again later: a fired one-shot never fires twice
                store.fire_due(now, next_after, on_fire)

        threads = [threading.Thread(target=race, args=(j,)) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert fired == Counter({f"j{i}": 1 for i in range(JOBS)})
    finally:
        for s in stores:
            s.close()


@pytest.mark.timeout(60)
def test_a_wakeup_fires_after_the_process_that_scheduled_it_has_stopped(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wake-up armed only in its own process's APScheduler was never fired by the others:
    they read the table at their start only. Each now polls it (every 15 s; 0.2 here)."""
    monkeypatch.setattr(focal_schedule, "POLL_SECONDS", 0.2)
    woken = threading.Event()

    def brain(turn: Turn) -> None:
        if any(m.kind == "focal_wakeup" for m in turn.messages):
            woken.set()

    with Runtime(db=pg_url, brain=brain):  # the process that stays
        leaving = Runtime(db=pg_url, brain=brain).start()
        leaving.get_or_create_focal_chat()
        leaving.focal.schedule.schedule_wakeup(FOCAL_ID, "reminder",
                                               at=leaving.context.now() + 1.0, note="deploy")
        leaving.stop()
        assert woken.wait(30), "no process fired the wake-up"


@pytest.mark.timeout(60)
def test_two_runtimes_closing_a_sessions_last_two_tasks_at_once_tell_focal_it_finished(
        make_runtime: Callable[..., Runtime], pg_url: str) -> None:
    """Runtime A completes one of a Focal-started session's two tasks while runtime B
    completes the other. Each change counted the open tasks left with the other's
    uncommitted (READ COMMITTED): each saw one left, neither closed the session, and Focal
    never heard that it finished. A change of a session's tasks now waits for another's
    in flight, and counts after it."""
    a, b = make_runtime(db=pg_url, brain=lambda turn: None), make_runtime(db=pg_url)
    a.get_or_create_focal_chat()
    out = a.tools_for(FOCAL_ID).agent_send(agent_id="new", project_id=a.create_project("p").id,
                                           title="Fix", task_title="one", message="go")
    sid, first = out["agent_id"], out["task_id"]
    a.run_until_idle()  # Focal's request answered (a finish is held back while in flight)
    assert [r["status"] for r in a.inbox(target=sid)] == ["delivered"]
    second = a.tools_for(sid).task_create("two", status="in_progress")["task_id"]
    inside, release = threading.Event(), threading.Event()

    def hold(ctx: Any, change: TaskChange) -> list[Any]:  # A's change, in its transaction
        if change.after.id == first:
            inside.set()
            assert release.wait(30)
        return []
    a.context.task_hooks.append(hold)
    done: dict[str, Any] = {}

    def complete(rt: Runtime, task_id: str) -> None:
        done[task_id] = rt.tools_for(sid).task_update(task_id, status="completed")
    racers = [threading.Thread(target=complete, args=(a, first))]
    racers[0].start()
    assert inside.wait(30)
    racers.append(threading.Thread(target=complete, args=(b, second)))
    racers[1].start()
    db = open_database(pg_url)
    try:  # B has committed, or waits for A's transaction
        wait_for(lambda: second in done or db.execute_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event IN ('transactionid', 'tuple') "
            "AND datname = current_database()").fetchone()[0] > 0, 30, "B to commit or wait")
    finally:
        db.close()
    release.set()
    for t in racers:
        t.join(30)
    assert done.keys() == {first, second}
    finished = [r for r in a.inbox(target=FOCAL_ID)
                if r["kind"] == "session_finished_notification"]
    assert len(finished) == 1, finished
