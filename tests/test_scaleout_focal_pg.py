"""Focal wake-ups fire once across processes on PostgreSQL: several job stores, each on its
own connection and writer as separate runtimes would be, race to fire the same due jobs.
(Cron across processes: tests/test_cron_pg.py.)"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from kinbox.actors import Runtime, Turn, focal_schedule
from kinbox.actors.focal import FOCAL_ID
from kinbox.actors.focal_schedule import next_after
from kinbox.persistence import JobRecord, JobStore

from .conftest import Stores

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
