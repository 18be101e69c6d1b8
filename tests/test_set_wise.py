"""Set-wise writes: a batch of enqueues or turn commits gives what one-by-one gives.

Each test holds the writer on a gate so that the calls under test queue up
and land in one batch, then checks both that the set-wise path ran (the
writer's counters) and that every caller got the answer, and the database
the rows, that running the calls one at a time would give.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.persistence import (
    DatabaseFailed,
    IdempotencyConflict,
    LeaseLost,
    NewMessage,
    TurnEntry,
    is_sqlite,
)
from kinbox.persistence.writer import Bulk

from .conftest import Stores
from .helpers import FaultyCursor, wait_for

T0 = 1000.0


def in_one_batch(stores: Stores, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` from their own threads so that they share one writer batch, queued
    in the order given.

    Returns each call's result, or the exception it raised.
    """
    gate, inside = threading.Event(), threading.Event()
    blocker = stores.writer.submit(lambda: (inside.set(), gate.wait(10)))
    assert inside.wait(10)
    before = stores.writer.queued()
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for n, t in enumerate(threads, 1):
        t.start()
        wait_for(lambda n=n: stores.writer.queued() == before + n, what="the call to queue up")
    gate.set()
    blocker.result(10)
    for t in threads:
        t.join(10)
    return results


def test_a_bulk_kind_runs_its_batch_at_once_and_answers_each_caller(stores: Stores) -> None:
    seen: list[list[int]] = []
    kind: Bulk[int, int] = Bulk("square", lambda x: x * x,
                                lambda xs: (seen.append(list(xs)), [x * x for x in xs])[1])
    results = in_one_batch(stores, [lambda i=i: stores.writer.call_bulk(kind, i)
                                    for i in range(5)])
    assert sorted(results) == [0, 1, 4, 9, 16]
    assert all(results[i] == i * i for i in range(5))
    assert [sorted(s) for s in seen] == [[0, 1, 2, 3, 4]]
    assert stores.writer.statistics().bulk_runs == 1


def insert_project(stores: Stores, pid: str) -> str:
    stores.tables.project.insert(id=pid, slug=pid, name=pid, created_at=0).execute()
    return pid


def test_a_failing_bulk_run_is_undone_and_its_items_run_one_by_one(stores: Stores) -> None:
    def one(pid: str) -> str:
        if pid == "bad":
            insert_project(stores, "bad-half")
            raise ValueError("bad item")
        return insert_project(stores, pid)

    def many(pids: list[str]) -> list[str]:
        for pid in pids:
            insert_project(stores, f"bulk-{pid}")  # written, then undone with the savepoint
        raise RuntimeError("the set-wise path gives up")

    kind: Bulk[str, str] = Bulk("projects", one, many)
    results = in_one_batch(stores, [lambda p=p: stores.writer.call_bulk(kind, p)
                                    for p in ("a", "bad", "b")])
    assert results[0] == "a" and results[2] == "b"
    assert isinstance(results[1], ValueError)
    assert {p.slug for p in stores.store.projects()} == {"a", "b"}
    assert stores.writer.statistics().bulk_fallbacks == 1


def test_kinds_share_a_savepoint_and_one_kind_failing_reruns_the_others_once_each(
        stores: Stores) -> None:
    good_runs: list[list[str]] = []

    def good_many(pids: list[str]) -> list[str]:
        good_runs.append(list(pids))
        return [insert_project(stores, p) for p in pids]

    def bad_many(pids: list[str]) -> list[str]:
        for pid in pids:
            insert_project(stores, f"half-{pid}")  # written, then undone
        raise RuntimeError("the set-wise path gives up")

    good: Bulk[str, str] = Bulk("good", lambda p: insert_project(stores, p), good_many)
    bad: Bulk[str, str] = Bulk("bad", lambda p: insert_project(stores, f"one-{p}"), bad_many)
    calls = [lambda k=k, p=p: stores.writer.call_bulk(k, p)
             for k, p in ((good, "g1"), (bad, "b1"), (good, "g2"), (bad, "b2"))]
    results = in_one_batch(stores, calls)
    assert results == ["g1", "one-b1", "g2", "one-b2"]
    # The good kind ran twice set-wise (with the others, undone; then on its own), its
    # rows are there once; the bad kind's half-written rows are gone.
    assert [sorted(r) for r in good_runs] == [["g1", "g2"], ["g1", "g2"]]
    assert {p.slug for p in stores.store.projects()} == {"g1", "g2", "one-b1", "one-b2"}
    assert stores.writer.statistics().bulk_fallbacks == 1


def test_a_bulk_run_with_the_wrong_number_of_results_is_undone(stores: Stores) -> None:
    kind: Bulk[str, str] = Bulk("projects", lambda p: insert_project(stores, p),
                                lambda ps: [insert_project(stores, f"x-{p}") for p in ps][:1])
    results = in_one_batch(stores, [lambda p=p: stores.writer.call_bulk(kind, p)
                                    for p in ("a", "b")])
    assert sorted(results) == ["a", "b"]
    assert {p.slug for p in stores.store.projects()} == {"a", "b"}


def enqueue(stores: Stores, mid: str, target: str, content: str = "hi") -> Callable[[], Any]:
    return lambda: stores.journal.enqueue(NewMessage(mid, target, content, sender="s0"), T0)


def test_enqueues_in_one_batch_get_distinct_ordered_seqs(stores: Stores) -> None:
    results = in_one_batch(stores, [enqueue(stores, f"m{i}", f"s{i % 3}") for i in range(9)])
    assert all(r.created and r.status == "pending" for r in results)
    rows = stores.journal.rows()
    assert sorted(r["message_id"] for r in rows) == [f"m{i}" for i in range(9)]
    seqs = [r["seq"] for r in rows]
    assert len(set(seqs)) == 9 and seqs == sorted(seqs)
    assert stores.writer.statistics().bulk_runs >= 1


def test_a_repeat_and_a_conflict_in_a_batch_get_their_own_answers(stores: Stores) -> None:
    stores.journal.enqueue(NewMessage("old", "s1", "hi", sender="s0"), T0)
    results = in_one_batch(stores, [enqueue(stores, "new1", "s1"),
                                    enqueue(stores, "old", "s1"),
                                    enqueue(stores, "old", "s1", "other text"),
                                    enqueue(stores, "new2", "s2")])
    assert results[0].created and results[3].created
    assert results[1].created is False
    assert isinstance(results[2], IdempotencyConflict)
    assert sorted(r["message_id"] for r in stores.journal.rows()) == ["new1", "new2", "old"]
    assert stores.writer.statistics().bulk_fallbacks >= 1


@pytest.mark.timeout(60)
def test_a_repeat_with_another_payload_in_a_batch_is_a_conflict(stores: Stores) -> None:
    """Set-wise enqueues fall back to the one-by-one rule, which compares payloads too."""
    j = stores.journal
    j.enqueue(NewMessage("old", "s1", "hi", sender="s0", payload={"n": 1}), T0)

    def again(payload: dict[str, Any]) -> Callable[[], Any]:
        return lambda: j.enqueue(NewMessage("old", "s1", "hi", sender="s0", payload=payload), T0)
    results = in_one_batch(stores, [enqueue(stores, "new1", "s1"), again({"n": 1}),
                                    again({"n": 2})])
    assert results[0].created and results[1].created is False
    assert isinstance(results[2], IdempotencyConflict)
    assert j.get("old")["payload"] == {"n": 1}


def commit(stores: Stores, owner: str, session: str, mid: str) -> Callable[[], Any]:
    return lambda: stores.journal.complete_turn(
        owner, session, [mid], [TurnEntry("user", mid, True, mid), TurnEntry("assistant", "ok")],
        T0 + 1, next_lease=30.0)


def test_turn_commits_in_one_batch_ack_record_and_lease_each_next_row(stores: Stores) -> None:
    j = stores.journal
    stores.store.create_project("p", "p", "p", T0)
    stores.store.create_many([(s, "p", s, "interactive") for s in ("s1", "s2", "s3")], T0)
    for n in (1, 2):
        for s in ("s1", "s2", "s3"):
            j.enqueue(NewMessage(f"{s}-{n}", s, "hi", sender="s0"), T0)
    heads = j.claim("w1", T0).rows
    assert sorted(r.message_id for r in heads) == ["s1-1", "s2-1", "s3-1"]
    following = in_one_batch(stores, [commit(stores, "w1", r.target, r.message_id)
                                      for r in heads])
    assert [f.message_id for f in following] == [f"{r.target}-2" for r in heads]
    assert {r["message_id"]: r["status"] for r in j.rows()} == {
        "s1-1": "delivered", "s2-1": "delivered", "s3-1": "delivered",
        "s1-2": "processing", "s2-2": "processing", "s3-2": "processing"}
    assert all(r["lease_owner"] == "w1" for r in j.rows(state="processing"))
    assert {stores.store.session(s).status for s in ("s1", "s2", "s3")} == {"active"}
    last = in_one_batch(stores, [commit(stores, "w1", f.target, f.message_id)
                                 for f in following])
    assert last == [None, None, None]
    assert {stores.store.session(s).status for s in ("s1", "s2", "s3")} == {"idle"}
    assert stores.store.marker_counts() == {f"{s}-{n}": 1 for s in ("s1", "s2", "s3")
                                            for n in (1, 2)}
    assert [(e.role, e.text) for e in stores.store.transcript("s2")] == [
        ("user", "s2-1"), ("assistant", "ok"), ("user", "s2-2"), ("assistant", "ok")]
    assert stores.writer.statistics().bulk_runs >= 2


def test_commits_in_one_batch_chain_only_into_due_heads_that_are_not_suspect(
        stores: Stores) -> None:
    j = stores.journal
    for n in (1, 2):
        for s in ("s1", "s2", "s3"):
            j.enqueue(NewMessage(f"{s}-{n}", s, "hi", sender="s0"), T0)
    heads = j.claim("w1", T0).rows
    inbox = stores.tables.inbox  # s1's next row waits out a backoff, s2's was taken over
    inbox.update(available_at=T0 + 100).where(inbox.message_id == "s1-2").execute()
    inbox.update(suspect=True).where(inbox.message_id == "s2-2").execute()
    fallbacks = stores.writer.statistics().bulk_fallbacks
    following = in_one_batch(stores, [commit(stores, "w1", r.target, r.message_id)
                                      for r in heads])
    assert {r.target: f and f.message_id for r, f in zip(heads, following, strict=True)} == {
        "s1": None, "s2": None, "s3": "s3-2"}
    assert {r["message_id"]: r["status"] for r in j.rows() if r["message_id"].endswith("-2")
            } == {"s1-2": "pending", "s2-2": "pending", "s3-2": "processing"}
    assert stores.writer.statistics().bulk_fallbacks == fallbacks  # all of it set-wise


def test_a_commit_chains_only_into_a_head_due_at_its_own_time_as_one_by_one_does(
        stores: Stores) -> None:
    j = stores.journal
    for n in (1, 2):
        for s in ("s1", "s2"):
            j.enqueue(NewMessage(f"{s}-{n}", s, "hi", sender="s0"), T0)
    heads = {r.target: r for r in j.claim("w1", T0).rows}
    inbox = stores.tables.inbox  # due after s1's commit but before s2's
    inbox.update(available_at=T0 + 1.5).where(inbox.message_id == "s1-2").execute()

    def commit_at(session: str, at: float) -> Callable[[], Any]:
        return lambda: j.complete_turn("w1", session, [heads[session].message_id],
                                       [TurnEntry("assistant", "ok")], at, next_lease=30.0)
    following = in_one_batch(stores, [commit_at("s1", T0 + 1), commit_at("s2", T0 + 2)])
    assert [f and f.message_id for f in following] == [None, "s2-2"]


def test_a_commit_chains_into_a_row_sent_after_its_time_that_was_written_before_it(
        stores: Stores) -> None:
    # The commit's time is read on its session's thread before it queues; a send stamped
    # later lands first (its kind runs first in the batch). Judged at the commit's own time
    # that row is not due, and nothing else would hand it over before the next tick.
    j = stores.journal
    j.enqueue(NewMessage("s1-1", "s1", "hi", sender="s0"), T0)
    (head,) = j.claim("w1", T0).rows
    results = in_one_batch(stores, [
        lambda: j.enqueue(NewMessage("s2-1", "s2", "hi", sender="s0"), T0 + 2),
        lambda: j.enqueue(NewMessage("s1-2", "s1", "later", sender="s0"), T0 + 2),
        lambda: j.complete_turn("w1", "s1", [head.message_id], [TurnEntry("assistant", "ok")],
                                T0 + 1, next_lease=30.0)])
    following = results[2]
    assert following is not None and following.message_id == "s1-2"
    assert j.get("s1-2")["status"] == "processing"


def test_a_commit_one_by_one_chains_into_a_row_sent_after_its_time_too(
        stores: Stores) -> None:
    j = stores.journal
    j.enqueue(NewMessage("s1-1", "s1", "hi", sender="s0"), T0)
    (head,) = j.claim("w1", T0).rows
    j.enqueue(NewMessage("s1-2", "s1", "later", sender="s0"), T0 + 2)
    # A commit that enqueues (a reply to s0) goes one by one.
    following = j.complete_turn("w1", "s1", [head.message_id], [TurnEntry("assistant", "ok")],
                                T0 + 1, enqueue=[NewMessage("r-1", "s0", "done", sender="s1")],
                                next_lease=30.0)
    assert following is not None and following.message_id == "s1-2"


def test_a_clock_set_back_does_not_let_a_commit_chain_into_a_backoff_that_has_not_ended(
        stores: Stores) -> None:
    # A send stamped an hour ahead (the clock was set back since): the latest stamp written
    # counts for at most CHAIN_SLACK past the commit's own time.
    j = stores.journal
    j.enqueue(NewMessage("s1-1", "s1", "hi", sender="s0"), T0)
    j.enqueue(NewMessage("s1-2", "s1", "backing off", sender="s0"), T0)
    j.enqueue(NewMessage("s2-1", "s2", "from before the step", sender="s0"), T0 + 3600)
    (head,) = j.claim("w1", T0, exclude={"s2"}).rows
    inbox = stores.tables.inbox
    inbox.update(available_at=T0 + 5).where(inbox.message_id == "s1-2").execute()
    following = j.complete_turn("w1", "s1", [head.message_id], [TurnEntry("assistant", "ok")],
                                T0, next_lease=30.0)
    assert following is None
    assert j.get("s1-2")["status"] == "pending"


def test_a_lost_lease_in_a_batch_fails_only_its_own_commit(stores: Stores) -> None:
    j = stores.journal
    for s in ("s1", "s2", "s3"):
        j.enqueue(NewMessage(f"{s}-1", s, "hi", sender="s0"), T0)
    heads = j.claim("w1", T0, lease=5).rows
    j.claim("w2", T0 + 10, lease=5, exclude={"s1", "s3"})  # w2 takes s2 over after expiry
    results = in_one_batch(stores, [commit(stores, "w1", r.target, r.message_id)
                                    for r in heads])
    by_target = dict(zip([r.target for r in heads], results, strict=True))
    assert isinstance(by_target["s2"], LeaseLost)
    assert by_target["s1"] is None and by_target["s3"] is None
    assert stores.store.marker_counts() == {"s1-1": 1, "s3-1": 1}
    assert j.get("s2-1")["lease_owner"] == "w2"
    assert stores.store.transcript("s2") == []


def test_releases_in_one_batch_hand_back_each_row_and_a_lost_lease_fails_only_its_own(
        stores: Stores) -> None:
    j = stores.journal
    for s in ("s1", "s2", "s3"):
        j.enqueue(NewMessage(f"{s}-1", s, "hi", sender="s0"), T0)
    heads = j.claim("w1", T0, lease=5).rows
    j.claim("w2", T0 + 10, lease=5, exclude={"s1", "s3"})  # w2 takes s2 over after expiry
    bulk_runs = stores.writer.statistics().bulk_runs
    results = in_one_batch(stores, [
        lambda r=r: j.release("w1", [r.message_id], T0 + 11) for r in heads])
    by_target = dict(zip([r.target for r in heads], results, strict=True))
    assert isinstance(by_target["s2"], LeaseLost)
    assert by_target["s1"] is None and by_target["s3"] is None
    assert stores.writer.statistics().bulk_fallbacks >= 1  # tried set-wise, then one by one
    rows = {r["message_id"]: (r["status"], r["lease_owner"]) for r in j.rows()}
    assert rows == {"s1-1": ("pending", None), "s3-1": ("pending", None),
                    "s2-1": ("processing", "w2")}
    again = j.claim("w3", T0 + 12, lease=5, exclude={"s2"}).rows  # released: claimable now
    assert sorted(r.message_id for r in again) == ["s1-1", "s3-1"]
    for r in again:
        assert r.attempts == 0 and not r.taken_over  # a release counts no attempt
    fine = in_one_batch(stores, [lambda r=r: j.release("w3", [r.message_id], T0 + 13)
                                 for r in again])
    assert fine == [None, None]
    assert stores.writer.statistics().bulk_runs > bulk_runs
    assert j.counts() == {"pending": 2, "processing": 1}


@pytest.mark.parametrize("size", [1, 450])
def test_large_batches_split_their_statements(stores: Stores, size: int) -> None:
    results = in_one_batch(stores, [enqueue(stores, f"m{i:04d}", f"s{i % 7}")
                                    for i in range(size)])
    assert all(r.created for r in results)
    assert stores.journal.counts() == {"pending": size}


@pytest.mark.parametrize("plain_first", [True, False])
def test_a_failing_bulk_run_is_undone_and_the_plain_operation_of_its_batch_kept(
        stores: Stores, plain_first: bool) -> None:
    # After a plain operation the bulk run has a savepoint of its own; first in its
    # transaction it has none on SQLite, and undoing it begins the transaction again.
    def many(pids: list[str]) -> list[str]:
        for pid in pids:
            insert_project(stores, f"bulk-{pid}")  # written, then undone
        raise RuntimeError("the set-wise path gives up")

    kind: Bulk[str, str] = Bulk("projects", lambda p: insert_project(stores, p), many)
    plain = [lambda: stores.writer.call(lambda: insert_project(stores, "plain"))]
    bulk = [lambda p=p: stores.writer.call_bulk(kind, p) for p in ("a", "b")]
    calls = plain + bulk if plain_first else bulk + plain
    expected = ["plain", "a", "b"] if plain_first else ["a", "b", "plain"]
    statements: list[str] = []
    if is_sqlite(stores.db):  # what the writer's own connection runs
        stores.writer.call(lambda: stores.db.connection().set_trace_callback(statements.append))
    assert in_one_batch(stores, calls) == expected
    assert {p.slug for p in stores.store.projects()} == {"plain", "a", "b"}
    assert stores.writer.statistics().bulk_fallbacks == 1
    if is_sqlite(stores.db):
        bulk_savepoints = [s for s in statements if s.startswith("SAVEPOINT kinbox_bulk")]
        assert bool(bulk_savepoints) == plain_first
        assert ("ROLLBACK" in statements) == (not plain_first)


def test_a_busy_restart_fails_the_batch_with_the_busy_error_and_keeps_nothing(
        stores: Stores, monkeypatch: pytest.MonkeyPatch) -> None:
    if not is_sqlite(stores.db):
        pytest.skip("the restart is SQLite's (PostgreSQL keeps the savepoint)")
    armed = [False]

    def busy_begin(sql: str) -> None:  # once armed, the next BEGIN IMMEDIATE is busy
        if armed[0] and sql == "BEGIN IMMEDIATE":
            armed[0] = False
            raise sqlite3.OperationalError("database is locked")

    cursor = stores.db.cursor
    monkeypatch.setattr(stores.db, "cursor",
                        lambda *a, **k: FaultyCursor(cursor(*a, **k), busy_begin))

    def many(pids: list[str]) -> list[str]:
        for pid in pids:
            insert_project(stores, f"bulk-{pid}")
        armed[0] = True  # the transaction begun again after the rollback is busy
        raise RuntimeError("the set-wise path gives up")

    kind: Bulk[str, str] = Bulk("projects", lambda p: insert_project(stores, p), many)
    results = in_one_batch(stores, [lambda p=p: stores.writer.call_bulk(kind, p)
                                    for p in ("a", "b")])
    # Every caller gets the busy error (not "no transaction is active"), as a kinbox
    # error, nothing is kept, and the writer goes on.
    assert all(isinstance(r, DatabaseFailed) and r.kind == "OperationalError"
               for r in results), results
    assert all(isinstance(r.__cause__, sqlite3.OperationalError) for r in results)
    assert all("locked" in str(r) for r in results)
    assert stores.store.projects() == []
    stores.writer.call(lambda: insert_project(stores, "after"))
    assert [p.slug for p in stores.store.projects()] == ["after"]


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.timeout(120)
def test_large_rows_written_set_wise_are_not_kept_in_memory_after_their_commit(
        tmp_path: Any) -> None:
    """Python's sqlite3 keeps every statement it cached (one per row count of a multi-row
    insert) with the values last bound to it: batches of 1 to 60 messages of 40 kB kept
    73 MB of message text per table alive after their commits, for the process's life."""
    stores = Stores(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        body = "x" * 40_000
        before = _rss_mb()
        for n in range(1, 61):
            stores.journal.enqueue_many(
                [NewMessage(f"m{n}-{i}", "s", body) for i in range(n)], T0)
            rows = [("s", "assistant", body, True, f"m{n}-{i}", None, "message", T0)
                    for i in range(n)]
            stores.writer.call(lambda rows=rows: stores.journal.bulk.insert_entries(rows))
        grown = _rss_mb() - before
    finally:
        stores.close()
    assert grown < 40, f"{grown:.0f} MB kept after the commits"
