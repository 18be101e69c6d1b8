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

from kinbox.actors import KinboxError, ManualClock, Runtime, Turn
from kinbox.actors import cron_rules as rules
from kinbox.actors.serve import app_for

from .helpers import wait_for
from .test_http import Served

MakeRuntime = Callable[..., Runtime]
STATE = {"X-Kinbox": "1", "Content-Type": "application/json"}


class Holding:
    """A brain whose first turn holds until released."""

    def __init__(self) -> None:
        self.holding = threading.Event()
        self.release = threading.Event()
        self.turns = 0

    def __call__(self, turn: Turn) -> str:
        self.turns += 1
        if self.turns == 1:
            self.holding.set()
            self.release.wait(30)
        return "done"


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
