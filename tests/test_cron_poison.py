"""A cron run whose turn kills its runtime every time ends failed (a poison prompt).

Each life's runtime is crashed (``rt.crash()``) inside the run's turn, and the next one
starts past the run's lease on the injected clock, so each takeover is one crash, on
SQLite and on PostgreSQL.
"""

from __future__ import annotations

import threading

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors import cron_rules as rules

from .helpers import wait_for

MINUTE = 60.0
START = 1_700_000_040.0


class PoisonBrain:
    """Holds every turn until the test releases it (after crashing its runtime)."""

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.gates: list[threading.Event] = []
        self.lock = threading.Lock()

    def __call__(self, turn: Turn) -> str:
        gate = threading.Event()
        with self.lock:
            self.turns.append(turn)
            self.gates.append(gate)
        gate.wait(30)
        return "survived"

    def release_all(self) -> None:
        with self.lock:
            for gate in self.gates:
                gate.set()


def die_in_each_turn(db: str, clock: ManualClock, brain: PoisonBrain, rt: Runtime,
                     before: int, lives: int) -> Runtime:
    """Crash ``rt`` inside the run's turn, then start the next runtime past the run's lease
    (its start takes the run over), ``lives`` times; ``before``: the turns the brain ran
    before this run. Returns the runtime started after the last crash."""
    for life in range(1, lives + 1):
        wait_for(lambda life=life: len(brain.turns) == before + life, 10,
                 f"the run's turn in life {life} to start")
        rt.crash()  # inside the turn: the run stays "running", owned by a dead runtime
        brain.release_all()
        clock.advance(rt.context.lease_seconds + 1)
        rt = Runtime(db=db, brain=brain, clock=clock).start()
    return rt


@pytest.mark.timeout(120)
def test_a_run_that_kills_its_runtime_every_time_ends_failed_and_counts(
        any_db_url: str) -> None:
    """A run whose turn killed its runtime every time stayed ``running`` and was taken over
    at each restart (or lease end) for ever: never failed, the job never backed off, its
    brain (a model call) ran again and again. The fifth takeover ends it as an error run
    that counts as the job's failure, the first run and its retry alike."""
    clock = ManualClock(START)
    brain = PoisonBrain()
    rt = Runtime(db=any_db_url, brain=brain, clock=clock).start()
    try:
        job_id = str(rt.cron.add("poison", "0 0 1 1 *", "Crash, please.")["job_id"])
        rt.cron.trigger(job_id)
        # Five lives each die inside the turn; the sixth start takes the run over a fifth
        # time and ends it instead of running its brain a sixth time.
        rt = die_in_each_turn(any_db_url, clock, brain, rt, 0, rules.MAX_TAKEOVERS)
        wait_for(lambda: rt.cron.runs(job_id)[0]["status"] == "error", 10,
                 f"the run to end failed ({len(brain.turns)} turns ran)")
        [run] = rt.cron.runs(job_id)
        assert run["error"] == rules.taken_over_error(rules.MAX_TAKEOVERS)
        assert run["attempts"] == 1 + rules.MAX_TAKEOVERS
        job = rt.cron.job(job_id)
        assert job["active"] and job["retry_count"] == 1
        assert job["next_run_at"] == clock.now() + MINUTE
        assert job["last_error"] == run["error"]
        assert len(brain.turns) == rules.MAX_TAKEOVERS
        assert rt.transcript(f"cron-{job_id}") == []
        assert [a["run_id"] for a in rt.cron.drain_announcements()] == [run["run_id"]]

        # Its retry (attempt 2) is counted from its own start: five takeovers again.
        clock.advance(MINUTE)
        rt = die_in_each_turn(any_db_url, clock, brain, rt, rules.MAX_TAKEOVERS,
                              rules.MAX_TAKEOVERS)
        wait_for(lambda: [r["status"] for r in rt.cron.runs(job_id)] == ["error", "error"],
                 10, "the retry to end failed")
        retry = rt.cron.runs(job_id)[0]
        assert retry["attempts"] == 2 + rules.MAX_TAKEOVERS
        assert retry["error"] == rules.taken_over_error(rules.MAX_TAKEOVERS)
        job = rt.cron.job(job_id)
        assert job["active"] and job["retry_count"] == 2
        assert job["next_run_at"] == clock.now() + 2 * MINUTE
        assert len(brain.turns) == 2 * rules.MAX_TAKEOVERS
    finally:
        brain.release_all()
        if rt.state == "running":
            rt.stop()


def test_the_fifth_takeover_of_a_run_ends_it_and_counts_as_a_failure() -> None:
    """The run counts its takeovers itself: the fifth ends it, a failure of its job."""
    for n in range(rules.MAX_TAKEOVERS):
        assert rules.after_takeover(n) is None
    assert rules.after_takeover(rules.MAX_TAKEOVERS) == (
        rules.taken_over_error(rules.MAX_TAKEOVERS))
    assert rules.after_failure(0, rules.taken_over_error(5), 100.0).next_run_at == 160.0


class FailFirstBrain(PoisonBrain):
    """The job's first run fails (a brain error: its job retries); later turns are held
    like the poison's."""

    def __call__(self, turn: Turn) -> str:
        with self.lock:
            first = not self.turns
            if first:
                self.turns.append(turn)
        if first:
            raise RuntimeError("the model is down")
        return super().__call__(turn)


@pytest.mark.timeout(180)
def test_a_retry_resumed_while_it_runs_is_taken_over_five_times_and_says_so(
        any_db_url: str) -> None:
    """A resume resets the job's retry count: a retry that fired as attempt 2, taken over
    after it, read its attempts against the reset count, one takeover too many each time;
    it ended at its fourth takeover saying "Taken over 5 times"."""
    clock = ManualClock(START)
    brain = FailFirstBrain()
    rt = Runtime(db=any_db_url, brain=brain, clock=clock).start()
    try:
        job_id = str(rt.cron.add("flaky", "0 0 1 1 *", "Crash, please.")["job_id"])
        rt.cron.trigger(job_id)
        wait_for(lambda: rt.cron.job(job_id)["retry_count"] == 1, 30, "the first failure")
        clock.advance(MINUTE)  # the retry, attempt 2, fires and is held in its turn
        wait_for(lambda: len(brain.turns) == 2, 30, "the retry's turn")
        assert rt.cron.resume(job_id)["retry_count"] == 0  # the operator resets it meanwhile
        rt = die_in_each_turn(any_db_url, clock, brain, rt, 1, rules.MAX_TAKEOVERS - 1)

        def retry() -> dict[str, object]:
            return next(r for r in rt.cron.runs(job_id) if r["attempts"] != 1)

        # Four takeovers: the fifth life runs the retry's turn again.
        wait_for(lambda: len(brain.turns) == 1 + rules.MAX_TAKEOVERS
                 or retry()["status"] != "running", 30, "the fifth life's turn or an end")
        assert retry()["status"] == "running", retry()
        rt = die_in_each_turn(any_db_url, clock, brain, rt, rules.MAX_TAKEOVERS, 1)
        wait_for(lambda: retry()["status"] == "error", 30, "the retry to end failed")
        assert retry()["error"] == rules.taken_over_error(rules.MAX_TAKEOVERS)
        assert len(brain.turns) == 1 + rules.MAX_TAKEOVERS
    finally:
        brain.release_all()
        if rt.state == "running":
            rt.stop()
