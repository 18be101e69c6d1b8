"""A job whose run is in progress is not removed: the run's result is not lost.

``rt.cron.remove`` (``DELETE /cron/jobs/{id}``, ``kinbox cron remove``) deleted the job's
runs with it, the one still running too. That run's turn then went on, and its commit,
fenced on the run's record, found none: the whole turn was undone, its reply and its
transcript lost, and the operator, answered "removed", never saw what the run said. A
removal is refused now while a run of the job is in progress on a live runtime
(:class:`CronRunInProgress`, 409 over HTTP), and nothing is written; once the run ended
(its result recorded), the removal goes through. A run whose runtime is gone (its lease
ran out) or that was handed back holds nothing: it goes with its job, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kinbox.actors import ManualClock, Runtime
from kinbox.actors import cron_rules as rules
from kinbox.actors.serve import app_for
from kinbox.persistence import Occurrence

from .helpers import Holding
from .test_http import Served

MakeRuntime = Callable[..., Runtime]
STATE = {"X-Kinbox": "1", "Content-Type": "application/json"}
LEASE = 30.0


@pytest.mark.timeout(90)
def test_a_job_whose_run_is_in_progress_is_not_removed_and_the_run_keeps_its_result(
        make_runtime: MakeRuntime, any_db_url: str) -> None:
    brain = Holding("the overnight summary")
    rt = make_runtime(brain=brain, db=any_db_url)
    job_id = str(rt.cron.add("digest", "0 0 1 1 *", "Summarize")["job_id"])
    rt.cron.trigger(job_id)
    assert brain.holding.wait(30)
    [running] = rt.cron.runs(job_id)
    try:
        with pytest.raises(rules.CronRunInProgress) as refused:
            rt.cron.remove(job_id)
    finally:
        brain.release.set()
    assert (refused.value.job_id, refused.value.run_id) == (job_id, running["run_id"])
    assert "remove" in str(refused.value)
    assert rt.cron.wait_idle(30)
    [run] = rt.cron.runs(job_id)
    assert (run["status"], run["result"]) == ("success", "the overnight summary")
    replies = [e.text for e in rt.transcript(f"cron-{job_id}") if e.role == "assistant"]
    assert replies == ["the overnight summary"]
    assert rt.cron.remove(job_id) == {"job_id": job_id, "removed": True}
    assert rt.cron.runs() == []


@pytest.mark.timeout(60)
def test_the_remove_route_answers_409_naming_the_run_in_progress(
        make_runtime: MakeRuntime, tmp_path: Path) -> None:
    brain = Holding("the overnight summary")
    rt = make_runtime(brain=brain, data_dir=tmp_path / "data")
    job_id = str(rt.cron.add("digest", "0 0 1 1 *", "Summarize")["job_id"])
    srv = Served(app_for(rt))
    try:
        assert srv.request("POST", f"/cron/jobs/{job_id}/trigger", STATE)[0] == 200
        assert brain.holding.wait(30)
        [running] = rt.cron.runs(job_id)
        status, got = srv.request("DELETE", f"/cron/jobs/{job_id}", STATE)
        assert (status, got["error"]) == (409, "conflict"), got
        assert running["run_id"] in got["message"]
        assert rt.cron.job(job_id)["job_id"] == job_id
    finally:
        brain.release.set()
    try:
        assert rt.cron.wait_idle(30)
        assert [r["status"] for r in rt.cron.runs(job_id)] == ["success"]
        assert srv.request("DELETE", f"/cron/jobs/{job_id}", STATE)[0] == 200
    finally:
        srv.close()


@pytest.mark.timeout(60)
def test_a_run_whose_runtime_is_gone_does_not_hold_its_job_back(
        any_db_url: str, clock: ManualClock) -> None:
    """A run left ``running`` by a runtime that died runs nowhere: refused while its lease
    lasts, the removal goes through once it ran out (the prompt that kills its worker at
    every run is the job an operator most wants gone, with no worker up)."""
    with Runtime(db=any_db_url, clock=clock) as rt:  # send-only: fires nothing itself
        job_id = str(rt.cron.add("tick", "* * * * *", "tick")["job_id"])
        store = rt.cron.store
        [run] = store.fire_due(clock.now() + 60, "a-runtime-now-gone", LEASE,
                               lambda job, running: Occurrence(
                                   {"next_run_at": clock.now() + 120}, "running"))
        with pytest.raises(rules.CronRunInProgress) as refused:
            rt.cron.remove(job_id)
        assert refused.value.run_id == run.id
        clock.advance(60 + LEASE + 1)  # its lease ran out: its runtime is gone
        assert rt.cron.remove(job_id)["removed"] is True
        assert rt.cron.runs() == []
