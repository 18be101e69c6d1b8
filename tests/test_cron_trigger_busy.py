"""A trigger of a job whose run is in progress is refused, clearly, and loses nothing.

``rt.cron.trigger`` (``POST /cron/jobs/{id}/trigger``, ``kinbox cron trigger``) of a job
whose run was still running answered "triggered" (200), and the job's next look recorded
the trigger as an error run, ``Previous cron run is still active``: the operator was told
the job would run, it never did, and the error counted among the job's runs. It is refused
now (:class:`CronRunInProgress`, 409 over HTTP) with the run in progress named, and nothing
is written: no error run, the job's schedule as it was.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from kinbox.actors import KinboxError, ManualClock, Runtime
from kinbox.actors import cron_rules as rules
from kinbox.actors.serve import app_for

from .helpers import Holding, wait_for
from .test_http import Served

MakeRuntime = Callable[..., Runtime]
STATE = {"X-Kinbox": "1", "Content-Type": "application/json"}


@pytest.mark.timeout(60)
def test_a_trigger_while_the_run_is_in_progress_is_refused_and_writes_nothing(
        make_runtime: MakeRuntime, clock: ManualClock, any_db_url: str) -> None:
    brain = Holding()
    rt = make_runtime(brain=brain, db=any_db_url)
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "Happy new year")["job_id"])
    rt.cron.trigger(job_id)
    assert brain.holding.wait(30)
    [running] = rt.cron.runs(job_id)
    before = rt.cron.job(job_id)
    clock.advance(1)
    try:
        with pytest.raises(rules.CronRunInProgress) as refused:
            rt.cron.trigger(job_id)
    finally:
        brain.release.set()
    assert isinstance(refused.value, rules.CronError) and isinstance(refused.value, KinboxError)
    assert (refused.value.job_id, refused.value.run_id) == (job_id, running["run_id"])
    after = rt.cron.job(job_id)
    assert (after["next_run_at"], after["triggered_at"]) == (
        before["next_run_at"], before["triggered_at"])
    wait_for(lambda: [r["status"] for r in rt.cron.runs(job_id)] == ["success"], 30,
             "the run in progress to end, and no other run recorded")
    rt.cron.trigger(job_id)  # once it ended, a trigger runs the job again
    rt.run_until_idle()
    assert rt.cron.wait_idle(30)
    assert [r["status"] for r in rt.cron.runs(job_id)] == ["success", "success"]
    assert brain.turns == 2


@pytest.mark.timeout(60)
def test_the_trigger_route_answers_409_naming_the_run_in_progress(
        make_runtime: MakeRuntime, tmp_path: Path) -> None:
    brain = Holding()
    rt = make_runtime(brain=brain, data_dir=tmp_path / "data")
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "Happy new year")["job_id"])
    srv = Served(app_for(rt))
    try:
        status, _ = srv.request("POST", f"/cron/jobs/{job_id}/trigger", STATE)
        assert status == 200
        assert brain.holding.wait(30)
        [running] = rt.cron.runs(job_id)
        status, got = srv.request("POST", f"/cron/jobs/{job_id}/trigger", STATE)
        assert (status, got["error"]) == (409, "conflict"), got
        assert running["run_id"] in got["message"]
        assert [r["status"] for r in rt.cron.runs(job_id)] == ["running"]
    finally:
        brain.release.set()
        srv.close()
    assert rt.cron.wait_idle(30)
    assert [r["status"] for r in rt.cron.runs(job_id)] == ["success"]


@pytest.mark.timeout(60)
def test_a_trigger_that_meets_a_fire_committing_meanwhile_is_refused_on_postgres(
        make_runtime: MakeRuntime, pg_url: str) -> None:
    """The trigger's look found no run; the write then waited for another runtime's fire
    of the job (its row locked until that fire, with its run, committed). PostgreSQL
    re-checked the job row alone, not the runs as they were once the wait ended: the
    trigger was written, answered "triggered", and became the "still active" error run."""
    import psycopg2

    rt = make_runtime(db=pg_url)  # send-only: it fires nothing itself
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "Happy new year")["job_id"])
    firing = psycopg2.connect(pg_url)  # another runtime's fire, held open
    watch = psycopg2.connect(pg_url)
    watch.autocommit = True
    outcome: list[object] = []
    try:
        with firing.cursor() as cur:
            cur.execute("UPDATE cron_jobs SET next_run_at = next_run_at + 60 WHERE id = %s",
                        (job_id,))
            cur.execute("INSERT INTO cron_runs (id, job_id, scheduled_for, started_at, status, "
                        "owner, lease_until, attempts, takeovers) VALUES (%s, %s, 0, 0, "
                        "'running', 'other-runtime', 1e12, 1, 0)", (f"{job_id}@0", job_id))

        def trigger() -> None:
            try:
                outcome.append(rt.cron.trigger(job_id))
            except Exception as exc:  # the test reads which
                outcome.append(exc)

        thread = threading.Thread(target=trigger, daemon=True)
        thread.start()

        def waiting_for_the_fire() -> bool:
            with watch.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND wait_event_type = 'Lock'")
                return bool(cur.fetchone()[0])
        wait_for(waiting_for_the_fire, 30, "the trigger's write to wait for the fire")
        firing.commit()
        thread.join(30)
    finally:
        firing.close()
        watch.close()
    assert len(outcome) == 1 and isinstance(outcome[0], rules.CronRunInProgress), outcome
    assert rt.cron.job(job_id)["triggered_at"] is None


def test_a_refusal_without_a_run_to_name_names_none() -> None:
    """Runs kept starting and ending through every try: ``run_id`` held the sentence "one
    that started and ended meanwhile" where callers read a run's id."""
    named = rules.CronRunInProgress("cj_a", "cj_a@60")
    unnamed = rules.CronRunInProgress("cj_a", None)
    assert (named.run_id, unnamed.run_id) == ("cj_a@60", None)
    assert "'cj_a@60'" in str(named) and "()" not in str(unnamed) and "None" not in str(unnamed)


@pytest.mark.timeout(60)
def test_a_retried_keyed_trigger_runs_the_job_once(
        make_runtime: MakeRuntime, clock: ManualClock, tmp_path: Path) -> None:
    """A client whose trigger's answer was lost tries again: while the run it started was
    in progress the retry was refused (409, read as "failed"), and once it had ended the
    retry ran the job a second time. With an ``Idempotency-Key`` the retry answers the job
    as it is and runs nothing again; another key triggers anew."""
    brain = Holding()
    rt = make_runtime(brain=brain, data_dir=tmp_path / "data")
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "Happy new year")["job_id"])
    srv = Served(app_for(rt))
    keyed = {**STATE, "Idempotency-Key": "trigger-1"}
    path = f"/cron/jobs/{job_id}/trigger"
    try:
        status, first = srv.request("POST", path, keyed)
        assert status == 200, first
        assert brain.holding.wait(30)
        status, again = srv.request("POST", path, keyed)  # its run in progress
        assert status == 200 and again["job_id"] == job_id, again
        assert "idempotency_key" not in again and "trigger_key" not in again
        brain.release.set()
        wait_for(lambda: [r["status"] for r in rt.cron.runs(job_id)] == ["success"], 30,
                 "the run to end")
        status, late = srv.request("POST", path, keyed)  # after it ended
        assert status == 200, late
        assert rt.cron.wait_idle(30)
        assert [r["status"] for r in rt.cron.runs(job_id)] == ["success"]
        clock.advance(1)  # a trigger's run is the occurrence of its time: a time of its own
        status, _ = srv.request("POST", path, {**STATE, "Idempotency-Key": "trigger-2"})
        assert status == 200
        wait_for(lambda: [r["status"] for r in rt.cron.runs(job_id)] == ["success"] * 2, 30,
                 "the second key's run")
        status, got = srv.request("POST", path, {**STATE, "Idempotency-Key": ""})
        assert (status, got["field"]) == (422, "idempotency_key"), got
    finally:
        brain.release.set()
        srv.close()
    assert brain.turns == 2
