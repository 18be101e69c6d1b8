"""Claims on PostgreSQL from several connections at once, and the server's clock.

Every claimer here has its own connection and writer, as separate processes
would: PostgreSQL's row locks (``FOR UPDATE SKIP LOCKED``) and the head rule
are what keep them apart, not anything shared in this interpreter.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from typing import Any

import pytest

from kinbox.persistence import (
    DatabaseClock,
    DatabaseFailed,
    Journal,
    LeaseLost,
    NewMessage,
    TurnEntry,
    WriterClosed,
    open_database,
)

from .conftest import Stores
from .helpers import wait_for

pytestmark = pytest.mark.postgres

CLAIMERS = 4
TARGETS = 30
MESSAGES = 600


@pytest.mark.timeout(90)
def test_concurrent_claimers_never_lease_one_row_twice_and_skip_no_head(pg_url: str) -> None:
    stores = [Stores(pg_url) for _ in range(CLAIMERS)]
    try:
        sender = stores[0].journal
        now = time.time()
        msgs = [NewMessage(f"m{i:04d}", f"t{i % TARGETS:02d}", f"hello {i}", sender="u")
                for i in range(MESSAGES)]
        sender.enqueue_many(msgs, now)
        held: dict[str, str] = {}  # message id -> the claimer holding it now
        in_flight: dict[str, str] = {}  # target -> the claimer running it now
        lock = threading.Lock()
        done: list[str] = []
        errors: list[str] = []
        leases: Counter[str] = Counter()
        by_owner: Counter[str] = Counter()

        def claimer(k: int) -> None:
            owner, journal = f"w{k}", stores[k].journal
            while True:
                with lock:
                    if len(done) + len(errors) >= MESSAGES or errors:
                        return
                result = journal.claim(owner, time.time(), limit=8)
                for row in result.rows:
                    with lock:
                        leases[row.message_id] += 1
                        if row.message_id in held:
                            errors.append(f"{row.message_id} leased by {held[row.message_id]} "
                                          f"and {owner}")
                        if row.target in in_flight:
                            errors.append(f"{row.target} in flight at {in_flight[row.target]} "
                                          f"and {owner}")
                        held[row.message_id] = owner
                        by_owner[owner] += 1
                        in_flight[row.target] = owner
                for row in result.rows:
                    with lock:
                        held.pop(row.message_id)
                        in_flight.pop(row.target)
                        done.append(row.message_id)
                    # Released from our books first: the commit makes the next row claimable.
                    journal.complete_turn(owner, row.target, [row.message_id],
                                          [TurnEntry("assistant", "ok")], time.time())

        threads = [threading.Thread(target=claimer, args=(k,)) for k in range(CLAIMERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(80)
        assert errors == []
        assert sorted(done) == sorted(m.message_id for m in msgs)  # no head skipped
        assert set(leases.values()) == {1}
        assert sender.counts() == {"delivered": MESSAGES}
        # Per-target order: each target's rows were committed in seq order.
        order: dict[str, list[str]] = defaultdict(list)
        for mid in done:
            order[f"t{int(mid[1:]) % TARGETS:02d}"].append(mid)
        assert all(mids == sorted(mids) for mids in order.values())
        assert len(by_owner) == CLAIMERS  # the rows were really shared
    finally:
        for s in stores:
            s.close()


@pytest.mark.timeout(30)
def test_a_commit_after_another_claimer_took_over_is_refused(pg_url: str) -> None:
    a, b = Stores(pg_url), Stores(pg_url)
    try:
        now = time.time()
        a.journal.enqueue(NewMessage("m1", "s1", "hi", sender="u"), now)
        assert [r.message_id for r in a.journal.claim("A", now, lease=1.0).rows] == ["m1"]
        assert b.journal.claim("B", now + 0.5).rows == []  # A's lease still holds
        assert [r.message_id for r in b.journal.claim("B", now + 1.5).rows] == ["m1"]
        with pytest.raises(LeaseLost):
            a.journal.complete_turn("A", "s1", ["m1"], [TurnEntry("assistant", "late")],
                                    now + 2)
        b.journal.complete_turn("B", "s1", ["m1"], [TurnEntry("assistant", "ok")], now + 2)
        assert a.db.execute_sql("SELECT message_id, COUNT(*) FROM delivery_markers "
                                "GROUP BY message_id").fetchall() == [("m1", 1)]
    finally:
        a.close()
        b.close()


class SteppedClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.timeout(30)
def test_the_database_clock_tells_the_servers_time_and_reads_it_only_every_resync(
        pg_url: str) -> None:
    db = open_database(pg_url)
    mono = SteppedClock()
    clock = DatabaseClock(db, resync=2.0, monotonic=mono)  # type: ignore[arg-type]
    try:
        server = float(db.execute_sql("SELECT EXTRACT(EPOCH FROM clock_timestamp())")
                       .fetchone()[0])
        assert abs(clock.now() - server) < 0.5
        reads = clock.reads
        first = clock.now()
        mono.t += 1.5  # within resync: carried forward by the monotonic clock, no read
        assert clock.now() == pytest.approx(first + 1.5)
        assert clock.reads == reads
        mono.t += 1.0  # past resync: read again (by its reader thread), once
        later = clock.now()
        assert later >= first + 1.5  # never earlier than what it said before
        wait_for(lambda: clock.reads == reads + 1, 10, "the clock's next read")
        assert clock.now() >= later
        assert clock.reads == reads + 1
    finally:
        clock.close()
        db.close()


@pytest.mark.timeout(30)
def test_a_read_of_the_servers_clock_that_hangs_holds_up_no_caller_of_now(
        pg_url: str) -> None:
    """A resync read ran on whichever thread asked the time past ``resync``, under the
    clock's lock: one that hung (a server gone without a word) held up every thread of
    the runtime, the event loop among them, each asking the time."""
    db = open_database(pg_url)
    mono = SteppedClock()
    clock = DatabaseClock(db, resync=2.0, monotonic=mono)  # type: ignore[arg-type]
    hung, release = threading.Event(), threading.Event()
    real = clock._read_once

    def read_once() -> Any:
        hung.set()
        assert release.wait(20)  # the network does not answer
        return real()

    clock._read_once = read_once  # type: ignore[method-assign]
    try:
        before = clock.now()
        mono.t += 3.0  # past resync
        answers: list[float] = []
        askers = [threading.Thread(target=lambda: answers.append(clock.now()))
                  for _ in range(3)]
        for t in askers:
            t.start()
        assert hung.wait(10)
        for t in askers:
            t.join(5)
        assert len(answers) == 3  # each answered while the read hangs
        assert all(a >= before + 3.0 for a in answers)  # carried forward
    finally:
        release.set()
        clock.close()
        db.close()


@pytest.mark.timeout(60)
def test_workers_starting_at_once_on_an_empty_database_all_start(pg_url: str) -> None:
    # reset_postgres left no tables: every runtime finds the schema missing at once.
    from kinbox.actors import Runtime

    from .helpers import quiet_brain

    barrier = threading.Barrier(4)
    started: list[Runtime] = []
    failed: list[BaseException] = []

    def start() -> None:
        barrier.wait()
        try:
            started.append(Runtime(db=pg_url, brain=quiet_brain).start())
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(50)
    for rt in started:
        rt.stop()
    assert failed == [] and len(started) == 4


@pytest.mark.timeout(60)
def test_a_claim_runs_beside_a_busy_writer_and_not_once_the_writer_stopped(
        pg_url: str) -> None:
    stores = Stores(pg_url)
    release = threading.Event()
    try:
        journal, now = stores.journal, time.time()
        journal.enqueue_many([NewMessage(f"m{i}", f"t{i}", "x", sender="u") for i in range(3)],
                             now)
        # The writer is stuck in an operation (a long turn commit, say) ...
        stuck = stores.writer.submit(lambda: release.wait(30))
        claimed: list[str] = []
        claimer = threading.Thread(target=lambda: claimed.extend(
            r.message_id for r in journal.claim("w", now, limit=2).rows))
        claimer.start()
        claimer.join(10)
        # ... and a claim, a transaction of its own on its caller's connection, commits.
        assert not claimer.is_alive() and claimed == ["m0", "m1"]
        assert stores.writer.queued() == 0 and not release.is_set()
        other = Stores(pg_url)  # another process sees the leases committed
        try:
            assert {r["message_id"] for r in other.journal.rows(state="processing")} == {
                "m0", "m1"}
        finally:
            other.close()
        release.set()
        assert stuck.result(10) is True
        stores.writer.stop()
        with pytest.raises(WriterClosed):
            journal.claim("w", now, limit=2)
        assert [r["message_id"] for r in journal.rows(state="pending")] == ["m2"]
    finally:
        release.set()
        stores.close()


@pytest.mark.timeout(30)
def test_a_claim_whose_takeover_part_fails_hands_back_the_rows_it_had_leased(
        pg_url: str) -> None:
    """A claim leases its plain rows in one statement, then takes over a dead worker's row
    in a transaction of its own. When that transaction failed (here a lock the takeover's
    history insert waits for, held by a stuck client), the claim raised and the plain
    rows stayed leased to a live worker that never started them: a lease's time lost,
    and then they came back as suspects, run one at a time. They are handed back now."""
    s = Stores(pg_url)
    stuck = open_database(pg_url)
    try:
        j, now = s.journal, 1000.0
        j.enqueue(NewMessage("dead-row", "s0", "hi", sender="u"), now)
        assert [r.message_id for r in j.claim("dead", now, lease=5).rows] == ["dead-row"]
        j.mark_turn_started("dead", "dead-row", now)  # its takeover writes a history row
        j.enqueue(NewMessage("plain", "s1", "hi", sender="u"), now)
        with stuck.atomic():
            stuck.execute_sql("LOCK TABLE agent_inbox_events IN EXCLUSIVE MODE")
            s.db.execute_sql("SET lock_timeout = '200ms'")  # the claim's connection
            with pytest.raises(DatabaseFailed):
                j.claim("live", now + 10, lease=30)
        s.db.execute_sql("RESET lock_timeout")
        rows = {r["message_id"]: (r["status"], r["lease_owner"]) for r in j.rows()}
        assert rows == {"dead-row": ("processing", "dead"), "plain": ("pending", None)}
        claimed = j.claim("live", now + 11, lease=30).rows
        assert {(r.message_id, r.taken_over) for r in claimed} == {
            ("plain", False), ("dead-row", True)}
    finally:
        stuck.close()
        s.close()


@pytest.mark.timeout(30)
def test_a_dead_workers_row_is_taken_over_oldest_first_not_after_the_backlog(
        stores: Stores) -> None:
    """A claim with room for ``limit`` rows leases the oldest due heads, a dead worker's
    row among them (SQLite's claim does). PostgreSQL's leased the plain pending heads
    first and took over only with room to spare: while other sessions kept every claim
    full, the dead worker's session (its row, and every message after it) waited for
    the whole backlog to drain, though it was the oldest, and its owner long gone."""
    claims_the_dead_row_first(stores.journal, 1000.0)


def claims_the_dead_row_first(j: Journal, now: float) -> None:
    """A worker dies mid-turn on ``dead-row``, three sessions' messages come after it; a
    live runtime's claim of two, once the dead lease ran out, takes the dead row and the
    oldest plain one."""
    j.enqueue(NewMessage("dead-row", "s0", "hi", sender="u"), now)
    assert [r.message_id for r in j.claim("dead", now, lease=5).rows] == ["dead-row"]
    j.mark_turn_started("dead", "dead-row", now)
    j.enqueue_many([NewMessage(f"m{i}", f"s{i}", "hi", sender="u") for i in range(1, 4)],
                   now + 1)
    claimed = j.claim("live", now + 10, limit=2, lease=30).rows
    assert {(r.message_id, r.taken_over) for r in claimed} == {
        ("dead-row", True), ("m1", False)}


@pytest.mark.timeout(60)
def test_a_dead_workers_row_behind_many_running_turns_is_taken_over_in_a_backlog(
        pg_url: str) -> None:
    """As above, with more turns running elsewhere (older rows, live leases) than the
    claim's first window of processing rows holds: the dead worker's row lay past it, and
    the claim, full of plain heads, read no further."""
    s = Stores(pg_url)
    try:
        j, now = s.journal, 1000.0
        running = 40  # past the first window (FIRST_WINDOW, 32)
        j.enqueue_many([NewMessage(f"r{i:02d}", f"busy{i:02d}", "hi", sender="u")
                        for i in range(running)], now)
        assert len(j.claim("alive", now, limit=running, lease=600).rows) == running
        claims_the_dead_row_first(j, now)
    finally:
        s.close()
