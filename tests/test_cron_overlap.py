"""A job never has two runs running at once, even when its running run's runtime died.

Each test crashes a runtime (``rt.crash()``) inside a run's turn and starts the next one
on the injected clock past the job's next occurrence: the start takes the dead run over,
and the due occurrence is the "still active" error run, not a second run beside it.
"""

from __future__ import annotations

import threading

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors import cron_rules as rules

from .helpers import wait_for

MINUTE = 60.0
START = 1_700_000_040.0  # on a minute


class HoldingBrain:
    """Holds each turn until the test releases it; counts the turns running at once."""

    def __init__(self) -> None:
        self.turns: list[str] = []
        self.gates: list[threading.Event] = []
        self.running = 0
        self.most_at_once = 0
        self.lock = threading.Lock()

    def __call__(self, turn: Turn) -> str:
        gate = threading.Event()
        with self.lock:
            self.turns.append(turn.messages[0].message_id)
            self.gates.append(gate)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            gate.wait(30)
            return "done"
        finally:
            with self.lock:
                self.running -= 1

    def release_all(self) -> None:
        with self.lock:
            for gate in self.gates:
                gate.set()


def crash_in_first_run(db: str, clock: ManualClock, brain: HoldingBrain,
                       lease_seconds: float) -> tuple[str, str]:
    """Fire an every-minute job's first run and crash its runtime inside the turn; the job's
    and the run's ids."""
    rt = Runtime(db=db, brain=brain, clock=clock, lease_seconds=lease_seconds).start()
    job_id = str(rt.cron.add("overlap", "* * * * *", "Take a while.")["job_id"])
    clock.advance(MINUTE)
    wait_for(lambda: len(brain.turns) == 1, 10, "the first run's turn to start")
    rt.crash()  # inside the turn: the run stays "running", owned by a dead runtime
    brain.release_all()  # the dead runtime's turn ends (its commit refused)
    wait_for(lambda: brain.running == 0, 10, "the dead runtime's turn to end")
    return job_id, brain.turns[0]


def check_one_run_at_once(db: str, clock: ManualClock, brain: HoldingBrain, job_id: str,
                          first: str, lease_seconds: float) -> None:
    rt = Runtime(db=db, brain=brain, clock=clock, lease_seconds=lease_seconds).start()
    try:
        runs = rt.cron.runs(job_id)
        assert [r["run_id"] for r in runs if r["status"] == "running"] == [first]
        assert [r["error"] for r in runs if r["status"] == "error"] == [rules.PREVIOUS_ACTIVE]
        wait_for(lambda: len(brain.turns) == 2, 10, "the takeover's turn to start")
        brain.release_all()
        assert rt.cron.wait_idle(10)
        assert brain.turns == [first, first] and brain.most_at_once == 1
        statuses = {r["run_id"]: r["status"] for r in rt.cron.runs(job_id)}
        assert statuses[first] == "success" and sorted(statuses.values()) == [
            "error", "success"]
        assert rt.cron.job(job_id)["retry_count"] == 0  # the refusal is no failure
    finally:
        brain.release_all()
        rt.stop()


@pytest.mark.timeout(60)
def test_a_dead_runs_takeover_and_the_next_occurrence_do_not_both_run(
        any_db_url: str) -> None:
    """A run whose runtime died, its lease run out when the job's next occurrence came due,
    counted as no longer active: the next runtime fired the occurrence as a new run and took
    the dead one over as well, two turns of one job at once. The takeover runs alone; the
    occurrence is the "still active" error run."""
    clock = ManualClock(START)
    brain = HoldingBrain()
    job_id, first = crash_in_first_run(any_db_url, clock, brain, 30.0)
    clock.advance(MINUTE + 1)  # past the run's lease and the job's next occurrence
    check_one_run_at_once(any_db_url, clock, brain, job_id, first, 30.0)


@pytest.mark.timeout(60)
def test_a_known_dead_runtimes_run_and_the_next_occurrence_do_not_both_run(
        pg_url: str) -> None:
    """On PostgreSQL a run whose runtime is known dead (its life lock free) is taken over
    before its lease runs out; that made it count as not active either, and the due
    occurrence ran beside its takeover."""
    clock = ManualClock(START)
    brain = HoldingBrain()
    lease = 10 * MINUTE
    job_id, first = crash_in_first_run(pg_url, clock, brain, lease)
    clock.advance(MINUTE)  # the next occurrence is due; the run's lease has not run out
    check_one_run_at_once(pg_url, clock, brain, job_id, first, lease)
