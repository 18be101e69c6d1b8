"""A failed cron run whose record the database refuses is handed back, not left to its lease.

When the record of a failed run was refused (a database error; the run still this
runtime's), ``CronService._execute`` raised and left the run ``running`` with nobody
renewing its lease: it sat out the whole lease, was then taken over and run again as if
its runtime had died, and after five such ends was failed with "Taken over 5 times: its
runtime died each time". As the inbox hands back a row whose failure record was refused
(``Journal.release_later``), the run goes back unrun, due again after a backoff, with no
takeover counted; once its record lands, the run's error is the brain's.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime
from kinbox.persistence import (
    CronJobRecord,
    CronRunLost,
    CronStore,
    DatabaseFailed,
    Occurrence,
)

from .conftest import Stores
from .helpers import wait_for
from .test_cron import MINUTE, CronBrain, MakeRuntime, clock  # noqa: F401

pytestmark = pytest.mark.timeout(90)


def refusing_failure_records(monkeypatch: pytest.MonkeyPatch, times: int) -> list[str]:
    """Refuse the record of the next ``times`` failed runs; the ids of those refused."""
    real = CronStore.finish
    refused: list[str] = []

    def finish(self: CronStore, run_id: str, owner: str, now: float, status: str,
               **kwargs: Any) -> Any:
        if status == "error" and len(refused) < times:
            refused.append(run_id)
            raise DatabaseFailed("CHECK constraint failed")
        return real(self, run_id, owner, now, status, **kwargs)

    monkeypatch.setattr(CronStore, "finish", finish)
    return refused


def settle(rt: Runtime) -> None:
    rt.run_until_idle(20)
    assert rt.cron.wait_idle(20)


def test_a_refused_failure_record_hands_the_run_back_for_a_backoff_not_a_lease(
        make_runtime: MakeRuntime, clock: ManualClock,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    refused = refusing_failure_records(monkeypatch, 1)
    brain = CronBrain()
    brain.failing = "the model timed out"
    rt = make_runtime(brain=brain, lease_seconds=3600)
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "Happy new year")["job_id"])
    rt.cron.trigger(job_id)
    wait_for(lambda: bool(refused), 20, "the failure record refused")
    settle(rt)
    assert len(brain.turns) == 1, "the brain ran again at once"
    [run] = rt.cron.runs(job_id)
    assert run["status"] == "running"  # nothing recorded yet: it waits
    clock.advance(MINUTE + 1)  # past a backoff, far short of the hour's lease
    settle(rt)
    wait_for(lambda: rt.cron.runs(job_id)[0]["status"] == "error", 20,
             f"the failure recorded after the backoff ({len(brain.turns)} turns ran)")
    [run] = rt.cron.runs(job_id)
    assert run["error"] == "RuntimeError: the model timed out"
    assert run["takeovers"] == 0  # its runtime never died
    assert len(brain.turns) == 2
    assert rt.cron.job(job_id)["retry_count"] == 1


def test_a_record_refused_again_and_again_is_never_called_a_dead_runtime(
        make_runtime: MakeRuntime, clock: ManualClock,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    refused = refusing_failure_records(monkeypatch, 7)
    brain = CronBrain()
    brain.failing = "the model timed out"
    rt = make_runtime(brain=brain, lease_seconds=120)
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "Happy new year")["job_id"])
    rt.cron.trigger(job_id)
    for n in range(1, 8):
        wait_for(lambda n=n: len(refused) == n, 20, f"refusal {n}")
        settle(rt)
        assert len(brain.turns) == n
        clock.advance(3600)  # past any backoff and lease
        settle(rt)
    wait_for(lambda: rt.cron.runs(job_id)[0]["status"] == "error", 20,
             "the failure recorded once the database took it")
    [run] = rt.cron.runs(job_id)
    assert run["error"] == "RuntimeError: the model timed out" and run["takeovers"] == 0
    assert len(brain.turns) == 8


def test_a_handed_back_run_is_taken_after_its_due_time_with_no_takeover_counted(
        stores: Stores) -> None:
    """On both backends: only its owner hands a run back; it is taken once its time has
    passed, its attempt counted and no death of a runtime."""
    crons = CronStore(stores.tables, stores.writer)
    crons.create(CronJobRecord("job-h", "nightly", "0 3 * * *", "UTC", "check", True,
                               "none", 0, 100.0, None, None, None, 0.0, 0.0))
    [run] = crons.fire_due(100.0, "owner-a", 30.0, lambda job, running: Occurrence(
        {"next_run_at": 90_000.0}, "running"))
    with pytest.raises(CronRunLost):
        crons.hand_back(run.id, "owner-b", 160.0)
    crons.hand_back(run.id, "owner-a", 160.0)
    assert crons.take_over(160.0, "owner-b", 30.0) == []  # not yet past its time
    [taken] = crons.take_over(161.0, "owner-b", 30.0)
    assert (taken.id, taken.owner, taken.attempts, taken.takeovers) == (
        run.id, "owner-b", 2, 0)
    crons.finish(run.id, "owner-b", 170.0, "error", error="boom")
    assert [(r.status, r.error, r.takeovers) for r in crons.runs("job-h")] == [
        ("error", "boom", 0)]



def refusing_once(monkeypatch: pytest.MonkeyPatch, name: str) -> list[str]:
    """Refuse the next call of ``CronStore.<name>`` off the test's thread (a read a run
    makes before its turn, not the test's own), as a lost connection does; its
    arguments' first, once refused."""
    real = getattr(CronStore, name)
    refused: list[str] = []

    def read(self: CronStore, key: str, *args: Any, **kwargs: Any) -> Any:
        if not refused and threading.current_thread() is not threading.main_thread():
            refused.append(key)
            raise DatabaseFailed("the connection was lost")
        return real(self, key, *args, **kwargs)

    monkeypatch.setattr(CronStore, name, read)
    return refused


def test_a_read_refused_before_the_turn_is_a_failed_run_retried_not_left_to_its_lease(
        make_runtime: MakeRuntime, clock: ManualClock,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A database error before the run's turn (its job's last runs, read for the reminder)
    is a failed run, as a refused commit is: retried after the first delay, counted
    toward the job's limit. Raised, the run sat out its lease with nothing renewing it,
    and was taken over as a dead runtime's."""
    rt = make_runtime(brain=(brain := CronBrain()), lease_seconds=3600)
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "Happy new year")["job_id"])
    refused = refusing_once(monkeypatch, "last_runs")
    rt.cron.trigger(job_id)
    wait_for(lambda: bool(refused), 20, "the read refused")
    settle(rt)
    wait_for(lambda: rt.cron.runs(job_id)[0]["status"] == "error", 20,
             f"the failed run recorded ({rt.cron.runs(job_id)})")
    assert brain.turns == []
    assert rt.cron.job(job_id)["retry_count"] == 1
    clock.advance(MINUTE + 1)  # its retry, far short of the hour's lease
    settle(rt)
    wait_for(lambda: rt.cron.runs(job_id)[0]["status"] == "success", 20,
             f"the retry ran ({rt.cron.runs(job_id)})")
    failed, ok = rt.cron.runs(job_id)[1], rt.cron.runs(job_id)[0]
    assert "refused the turn's start" in failed["error"]
    assert failed["takeovers"] == ok["takeovers"] == 0  # its runtime never died
    assert len(brain.turns) == 1


def test_a_refused_read_of_its_job_hands_the_run_back_for_a_backoff(
        make_runtime: MakeRuntime, clock: ManualClock,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The read of the run's job itself refused: no job to count a failure against, the
    run goes back, due after the first delay, and runs then."""
    rt = make_runtime(brain=(brain := CronBrain()), lease_seconds=3600)
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "Happy new year")["job_id"])
    refused = refusing_once(monkeypatch, "get")
    rt.cron.trigger(job_id)
    wait_for(lambda: bool(refused), 20, "the read refused")
    settle(rt)
    assert brain.turns == []
    clock.advance(MINUTE + 1)  # past a backoff, far short of the hour's lease
    settle(rt)
    wait_for(lambda: rt.cron.runs(job_id)[0]["status"] == "success", 20,
             f"the run ran after the backoff ({rt.cron.runs(job_id)})")
    [run] = rt.cron.runs(job_id)
    assert run["takeovers"] == 0  # its runtime never died
    assert len(brain.turns) == 1


def test_the_log_of_a_refused_failure_record_names_the_error_type_not_its_text(
        make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The hand back's ERROR line quoted the brain's error whole, and a brain's text can
    quote the prompt it ran."""
    refused = refusing_failure_records(monkeypatch, 1)
    brain = CronBrain()
    brain.failing = "the model echoed BODY-MARK-c41e"
    rt = make_runtime(brain=brain, lease_seconds=3600)
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "Happy new year")["job_id"])
    with caplog.at_level(logging.INFO, logger="kinbox"):
        rt.cron.trigger(job_id)
        wait_for(lambda: bool(refused), 20, "the failure record refused")
        settle(rt)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert any(refused[0] in m and "RuntimeError" in m for m in lines)
    assert not [m for m in lines if "BODY-MARK" in m]
