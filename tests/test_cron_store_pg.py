"""The cron tables shared by two runtimes on one PostgreSQL: what one commits holds against
what the other is committing at the same moment."""

from __future__ import annotations

import threading

import pytest

from kinbox.persistence import CronJobRecord, CronStore, Occurrence, Removal

from .conftest import Stores
from .helpers import wait_for


def waiting_on_a_lock(url: str) -> bool:
    """Is a backend of the test's database waiting for a row lock?"""
    import psycopg2

    con = psycopg2.connect(url)
    try:
        with con.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND wait_event_type = 'Lock'")
            return bool(cur.fetchone()[0])
    finally:
        con.close()


@pytest.mark.timeout(60)
def test_a_pause_committed_while_another_runtime_records_a_failed_run_holds(
        pg_url: str) -> None:
    """Runtime A records its run's failure: it read the job, then wrote the retry's
    changes (active, the retry's next time) over whatever the row held. An operator's
    pause that runtime B committed in between was overwritten, and the paused job ran
    again at the retry. A reads the job locked now: the pause waits for A's write and then
    holds (the job's failure is recorded, its schedule stays paused)."""
    a, b = Stores(pg_url), Stores(pg_url)
    try:
        jobs_a, jobs_b = CronStore(a.tables, a.writer), CronStore(b.tables, b.writer)
        jobs_a.create(CronJobRecord("job-p", "nightly", "0 3 * * *", "UTC", "check", True,
                                    "none", 0, 100.0, None, None, None, 0.0, 0.0))
        runs = jobs_a.fire_due(100.0, "owner-a", 30.0, lambda job, running: Occurrence(
            {"next_run_at": 200.0}, "running"))
        assert [r.status for r in runs] == ["running"]
        pause = threading.Thread(target=lambda: jobs_b.update(
            "job-p", 120.0, active=False, next_run_at=None))

        def retry(job: CronJobRecord) -> dict[str, object]:
            pause.start()  # B pauses the job while A's transaction holds what it read
            wait_for(lambda: not pause.is_alive() or waiting_on_a_lock(pg_url), 10,
                     "the pause to commit or to wait for A's lock")
            if not job.active:  # as the cron service's rule: a paused job is not resumed
                return {"retry_count": job.retry_count + 1}
            return {"retry_count": job.retry_count + 1, "active": True, "next_run_at": 160.0}

        jobs_a.finish(runs[0].id, "owner-a", 110.0, "error", error="boom", job_changes=retry)
        pause.join(10)
        assert not pause.is_alive()
        job = jobs_b.get("job-p")
        assert job is not None
        assert (job.active, job.next_run_at, job.retry_count) == (False, None, 1)
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("removed_at", [110.0, 200.0], ids=["run live", "lease ran out"])
def test_a_job_removed_while_another_runtime_fires_it_leaves_no_run_behind(
        pg_url: str, removed_at: float) -> None:
    """Runtime A fires the job (its UPDATE and its run's INSERT, uncommitted) while an
    operator removes it through B. B deleted the job's runs first (A's was not committed
    yet, so none), then waited for A's lock on the job and deleted it: A's run was left
    ``running`` with no job, taken over and dropped at every lease's end for ever (its
    turn finds no job and never finishes it). The runs are read again after A committed:
    A's run, live, undoes the removal (removed, its result was lost); a run whose lease
    ran out by the removal's time goes with its job."""
    a, b = Stores(pg_url), Stores(pg_url)
    try:
        jobs_a, jobs_b = CronStore(a.tables, a.writer), CronStore(b.tables, b.writer)
        for job_id in ("job-a", "job-b"):  # fired in id order, in one transaction
            jobs_a.create(CronJobRecord(job_id, "nightly", "0 3 * * *", "UTC", "check", True,
                                        "none", 0, 100.0, None, None, None, 0.0, 0.0))
        removal: list[Removal] = []
        remove = threading.Thread(
            target=lambda: removal.append(jobs_b.delete("job-a", removed_at)))

        def decide(job: CronJobRecord, _running: object) -> Occurrence:
            if job.id == "job-b":  # job-a's run is inserted, not committed
                remove.start()
                wait_for(lambda: not remove.is_alive() or waiting_on_a_lock(pg_url), 10,
                         "the removal to commit or to wait for A's lock")
            return Occurrence({"next_run_at": 200.0}, "running")

        runs = jobs_a.fire_due(100.0, "owner-a", 30.0, decide)
        remove.join(10)
        assert not remove.is_alive()
        assert sorted(r.job_id for r in runs) == ["job-a", "job-b"]
        run_a = next(r for r in runs if r.job_id == "job-a")
        if removed_at < run_a.lease_until:  # the run is live: nothing removed
            assert removal == [Removal(False, run_a.id)]
            assert jobs_b.get("job-a") is not None
            assert sorted(r.job_id for r in jobs_b.runs()) == ["job-a", "job-b"]
        else:
            assert removal == [Removal(True, None)]
            assert jobs_b.get("job-a") is None
            assert [r.job_id for r in jobs_b.runs()] == ["job-b"]  # none of the removed job
    finally:
        a.close()
        b.close()
