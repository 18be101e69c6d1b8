"""Cron fires once across processes: two runtimes on one PostgreSQL database (C2)."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from kinbox.actors import ManualClock, Runtime, Turn

from .conftest import Stores
from .helpers import life_locks, wait_for

CHILD = Path(__file__).with_name("cron_child.py")

MINUTE = 60.0
START = 1_700_000_040.0


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
                assert brains[victim].holding.wait(30)
                runtimes[victim].crash()
                brains[victim].release.set()
                clocks[1 - victim].advance(MINUTE)
                survivor.run_until_idle(timeout=20)
                # The server frees the victim's life lock a moment after the crash: the
                # survivor's look at this minute may have come before, and then its look
                # at the next minute takes the run over, that occurrence waiting for it.
                # Not knowing by then that the victim is dead, it would take the run as
                # live (the next occurrence the "still active" error run): wait for it.
                wait_for(lambda: life_locks(pg_url) == 1, 10, "the victim's life lock to go")
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


class Child:
    """A cron_child.py process and the lines it prints."""

    def __init__(self, url: str, name: str, hold: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(CHILD), url, str(START), name,
                                      str(hold)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.expect() == "ready"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def expect(self, timeout: float = 30.0) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            self.proc.kill()
            raise AssertionError(f"child silent: {self.proc.stderr.read()[-3000:]}") from None

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim", [0, 1])
def test_two_processes_an_hour_of_minutes_a_sigkill_mid_turn_sixty_runs(
        pg_url: str, tmp_path: Path, victim: int) -> None:
    holds = [tmp_path / "hold-a", tmp_path / "hold-b"]
    children = [Child(pg_url, "a", holds[0]), Child(pg_url, "b", holds[1])]
    try:
        children[0].send("add")
        job_id = children[0].expect()
        survivor = children[1 - victim]
        for minute in range(1, 61):
            order = (0, 1) if minute % 2 else (1, 0)
            if minute == 30:
                holds[victim].touch()
                order = (victim, 1 - victim)  # the victim sees this occurrence first
            for i in order:
                if children[i].proc.poll() is not None:
                    continue
                children[i].send("advance 60")
                reply = children[i].expect()
                if reply == "holding":
                    children[i].kill()  # SIGKILL in the middle of the run's turn
                    # Its life lock goes when the server notices: then the survivor's
                    # next look takes its run over, and runs it before the next minute
                    # (a takeover still running then holds that occurrence back until it
                    # ended: not a second run beside it).
                    wait_for(lambda: life_locks(pg_url) == 1, 10, "the victim's life lock")
                    continue
                assert reply == "ok"
        survivor.send("advance 1")  # one more look, for anything left to take over
        assert survivor.expect() == "ok"
        survivor.send("quit")
        survivor.proc.wait(30)
        assert survivor.proc.returncode == 0
        s = Stores(pg_url)
        try:
            r = s.tables.cron_run
            runs = list(r.select().where(r.job_id == job_id))
            entries = [e for e in s.store.transcript(f"cron-{job_id}") if e.role == "user"]
        finally:
            s.close()
        done = Counter(x.scheduled_for for x in runs if x.status == "success")
        assert sorted(done) == [START + MINUTE * m for m in range(1, 61)], sorted(
            (x.scheduled_for, x.status) for x in runs)
        assert set(done.values()) == {1} and len(runs) == 60
        assert len(entries) == 60 and len({e.message_id for e in entries}) == 60
        died_in = [x for x in runs if x.attempts == 2]
        assert [x.scheduled_for for x in died_in] == [START + 30 * MINUTE]
    finally:
        for child in children:
            if child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait(10)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("manual", [True, False], ids=["injected-clock", "real-clock"])
def test_a_dead_runtimes_run_is_taken_over_at_once_not_when_its_lease_ends(
        pg_url: str, manual: bool) -> None:
    """A dead runtime's cron run is taken over at once, not when its ten-minute lease ends.
    On the real clock, rows of a dead runtime were taken over at the live runtimes' next
    takeover check (half a second), its cron runs only at cron's next poll (15 s) or job
    time: they go together now."""
    clocks = [ManualClock(START), ManualClock(START)] if manual else [None, None]
    ran: Counter[str] = Counter()
    lock = threading.Lock()
    brains = [Recorder("a", ran, lock), Recorder("b", ran, lock)]
    runtimes = [Runtime(db=pg_url, brain=brain, clock=clock, lease_seconds=600).start()
                for brain, clock in zip(brains, clocks, strict=True)]
    try:
        job_id = runtimes[0].cron.add("tick", "0 0 1 1 *", "tick")["job_id"]
        for b in brains:
            b.hold.set()
        # The first runs it (an injected clock fires only where it moves); on the real
        # clock the trigger notifies the other as well, and either may run it.
        runtimes[0].cron.trigger(job_id)
        wait_for(lambda: any(b.holding.is_set() for b in brains), 30, "the run to start")
        dead = 0 if brains[0].holding.is_set() else 1
        live, clock = runtimes[1 - dead], clocks[1 - dead]
        brains[1 - dead].hold.clear()
        runtimes[dead].crash()  # its life lock goes with it; its run's lease has 10 min left
        brains[dead].release.set()

        def taken_over() -> bool:
            if clock is not None:
                # The server frees a closed connection's lock a moment later: look again,
                # a second of injected time each, far inside the run's ten-minute lease.
                clock.advance(1)
                live.run_until_idle(timeout=20)
            return bool(live.cron.runs(job_id)[0]["status"] == "success")

        wait_for(taken_over, 20 if manual else 5, "the dead runtime's run to be taken over")
        [run] = live.cron.runs(job_id)
        assert run["attempts"] == 2
        assert clock is None or clock.now() - START < 600
    finally:
        for b in brains:
            b.release.set()
        for rt in runtimes:
            if rt.state == "running":
                rt.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tick", [0.2, 30.0])
def test_a_live_run_longer_than_its_lease_is_not_taken_over(pg_url: str, tick: float) -> None:
    """A run's lease was renewed only when cron looked at its table (job times, the 15 s
    poll): a run longer than its lease was taken over by another process and run again
    while its own process still ran it. The runtime's tick now renews it, and comes often
    enough for that however long a ``tick_interval`` the runtime was given."""
    started, gate = threading.Event(), threading.Event()

    def slow(turn: Turn) -> str:
        started.set()
        assert gate.wait(30)
        return "done"

    lease = 1.5
    with Runtime(db=pg_url, brain=slow, lease_seconds=lease, tick_interval=tick) as owner, \
            Runtime(db=pg_url, brain=slow, lease_seconds=lease) as other:
        job = owner.cron.add("digest", "0 9 * * *", "Summarize")
        owner.cron.trigger(job["job_id"])
        assert started.wait(20)
        [run] = owner.cron.runs(job["job_id"])
        begun = owner.context.now()
        wait_for(lambda: owner.context.now() > begun + 2 * lease, 10,
                 what="two leases' time to pass")
        assert other.cron.tick() == [], "another process took over a live run"
        gate.set()
        wait_for(lambda: owner.cron.runs(job["job_id"])[0]["status"] == "success", 20,
                 what="the run's own commit")
        assert [r["run_id"] for r in owner.cron.runs(job["job_id"])] == [run["run_id"]]
