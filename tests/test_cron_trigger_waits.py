"""A cron job triggered while no runtime with a brain is up runs when one comes up.

``kinbox cron trigger`` (or ``POST /cron/jobs/{id}/trigger`` on a send-only
``kinbox serve``) makes the job due now, and its run waits for a delivering process.
A worker that came up more than an hour (the grace time) after the trigger judged it
an occurrence missed during downtime and skipped it: no run, no error, the job moved
on to its next regular time, and the run the operator asked for never happened.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors import cron_rules as rules

START = 1_767_258_000.0  # 2026-01-01 09:00 UTC


def pong(turn: Turn) -> str:
    return "pong"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("late", [30 * 60.0, 2 * 3600.0, 3 * 86400.0],
                         ids=["half-an-hour", "two-hours", "three-days"])
def test_a_trigger_runs_however_late_the_delivering_runtime_comes(tmp_path: Path,
                                                                   late: float) -> None:
    db = f"sqlite:///{tmp_path / 'kinbox.db'}"
    clock = ManualClock(START)
    with Runtime(db=db, clock=clock) as send_only:  # kinbox serve, without --brain
        job_id = str(send_only.cron.add("yearly", "0 0 1 1 *", "ping")["job_id"])
        regular = send_only.cron.job(job_id)["next_run_at"]
        send_only.cron.trigger(job_id)
    clock.advance(late)
    with Runtime(db=db, brain=pong, clock=clock) as worker:  # its start looks at the jobs
        assert worker.cron.wait_idle(30)
        runs = worker.cron.runs(job_id)
        job = worker.cron.job(job_id)
    assert [(r["status"], r["result"]) for r in runs] == [("success", "pong")]
    assert job["next_run_at"] == regular  # and the schedule goes on as before


@pytest.mark.timeout(10)
def test_a_trigger_is_never_an_occurrence_missed() -> None:
    """The rule: a due time an operator asked for runs however late; a regular one (and
    a retry) past the grace time is still skipped."""
    asked = rules.on_due(100, 10_000, next_regular=20_000, previous_active=False, grace=60,
                         asked=True)
    regular = rules.on_due(100, 10_000, next_regular=20_000, previous_active=False, grace=60)
    assert (asked.due, regular.due) == (rules.Due.RUN, rules.Due.MISSED)
    busy = rules.on_due(100, 10_000, next_regular=20_000, previous_active=True, grace=60,
                        asked=True)
    assert busy.due is rules.Due.PREVIOUS_ACTIVE


@pytest.mark.timeout(90)
def test_a_trigger_of_a_job_waiting_to_retry_runs_however_late(tmp_path: Path) -> None:
    """A job whose run failed waits for its retry; the operator triggers it and the
    runtime with a brain comes two hours later. Told apart from the schedule's own times
    by the retry count, the trigger was taken for the retry, missed, and skipped."""
    db = f"sqlite:///{tmp_path / 'kinbox.db'}"
    clock = ManualClock(START)

    def failing(turn: Turn) -> str:
        raise RuntimeError("the model is down")

    with Runtime(db=db, brain=failing, clock=clock) as first:
        job_id = str(first.cron.add("yearly", "0 0 1 1 *", "ping")["job_id"])
        first.cron.trigger(job_id)
        assert first.cron.wait_idle(30)
        waiting = first.cron.job(job_id)
    assert waiting["retry_count"] > 0 and waiting["next_run_at"] > START + 10
    clock.advance(10)  # the retry still waits
    with Runtime(db=db, clock=clock) as send_only:
        send_only.cron.trigger(job_id)
    clock.advance(2 * 3600.0)
    with Runtime(db=db, brain=pong, clock=clock) as worker:
        assert worker.cron.wait_idle(30)
        runs = worker.cron.runs(job_id)
        job = worker.cron.job(job_id)
    assert [r["status"] for r in runs] == ["success", "error"]
    assert (job["triggered_at"], job["retry_count"]) == (None, 0)


@pytest.mark.timeout(60)
def test_a_resume_of_an_active_job_keeps_the_trigger_that_waits(tmp_path: Path) -> None:
    """``resume`` resets an active job's retries (an operator's "start afresh"): it also
    dropped the trigger that waited for a delivering runtime, answered "resumed", and the
    run asked for never happened. A paused job has no trigger (a pause drops it, and a
    paused job cannot be triggered); an active one keeps its own."""
    db = f"sqlite:///{tmp_path / 'kinbox.db'}"
    clock = ManualClock(START)
    with Runtime(db=db, clock=clock) as send_only:
        job_id = str(send_only.cron.add("yearly", "0 0 1 1 *", "ping")["job_id"])
        regular = send_only.cron.job(job_id)["next_run_at"]
        send_only.cron.trigger(job_id)
        clock.advance(5)
        resumed = send_only.cron.resume(job_id)
    assert (resumed["triggered_at"], resumed["next_run_at"]) == (START, START)
    clock.advance(5)
    with Runtime(db=db, brain=pong, clock=clock) as worker:
        assert worker.cron.wait_idle(30)
        runs = worker.cron.runs(job_id)
        job = worker.cron.job(job_id)
    assert [(r["status"], r["result"]) for r in runs] == [("success", "pong")]
    assert (job["next_run_at"], job["triggered_at"]) == (regular, None)
