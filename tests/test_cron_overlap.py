"""A job never has two runs running at once, even when its running run's runtime died, and
the occurrence due while the dead run is taken over runs too, once the takeover ended.

Each test crashes a runtime (``rt.crash()``) inside a run's turn and has the next look come
on the injected clock past the job's next occurrence: that look takes the dead run over,
and the due occurrence waits for it (no second run beside it), then runs, late.
"""

from __future__ import annotations

import threading

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.persistence import CronJobRecord, CronRunRecord, CronStore, Occurrence

from .conftest import Stores
from .helpers import life_locks, wait_for

pytestmark = pytest.mark.timeout(60)

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


def check_takeover_then_occurrence(rt: Runtime, brain: HoldingBrain, job_id: str,
                                   first: str) -> None:
    """``rt``'s look past the next occurrence took ``first`` over: the occurrence waits for
    it, runs once it ended, and neither is an error run."""
    wait_for(lambda: len(brain.turns) == 2, 10, "the takeover's turn to start")
    runs = rt.cron.runs(job_id)
    assert [(r["run_id"], r["status"]) for r in runs] == [(first, "running")]
    brain.release_all()
    wait_for(lambda: len(brain.turns) == 3, 10, "the occurrence due meanwhile to run")
    brain.release_all()
    assert rt.cron.wait_idle(10)
    second = f"{job_id}@{int((START + 2 * MINUTE) * 1000)}"
    assert brain.turns == [first, first, second] and brain.most_at_once == 1
    statuses = {r["run_id"]: (r["status"], r["scheduled_for"]) for r in rt.cron.runs(job_id)}
    assert statuses == {first: ("success", START + MINUTE),
                        second: ("success", START + 2 * MINUTE)}
    job = rt.cron.job(job_id)
    assert job["retry_count"] == 0 and job["next_run_at"] == START + 3 * MINUTE


def restart_then_check(url: str, clock: ManualClock, brain: HoldingBrain, lease: float,
                       job_id: str, first: str) -> None:
    """A runtime started after the death: :func:`check_takeover_then_occurrence`."""
    rt = Runtime(db=url, brain=brain, clock=clock, lease_seconds=lease).start()
    try:
        check_takeover_then_occurrence(rt, brain, job_id, first)
    finally:
        brain.release_all()
        rt.stop()


@pytest.mark.parametrize("late", [1.0, 30.0], ids=["at-once", "half-a-minute-late"])
def test_a_dead_runs_takeover_then_the_next_occurrence_one_at_a_time(
        any_db_url: str, late: float) -> None:
    """A run whose runtime died, its lease run out when the job's next occurrence came due:
    the next runtime's look fired the occurrence as a new run and took the dead one over as
    well, two turns of one job at once; then (the fix of that) it recorded the occurrence
    as the "still active" error run, and the occurrence never ran, lost to the crash. The
    takeover runs alone, and the occurrence after it."""
    clock = ManualClock(START)
    brain = HoldingBrain()
    job_id, first = crash_in_first_run(any_db_url, clock, brain, 30.0)
    clock.advance(MINUTE + late)  # past the run's lease and the job's next occurrence
    restart_then_check(any_db_url, clock, brain, 30.0, job_id, first)


def test_a_known_dead_runtimes_run_then_the_next_occurrence_one_at_a_time(
        pg_url: str) -> None:
    """On PostgreSQL a run whose runtime is known dead (its life lock free) is taken over
    before its lease runs out; the occurrence due at that look waits for it too."""
    clock = ManualClock(START)
    brain = HoldingBrain()
    lease = 10 * MINUTE
    job_id, first = crash_in_first_run(pg_url, clock, brain, lease)
    wait_for(lambda: life_locks(pg_url) == 0, 10, "the dead runtime's life lock to go")
    clock.advance(MINUTE)  # the next occurrence is due; the run's lease has not run out
    restart_then_check(pg_url, clock, brain, lease, job_id, first)


def test_a_survivor_whose_first_look_after_a_death_is_the_next_occurrence(
        pg_url: str) -> None:
    """tests/test_cron_pg.py's flake, made certain: two runtimes, each with its own clock;
    one dies inside a run, and the other's first look after that comes at the job's next
    occurrence (its look at the run's own minute came before the server freed the dead
    one's life lock). That occurrence was the "still active" error run: lost."""
    clocks = [ManualClock(START), ManualClock(START)]
    brain = HoldingBrain()
    lease = 10 * MINUTE
    victim = Runtime(db=pg_url, brain=brain, clock=clocks[0], lease_seconds=lease).start()
    survivor = Runtime(db=pg_url, brain=brain, clock=clocks[1], lease_seconds=lease).start()
    try:
        job_id = str(victim.cron.add("overlap", "* * * * *", "Take a while.")["job_id"])
        clocks[0].advance(MINUTE)
        wait_for(lambda: len(brain.turns) == 1, 10, "the first run's turn to start")
        victim.crash()
        brain.release_all()
        wait_for(lambda: brain.running == 0, 10, "the dead runtime's turn to end")
        wait_for(lambda: life_locks(pg_url) == 1, 10, "the dead runtime's life lock to go")
        clocks[1].advance(2 * MINUTE)
        check_takeover_then_occurrence(survivor, brain, job_id, brain.turns[0])
    finally:
        brain.release_all()
        survivor.stop()


def job_record(job_id: str, next_run_at: float) -> CronJobRecord:
    return CronJobRecord(job_id, job_id, "* * * * *", "UTC", "p", True, "none", 0,
                         next_run_at, None, None, None, START, START)


def test_a_job_whose_run_was_taken_over_is_not_due_until_that_run_ends(stores: Stores) -> None:
    """The store's side: a job waits for its taken-over run without a write at each look,
    and is not armed for meanwhile (APScheduler, armed for a time past, would fire at once
    again and again); once the run ends, the occurrence fires as it was scheduled."""
    crons = CronStore(stores.tables, stores.writer)
    crons.create(job_record("j", START + MINUTE))

    def fire(next_run_at: float) -> list[CronRunRecord]:
        def decide(_job: CronJobRecord, _running: CronRunRecord | None) -> Occurrence:
            return Occurrence({"next_run_at": next_run_at}, "running")
        return crons.fire_due(now, "me", 30, decide)

    now = START + MINUTE
    [run] = fire(START + 2 * MINUTE)
    now = START + 2 * MINUTE + 1  # the run's lease ran out, and the next occurrence is due
    [taken] = crons.take_over(now, "other", 30)
    assert (taken.id, taken.attempts) == (run.id, 2)
    before = stores.writer.statistics().operations
    assert fire(START + 3 * MINUTE) == []
    assert stores.writer.statistics().operations == before  # a look, no transaction
    assert crons.next_run() is None
    crons.finish(run.id, "other", now, "success")
    assert crons.next_run() == START + 2 * MINUTE
    [late] = fire(START + 3 * MINUTE)
    assert (late.scheduled_for, late.started_at) == (START + 2 * MINUTE, now)
    # A run never taken over does not hold its job back (the rules make the occurrence the
    # "still active" error run).
    assert crons.next_run() == START + 3 * MINUTE
    now = START + 3 * MINUTE
    assert [r.scheduled_for for r in fire(START + 4 * MINUTE)] == [START + 3 * MINUTE]
