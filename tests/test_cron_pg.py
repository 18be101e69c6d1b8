"""Cron fires once across processes: two runtimes on one PostgreSQL database (C2)."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from kinbox.actors import ManualClock, Runtime, Turn

from .conftest import PG_URL, reset_postgres

MINUTE = 60.0
START = 1_700_000_040.0


@pytest.fixture
def pg_url() -> str:
    if not PG_URL:
        pytest.skip("needs KINBOX_TEST_PG_URL")
    reset_postgres(PG_URL)
    return PG_URL


class Recorder:
    """Counts the turns each run id got; can hold one turn to crash its runtime mid-turn."""

    def __init__(self, name: str, ran: Counter[str], lock: threading.Lock) -> None:
        self.name = name
        self.ran = ran
        self.lock = lock
        self.hold = threading.Event()
        self.holding = threading.Event()
        self.release = threading.Event()

    def __call__(self, turn: Turn) -> str:
        with self.lock:
            self.ran[turn.messages[0].message_id] += 1
        if self.hold.is_set():
            self.hold.clear()
            self.holding.set()
            self.release.wait(10)
        return f"{self.name} ran {turn.messages[0].message_id}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim", [0, 1])
def test_sixty_minutes_two_runtimes_one_crash_sixty_runs_none_doubled(pg_url: str,
                                                                      victim: int) -> None:
    # One clock per runtime, as two processes each have their own: the test moves them in
    # turn, so which runtime sees an occurrence first alternates every minute.
    clocks = [ManualClock(START), ManualClock(START)]
    ran: Counter[str] = Counter()
    lock = threading.Lock()
    brains = [Recorder("a", ran, lock), Recorder("b", ran, lock)]
    runtimes = [Runtime(db=pg_url, brain=b, clock=c).start()
                for b, c in zip(brains, clocks, strict=True)]
    survivor = runtimes[1 - victim]
    try:
        job_id = runtimes[0].cron.add("tick", "* * * * *", "tick")["job_id"]
        for minute in range(1, 61):
            if minute == 30:
                # The victim sees this occurrence first, fires it and dies in its turn.
                brains[victim].hold.set()
                clocks[victim].advance(MINUTE)
                assert brains[victim].holding.wait(5)
                runtimes[victim].crash()
                brains[victim].release.set()
                clocks[1 - victim].advance(MINUTE)
                survivor.run_until_idle(timeout=20)
                continue
            order = (0, 1) if minute % 2 else (1, 0)
            for i in order:
                clocks[i].advance(MINUTE)
            for rt in runtimes:
                if rt._state == "running":
                    rt.run_until_idle(timeout=20)
        clocks[1 - victim].advance(1)  # a last look for anything left to take over
        survivor.run_until_idle(timeout=20)
        runs = survivor.cron.runs(job_id, limit=200)
        done = [r for r in runs if r["status"] == "success"]
        occurrences = Counter(r["scheduled_for"] for r in done)
        assert sorted(occurrences) == [START + MINUTE * m for m in range(1, 61)], (
            sorted((r["scheduled_for"], r["status"]) for r in runs))
        assert set(occurrences.values()) == {1} and len(runs) == 60
        entries = [e.message_id for e in survivor.transcript(f"cron-{job_id}")
                   if e.role == "user"]
        assert len(entries) == 60 and len(set(entries)) == 60  # each run committed once
        # Only the run the victim died in ran twice (once lost with the victim).
        died_in = f"{job_id}@{int((START + 30 * MINUTE) * 1000)}"
        assert [k for k, n in ran.items() if n > 1] == [died_in]
        owners = Counter(e.text.split()[0] for e in survivor.transcript(f"cron-{job_id}")
                         if e.role == "assistant")
        assert owners["a"] > 10 and owners["b"] > 10  # both runtimes did the work
    finally:
        for b in brains:
            b.release.set()
        for rt in runtimes:
            if rt._state == "running":
                rt.stop()
