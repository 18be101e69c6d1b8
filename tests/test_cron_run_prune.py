"""A prune deletes old finished cron runs too, keeping each job's newest, on SQLite and
PostgreSQL.

``cron_runs`` was never pruned: an every-minute job added 525,600 rows a year, kept for
ever. A prune (``rt.prune``, ``kinbox inbox prune``) deletes the runs that finished
before its cutoff, in batches, except a job's newest few (what a run's reminder reads of
its job's last runs) and a run still ``running`` (leased, or to be taken over).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors.triggers import local_time
from kinbox.persistence import CronJobRecord, CronStore, PruneCounts

from .conftest import Stores
from .helpers import wait_for

pytestmark = pytest.mark.timeout(120)

T0 = 1000.0
CUTOFF = T0 + 50


def job(job_id: str) -> CronJobRecord:
    return CronJobRecord(job_id, job_id, "* * * * *", "UTC", "p", True, "none", 0, None,
                         None, None, None, T0, T0)


def add_runs(stores: Stores, job_id: str, starts: list[float], *,
             running: tuple[float, ...] = ()) -> None:
    """Finished runs of ``job_id`` (alternately success and error) started at ``starts``,
    those started at ``running`` still running."""
    rows = [{"id": f"{job_id}@{start:g}", "job_id": job_id, "scheduled_for": start,
             "started_at": start,
             "finished_at": None if start in running else start + 0.5,
             "status": "running" if start in running else ("success", "error")[k % 2],
             "owner": "w1" if start in running else None,
             "lease_until": start + 30 if start in running else None, "attempts": 1}
            for k, start in enumerate(starts)]
    stores.writer.call(lambda: stores.tables.cron_run.insert_many(rows).execute())


def run_ids(stores: Stores, job_id: str) -> list[str]:
    return sorted(r.id for r in CronStore(stores.tables, stores.writer).runs(job_id,
                                                                               limit=None))


def history(stores: Stores) -> None:
    """``busy``: 12 old runs (the one started at T0 + 3 still running: its lease ran out,
    it waits for a takeover) and 2 recent ones; ``rare``: 3 old runs, fewer than a job
    keeps."""
    crons = CronStore(stores.tables, stores.writer)
    crons.create(job("busy"))
    crons.create(job("rare"))
    add_runs(stores, "busy", [T0 + k for k in range(12)] + [T0 + 100, T0 + 101],
             running=(T0 + 3,))
    add_runs(stores, "rare", [T0, T0 + 1, T0 + 2])


KEPT_BUSY = sorted(["busy@1003", "busy@1009", "busy@1010", "busy@1011", "busy@1100",
                    "busy@1101"])


def test_a_prune_deletes_old_finished_runs_but_each_jobs_newest_and_the_running(
        stores: Stores) -> None:
    history(stores)
    counts = stores.journal.prune(CUTOFF)
    # The five newest of busy (two recent, three old), its running one, all of rare.
    assert run_ids(stores, "busy") == KEPT_BUSY
    assert run_ids(stores, "rare") == ["rare@1000", "rare@1001", "rare@1002"]
    assert counts == PruneCounts(cron_runs=8)
    assert stores.journal.prune(CUTOFF) == PruneCounts()


def test_a_dry_run_counts_the_runs_and_deletes_none(stores: Stores) -> None:
    history(stores)
    before = run_ids(stores, "busy")
    assert stores.journal.prune(CUTOFF, dry_run=True) == PruneCounts(cron_runs=8)
    assert run_ids(stores, "busy") == before
    assert stores.journal.prune(CUTOFF) == PruneCounts(cron_runs=8)


def test_runs_go_in_batches_of_the_prunes_bound(stores: Stores) -> None:
    history(stores)
    steps = [step.cron_runs for step in stores.journal.prune_steps(CUTOFF, batch=3)]
    assert sum(steps) == 8 and max(steps) == 3, steps
    assert run_ids(stores, "busy") == KEPT_BUSY


DAY = 86400.0


def run_every_minute(rt: Runtime, clock: ManualClock, times: int) -> str:
    """An every-minute job run ``times`` times, then paused; its id."""
    job_id = str(rt.cron.add("tick", "* * * * *", "Say the time.")["job_id"])
    for _ in range(times):
        clock.advance(60 - clock.now() % 60)
        rt.run_until_idle(timeout=20)
        assert rt.cron.wait_idle(20)
    wait_for(lambda: [r["status"] for r in rt.cron.runs(job_id)] == ["success"] * times, 20,
             "every run recorded")
    rt.cron.pause(job_id)
    return job_id


def test_rt_prune_counts_the_runs_and_keeps_what_the_next_reminder_reads(
        make_runtime: Callable[..., Runtime], clock: ManualClock) -> None:
    reminders: list[str] = []

    def brain(turn: Turn) -> None:
        reminders.append(turn.messages[0].content)
        turn.reply("ok")

    rt = make_runtime(brain=brain)
    job_id = run_every_minute(rt, clock, 8)
    last = rt.cron.runs(job_id)[0]["started_at"]
    clock.advance(3 * DAY)
    assert rt.prune(2 * DAY, dry_run=True) == {"rows": 0, "markers": 0, "events": 0,
                                               "cron_runs": 3}
    assert len(rt.cron.runs(job_id)) == 8
    assert rt.prune(2 * DAY) == {"rows": 0, "markers": 0, "events": 0, "cron_runs": 3}
    assert len(rt.cron.runs(job_id)) == 5
    rt.cron.resume(job_id)
    clock.advance(60 - clock.now() % 60)
    wait_for(lambda: len(reminders) == 9, 20, "the next run")
    assert f"Last run: {local_time(last, 'UTC')}." in reminders[-1]


def test_a_runtimes_retention_prunes_old_runs_on_its_tick(
        make_runtime: Callable[..., Runtime], clock: ManualClock) -> None:
    rt = make_runtime(brain=lambda turn: turn.reply("ok"), retention=2 * DAY)
    job_id = run_every_minute(rt, clock, 7)
    clock.advance(3 * DAY)
    wait_for(lambda: len(rt.cron.runs(job_id)) == 5, 20, "the retention's pass")
