"""Cron's reads are bounded and its looks write only when something moves (C1, C2).

Every tick (each job time, each 15 s poll, each move of an injected clock) looks at the
jobs for one due and at the runs for one whose lease ran out. Both looks queued a writer
transaction even when nothing was due: on SQLite the database's write lock, on
PostgreSQL a transaction, taken for nothing at every tick of every runtime. And the job
listings read every job into memory, however many there were.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kinbox.actors import ManualClock, Runtime
from kinbox.persistence import (
    CronJobRecord,
    CronRunRecord,
    CronStore,
    JobRecord,
    JobStore,
    Occurrence,
)
from kinbox.persistence import cron_store as cron_store_module

from .conftest import Stores, ids_read

pytestmark = pytest.mark.timeout(60)

MakeRuntime = Callable[..., Runtime]
NOW = 1_700_000_040.0


def job(job_id: str, next_run_at: float | None, *, active: bool = True) -> CronJobRecord:
    return CronJobRecord(job_id, job_id, "* * * * *", "UTC", "p", active, "none", 0,
                         next_run_at, None, None, None, NOW, NOW)


def operations(stores: Stores) -> int:
    return stores.writer.statistics().operations


def running(_job: CronJobRecord, _run: CronRunRecord | None) -> Occurrence:
    return Occurrence({"next_run_at": NOW + 3600}, "running")


def test_looks_with_nothing_due_queue_no_writer_transaction(stores: Stores) -> None:
    crons = CronStore(stores.tables, stores.writer)
    crons.create(job("later", NOW + 60))
    crons.create(job("paused", NOW - 60, active=False))
    crons.create(job("soon", NOW + 1))
    # A live run: its lease runs until NOW + 30.
    assert [r.job_id for r in crons.fire_due(NOW + 1, "me", 29, running)] == ["soon"]
    before = stores.writer.statistics()
    for i in range(20):
        now = NOW + 2 + i
        assert crons.fire_due(now, "me", 30, running) == []
        assert crons.take_over(now, "other", 30) == []
    after = stores.writer.statistics()
    assert (after.batches, after.operations) == (before.batches, before.operations)
    # And when something is due, the look still writes: a job, then a lapsed lease.
    assert [r.job_id for r in crons.fire_due(NOW + 60, "me", 30, running)] == ["later"]
    assert [r.job_id for r in crons.take_over(NOW + 31, "other", 30)] == ["soon"]
    assert operations(stores) == before.operations + 2


def test_a_runtime_s_ticks_with_nothing_due_leave_the_writer_alone(
        any_db_url: str, clock: ManualClock) -> None:
    """Through the runtime, on each backend: ``rt.cron.tick()`` with a job due next hour
    and none running queues nothing."""
    with Runtime(db=any_db_url, brain=lambda turn: "ok", clock=clock) as rt:
        rt.cron.add("hourly", "0 * * * *", "Look around.")
        rt.run_until_idle()
        before = rt.statistics()["writer"]
        for _ in range(10):
            assert rt.cron.tick() == []
        after = rt.statistics()["writer"]
        assert (after["batches"], after["operations"]) == (before["batches"],
                                                           before["operations"])


def test_focal_s_schedule_looks_with_nothing_due_write_nothing_either(stores: Stores) -> None:
    """Focal's wake-ups fire through the same compare-and-set, at every tick too."""
    jobs = JobStore(stores.tables, stores.writer)
    jobs.create(JobRecord("wake", "focal-x", "reminder", "n", None, None, NOW + 60, NOW + 60,
                          None, True, NOW))
    before = operations(stores)
    for i in range(10):
        assert jobs.fire_due(NOW + i, lambda _job, _now: None, lambda _job, _now: None) == []
    assert operations(stores) == before
    fired = jobs.fire_due(NOW + 60, lambda _job, _now: None, lambda _job, _now: None)
    assert [j.id for j in fired] == ["wake"] and operations(stores) == before + 1


def test_a_tick_arms_the_soonest_job_without_reading_every_job(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """After each tick APScheduler is armed for what is due next: it read every active job
    (and armed one wake-up for each) at every tick and poll, however many there were. The
    soonest one is enough: its wake-up's tick arms the next, and the poll finds what other
    processes changed."""
    with Runtime(db=db_url, brain=lambda turn: "ok") as rt:  # the system clock: APScheduler
        crons = rt.cron.store
        far = rt.context.now() + 86400
        for i in range(40):
            crons.create(job(f"c{i:02d}", far + 60 * (40 - i)))
        built = ids_read(monkeypatch, cron_store_module, "_job")
        assert rt.cron.tick() == []
        assert len(built) <= 1, built
        armed = [j.next_run_time.timestamp() for j in rt.cron._driver._scheduler.get_jobs()
                 if j.id != "poll"]
        assert min(armed) == pytest.approx(far + 60, abs=0.01)  # c39, the soonest
