"""Deterministic simulation of delivery (issue 14, item 6): the journal under workers that
claim, finish, fail, crash and stall, on an injected clock, with database errors.

A Hypothesis state machine drives the real journal (real SQLite file, real
group-commit writer) the way the dispatcher and the session actors do: two
workers claim due heads with a lease (skipping targets they are busy with),
run turns that commit or fail, hand rows back, crash (forgetting what they
held, their leases taken over as a restart does, or left to expire), or
simply stop acting while the clock jumps past their leases (a pause). A
``busy`` step makes the Nth SQL statement of the next write, or its COMMIT,
fail with ``database is locked`` at the driver boundary (the DB-API cursor).

After every step: at most one committed turn (marker) per id, and the
model's count of successful commits agrees; at most one in-flight row per
target; attempts within ``0..max_attempts``; every row moved only along
legal transitions; a row is delivered exactly when it has a marker; every
accepted id is in the journal; a write that hit an injected error changed
nothing. Fencing is checked on every outcome: a worker's finish, fail or
release is refused with ``LeaseLost`` exactly when the row is no longer its
own. After the run, with the errors off, a healthy worker drains: every
accepted id ends terminal.

200 examples x 50 steps in the default suite, the same ones every run (derandomized,
so a failure reproduces); the ``slow`` variant runs 5,000 fresh random examples x 100
steps (``pytest -m slow tests/test_simulation.py``).
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from kinbox.actors import ManualClock
from kinbox.persistence import (
    GroupCommitWriter,
    Journal,
    LeaseLost,
    NewMessage,
    SessionStore,
    TurnEntry,
    bind_tables,
    open_database,
    upgrade,
)
from kinbox.persistence.inbox_core import LOCAL, TERMINAL_STATES, TRANSITIONS, State

from .helpers import FaultyCursor

TARGETS = ("t0", "t1", "t2")
WORKERS = ("w0", "w1")
LEASE = 30.0
WRITER = "sim-writer"
TABLES = ("delivery_markers", "transcript_entries", "agent_inbox_events",
          "agent_inbox_messages")


def reachable() -> set[tuple[str, str]]:
    """Every (before, after) pair of states a row may show between two steps."""
    step = {(a.value, b.value) for (a, _), b in TRANSITIONS.items()}
    pairs = {(s.value, s.value) for s in State} | step
    while True:  # one step may chain (a claim that finds a marker acks at once)
        more = {(a, d) for a, b in pairs for c, d in pairs if b == c} - pairs
        if not more:
            return pairs
        pairs |= more


LEGAL = reachable()


class Faults:
    """Database errors at the driver boundary: the DB-API cursor of the writer thread."""

    def __init__(self) -> None:
        self.countdown: int | None = None  # fail the statement this many statements ahead
        self.on_commit = False  # ...or fail the COMMIT
        self.fired = False

    def arm(self, at: int, on_commit: bool) -> None:
        self.countdown, self.on_commit, self.fired = at, on_commit, False

    def disarm(self) -> None:
        self.countdown, self.on_commit = None, False

    def check(self, sql: str) -> None:
        if threading.current_thread().name != WRITER or self.countdown is None:
            return
        if self.on_commit:
            hit = sql.strip().upper().startswith("COMMIT")
        else:
            hit = self.countdown == 0
            self.countdown -= 1
        if hit:
            self.disarm()
            self.fired = True
            raise sqlite3.OperationalError("database is locked")


class World:
    """One database, writer and journal for every example of a test (reset in between)."""

    def __init__(self, path: Path) -> None:
        self.faults = Faults()
        self.db = open_database(f"sqlite:///{path}", synchronous="NORMAL")
        real_cursor = self.db.cursor
        self.db.cursor = lambda *a, **k: FaultyCursor(real_cursor(*a, **k), self.faults.check)
        self.tables = bind_tables(self.db)
        upgrade(self.tables)
        self.writer = GroupCommitWriter(self.db, name=WRITER)
        self.writer.start()
        self.journal = Journal(self.tables, self.writer)
        self.store = SessionStore(self.tables, self.writer)
        self.store.create_project("p", "p", "p", 0.0)
        for t in TARGETS:
            self.store.create_session(t, "p", t, "interactive", 0.0)

    def reset(self) -> None:
        self.faults.disarm()
        self.writer.call(lambda: [self.db.execute_sql(f"DELETE FROM {t}") for t in TABLES])

    def close(self) -> None:
        self.writer.stop()
        self.db.close()


class Delivery(RuleBasedStateMachine):
    """Workers, a clock and a faulty database around one journal."""

    world: World

    def __init__(self) -> None:
        super().__init__()
        self.world.reset()
        self.j = self.world.journal
        self.clock = ManualClock()
        self.accepted: dict[str, str] = {}
        self.committed: Counter[str] = Counter()
        self.held: dict[str, dict[str, Any]] = {w: {} for w in WORKERS}
        self.prev: dict[str, str] = {}
        self.n = 0

    # -- helpers ---------------------------------------------------------------------------

    def rows(self) -> dict[str, tuple[Any, ...]]:
        return {r[0]: r[1:] for r in self.world.db.execute_sql(
            "SELECT message_id, status, lease_owner, lease_until, attempts, max_attempts, "
            "target_chat_id, available_at FROM agent_inbox_messages")}

    def markers(self) -> Counter[str]:
        return Counter(r[0] for r in self.world.db.execute_sql(
            "SELECT message_id FROM delivery_markers"))

    def snapshot(self) -> tuple[Any, ...]:
        entries = self.world.db.execute_sql("SELECT COUNT(*) FROM transcript_entries").fetchone()
        return (self.rows(), self.markers(), entries[0])

    def owns(self, worker: str, message_id: str) -> bool:
        row = self.rows().get(message_id)
        return row is not None and row[0] == State.PROCESSING.value and row[1] == worker

    def write(self, op: Any, *, owned: bool | None = None) -> tuple[bool, Any]:
        """Run a journal write; check fencing and that a failed write changed nothing."""
        before = self.snapshot()
        self.world.faults.fired = False
        try:
            result = op()
        except LeaseLost:
            assert owned is False, "refused a worker that still held its lease"
            assert self.snapshot() == before, "a refused write changed the journal"
            return False, None
        except Exception as exc:
            if not self.world.faults.fired:
                raise
            assert "locked" in str(exc), exc
            assert self.snapshot() == before, "a write that hit a database error left a trace"
            return False, None
        assert owned is not False, "a worker that lost its lease was not refused"
        return True, result

    # -- rules -----------------------------------------------------------------------------

    @rule(to=st.sampled_from(TARGETS), repeat=st.booleans(),
          max_attempts=st.sampled_from([1, 2, LOCAL.max_attempts]))
    def enqueue(self, to: str, repeat: bool, max_attempts: int) -> None:
        target = to
        if repeat and self.accepted:  # an idempotent resend of an accepted message
            mid = sorted(self.accepted)[self.n % len(self.accepted)]
            target = self.accepted[mid]
        else:
            self.n += 1
            mid = f"m{self.n}"
        ok, result = self.write(lambda: self.j.enqueue(
            NewMessage(mid, target, f"body of {mid}", max_attempts=max_attempts),
            self.clock.now()))
        if ok:
            assert result.created == (mid not in self.accepted)
            self.accepted[mid] = target

    def claim(self, worker: str, limit: int) -> None:
        busy = {r.target for r in self.held[worker].values()}
        ok, result = self.write(lambda: self.j.claim(worker, self.clock.now(), limit=limit,
                                                     lease=LEASE, exclude=busy))
        if ok:
            for row in result.rows:
                assert row.target not in busy
                # A takeover leaves the old holder believing it still holds the row:
                # fencing must refuse whatever it does with it later.
                self.held[worker][row.message_id] = row

    def finish(self, worker: str, mid: str, chain: bool) -> None:
        row = self.held[worker].pop(mid)
        owned = self.owns(worker, mid)
        ok, following = self.write(lambda: self.j.complete_turn(
            worker, row.target, [mid], [TurnEntry("user", row.content, True, mid),
                                        TurnEntry("assistant", f"reply to {mid}")],
            self.clock.now(), next_lease=LEASE if chain else None), owned=owned)
        if ok:
            self.committed[mid] += 1
            if following is not None:
                self.held[worker][following.message_id] = following

    def fail(self, worker: str, mid: str) -> None:
        self.held[worker].pop(mid)
        owned = self.owns(worker, mid)
        self.write(lambda: self.j.retry(worker, mid, "RuntimeError: the brain raised",
                                        self.clock.now()), owned=owned)

    def release(self, worker: str, mid: str) -> None:
        self.held[worker].pop(mid)
        owned = self.owns(worker, mid)
        self.write(lambda: self.j.release(worker, [mid], self.clock.now()), owned=owned)

    def crash(self, worker: str, takeover: bool) -> None:
        """The worker's process dies; a restart takes over its leases, or they expire."""
        self.held[worker].clear()
        if takeover:
            self.write(lambda: self.j.expire_leases(self.clock.now(), owners=[worker]))

    def renew(self, worker: str) -> None:
        targets = sorted({r.target for r in self.held[worker].values()})
        if targets:
            now = self.clock.now()
            self.write(lambda: self.j.renew(worker, targets, now + LEASE, now))

    ACTIONS = ("claim", "claim", "claim", "finish", "finish", "finish", "finish", "fail",
               "fail", "release", "renew", "crash", "crash_takeover")
    """What a worker does next, weighted (a turn mostly commits; crashes are rarer)."""

    @rule(worker=st.sampled_from(WORKERS), action=st.sampled_from(ACTIONS),
          i=st.integers(0, 5), chain=st.booleans(), limit=st.integers(1, 3))
    def act(self, worker: str, action: str, i: int, chain: bool, limit: int) -> None:
        """One worker acts; the other, meanwhile, is paused (it may hold stale leases)."""
        held = sorted(self.held[worker])
        mid = held[i % len(held)] if held else None
        if action == "claim" or (mid is None and action in ("finish", "fail", "release")):
            self.claim(worker, limit)
        elif action == "finish" and mid is not None:
            self.finish(worker, mid, chain)
        elif action == "fail" and mid is not None:
            self.fail(worker, mid)
        elif action == "release" and mid is not None:
            self.release(worker, mid)
        elif action == "renew":
            self.renew(worker)
        elif action.startswith("crash"):
            self.crash(worker, takeover=action == "crash_takeover")

    act_again = act  # workers act twice as often as messages arrive or time moves

    @rule(seconds=st.sampled_from([0.5, 2.0, 5.0, 16.0, LEASE, LEASE + 1, 90.0, 3600.0]))
    def time_passes(self, seconds: float) -> None:
        """The clock moves or jumps; a worker that does not act meanwhile is paused."""
        self.clock.advance(seconds)

    @rule(at=st.integers(0, 8), on_commit=st.booleans())
    def busy(self, at: int, on_commit: bool) -> None:
        """The next write meets a locked database (at one of its statements, or its COMMIT)."""
        self.world.faults.arm(at, on_commit)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def the_guarantees_hold(self) -> None:
        rows = self.rows()
        markers = self.markers()
        assert set(self.accepted) <= set(rows), "an accepted message is missing"
        assert all(n == 1 for n in markers.values()), "a message committed two turns"
        assert markers == +self.committed, "markers disagree with the commits that returned"
        in_flight = Counter(r[5] for r in rows.values() if r[0] == State.PROCESSING.value)
        assert all(n <= 1 for n in in_flight.values()), f"two rows in flight: {in_flight}"
        for mid, (status, _, _, attempts, max_attempts, _, _) in rows.items():
            assert 0 <= attempts <= max_attempts, (mid, attempts, max_attempts)
            assert (status == State.DELIVERED.value) == (mid in markers), (mid, status)
            before = self.prev.get(mid, State.PENDING.value)
            assert (before, status) in LEGAL, f"{mid}: {before} -> {status}"
        self.prev = {mid: r[0] for mid, r in rows.items()}

    def teardown(self) -> None:
        """Heal: errors off, a healthy worker drains; every accepted id ends terminal."""
        self.world.faults.disarm()
        for _ in range(LOCAL.max_attempts * 4 + len(self.accepted) + 4):
            self.clock.advance(3600.0)  # past every lease and backoff
            claimed = self.j.claim("healer", self.clock.now(), limit=64, lease=LEASE)
            if not claimed.rows and not claimed.acked_by_marker:
                break
            for row in claimed.rows:
                self.j.complete_turn("healer", row.target, [row.message_id],
                                     [TurnEntry("user", row.content, True, row.message_id)],
                                     self.clock.now())
                self.committed[row.message_id] += 1
        self.the_guarantees_hold()
        rows = self.rows()
        open_rows = {m: rows[m][0] for m in self.accepted if rows[m][0] not in TERMINAL_STATES}
        assert open_rows == {}, f"accepted ids never reached a terminal state: {open_rows}"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path / "sim.db")
    yield w
    w.close()


def run(world: World, examples: int, steps: int, derandomize: bool = False) -> None:
    Delivery.world = world
    run_state_machine_as_test(Delivery, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
        derandomize=derandomize,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]))


@pytest.mark.timeout(300)
def test_delivery_simulation(world: World) -> None:
    run(world, examples=200, steps=50, derandomize=True)  # the same 200 runs every time


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_delivery_simulation_long(world: World, request: pytest.FixtureRequest) -> None:
    # About 7 minutes on one core: only when asked for by marker (``-m slow``).
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the 5,000 x 100 simulation runs only with -m slow")
    run(world, examples=5_000, steps=100)
