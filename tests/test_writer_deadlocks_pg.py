"""Two processes' writer batches that lock rows in opposite orders, on PostgreSQL.

Several runtime processes share one PostgreSQL database, and each writer commits a
batch of operations from many threads as one transaction. Operations that lock rows
(a Focal wake-up's admission locks its session row ``FOR UPDATE``) take their locks in
the order they arrived, so two processes' batches can wait for each other: PostgreSQL
then aborts one statement with a deadlock (SQLSTATE 40P01). Under a stricter isolation
a statement or the commit may fail with a serialization failure (40001). Either way
the work was undone whole and may simply run again; its caller must not be told it
failed. The interleavings are made deterministic with barriers inside the operations.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.persistence import DatabaseFailed, JobRecord, JobStore, Reply
from kinbox.persistence.batch_run import CONFLICT_RETRIES
from kinbox.persistence.writer import Bulk

from .conftest import Stores

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]

KINDS = ("reminder",)


def job(job_id: str, chat_id: str) -> JobRecord:
    return JobRecord(job_id, chat_id, "reminder", "", None, None, 5000.0, 5000.0, None, True,
                     0.0)


def one_batch(stores: Stores, ops: list[Callable[[], Any]]) -> list[Reply[Any]]:
    """Submit ``ops`` so that they run in one batch of ``stores``' writer, in this order: a
    first operation holds the writer until all of them are queued."""
    queued = threading.Event()
    gate = stores.writer.submit(lambda: queued.wait(10))
    replies = [stores.writer.submit(op) for op in ops]
    queued.set()
    assert gate.result(10)
    return replies


def two_processes(pg_url: str) -> tuple[Stores, Stores]:
    a, b = Stores(pg_url), Stores(pg_url)
    a.store.ensure_project("p", "p", "P", 0.0)
    for chat in ("s1", "s2"):
        a.store.create_session(chat, "p", chat, "agent", 0.0)
    return a, b


def test_two_batches_admitting_wake_ups_in_opposite_orders_both_commit(pg_url: str) -> None:
    """A's batch admits a wake-up of s1, then one of s2; B's, of s2 then of s1. Each first
    admission locks its session row and waits at the barrier until the other has locked
    its own, so the second admissions wait for each other: a deadlock, which PostgreSQL
    ends by aborting one of them. Every admission must still be made, and its caller
    told so."""
    a, b = two_processes(pg_url)
    try:
        both_locked = threading.Barrier(2, timeout=10)

        def admit(stores: Stores, job_id: str, chat: str, *, first: bool) -> Callable[[], Any]:
            jobs = JobStore(stores.tables, stores.writer)

            def op() -> JobRecord | None:
                made = jobs.create_now(job(job_id, chat), limit_kinds=KINDS, limit=20)
                if first and not both_locked.broken:
                    try:
                        both_locked.wait()
                    except threading.BrokenBarrierError:
                        pass  # a run again after the deadlock: the other is long past it
                return made
            return op

        replies: list[Reply[Any]] = []
        from_a = threading.Thread(target=lambda: replies.extend(one_batch(a, [
            admit(a, "a1", "s1", first=True), admit(a, "a2", "s2", first=False)])))
        from_a.start()
        replies_b = one_batch(b, [admit(b, "b1", "s2", first=True),
                                  admit(b, "b2", "s1", first=False)])
        from_a.join(10)
        outcomes = []
        for reply in [*replies, *replies_b]:
            try:
                outcomes.append(reply.result(30).id)
            except Exception as exc:
                outcomes.append(f"{type(exc).__name__} {getattr(exc, 'sqlstate', None)}")
        assert outcomes == ["a1", "a2", "b1", "b2"]
        jobs = JobStore(a.tables, a.writer)
        assert sorted(j.id for j in jobs.active()) == ["a1", "a2", "b1", "b2"]
        retried = a.writer.statistics().retried_operations + \
            b.writer.statistics().retried_operations
        assert retried == 1
    finally:
        a.close()
        b.close()


def test_a_commit_that_a_serialization_failure_aborted_runs_its_batch_again(
        pg_url: str) -> None:
    """Two writers whose connections run ``SERIALIZABLE`` (a database configured so): A
    reads s1 and writes s2, B reads s2 and writes s1, each before the other commits; A
    commits first, so B's commit fails (40001: write skew). B's batch runs again in a new
    transaction, which reads A's write, and commits; its caller gets that answer."""
    a, b = two_processes(pg_url)
    try:
        for stores in (a, b):
            stores.writer.call(lambda stores=stores: stores.db.execute_sql(
                "SET SESSION default_transaction_isolation = 'serializable'"))
        both_wrote, a_committed = threading.Barrier(2, timeout=10), threading.Event()
        runs: list[str] = []

        def skew(stores: Stores, read: str, write: str) -> Callable[[], int]:
            def op() -> int:
                seen = stores.db.execute_sql(
                    "SELECT count(*) FROM sessions WHERE id = %s AND title = 'taken'",
                    (read,)).fetchone()[0]
                stores.db.execute_sql("UPDATE sessions SET title = 'taken' WHERE id = %s",
                                      (write,))
                runs.append(write)
                if runs.count(write) == 1:  # not in the run again: A committed long ago
                    both_wrote.wait()
                if stores is b:  # B's commit comes after A's
                    assert a_committed.wait(10)
                return int(seen)
            return op

        from_a = a.writer.submit(skew(a, "s1", "s2"))
        from_b = b.writer.submit(skew(b, "s2", "s1"))
        assert from_a.result(20) == 0
        a_committed.set()
        assert from_b.result(20) == 1  # the run again saw A's committed write
        stats = b.writer.statistics()
        assert (stats.retried_batches, stats.rollbacks, runs.count("s1")) == (1, 1, 2)
    finally:
        a.close()
        b.close()


def test_a_conflict_that_comes_back_every_time_reaches_its_caller_after_the_retries(
        pg_url: str) -> None:
    """An operation whose statement PostgreSQL aborts as a deadlock every time (raised by
    the server itself, SQLSTATE 40P01) runs ``1 + CONFLICT_RETRIES`` times, then its
    caller gets the error, marked retryable; the other writes of its batches commit."""
    a, b = two_processes(pg_url)
    try:
        runs: list[int] = []

        def deadlocked() -> None:
            runs.append(1)
            a.db.execute_sql("DO $$ BEGIN RAISE EXCEPTION 'deadlocked' "
                             "USING ERRCODE = '40P01'; END $$")

        s = a.tables.session
        replies = one_batch(a, [deadlocked, lambda: s.update(title="kept").where(
            s.id == "s1").execute()])
        with pytest.raises(DatabaseFailed) as failed:
            replies[0].result(20)
        assert (failed.value.sqlstate, failed.value.retryable) == ("40P01", True)
        assert replies[1].result(20) == 1
        assert len(runs) == 1 + CONFLICT_RETRIES
        assert a.writer.statistics().retried_operations == CONFLICT_RETRIES
        assert b.store.session("s1").title == "kept"
    finally:
        a.close()
        b.close()


def test_an_error_that_is_no_conflict_is_not_run_again(pg_url: str) -> None:
    """A refused value (SQLSTATE 22P02) is the caller's, at once: running it again would
    fail the same way."""
    a, b = two_processes(pg_url)
    try:
        runs: list[int] = []

        def refused() -> None:
            runs.append(1)
            a.db.execute_sql("SELECT 'not a number'::integer")

        with pytest.raises(DatabaseFailed) as failed:
            a.writer.call(refused)
        assert (failed.value.retryable, len(runs)) == (False, 1)
        assert a.writer.statistics().retried_operations == 0
    finally:
        a.close()
        b.close()


def test_a_set_wise_run_a_conflict_aborted_runs_set_wise_again_in_the_next_transaction(
        pg_url: str) -> None:
    """A bulk kind's set-wise run that PostgreSQL aborts as a deadlock (raised by the server,
    40P01) goes whole to the next transaction and runs set-wise there, not one by one in
    this one (where each item would wait for the same locks)."""
    a, b = two_processes(pg_url)
    try:
        calls: list[str] = []
        s = a.tables.session

        def many(chats: list[str]) -> list[int]:
            calls.append("many")
            if calls.count("many") == 1:
                a.db.execute_sql("DO $$ BEGIN RAISE EXCEPTION 'deadlocked' "
                                 "USING ERRCODE = '40P01'; END $$")
            return [s.update(title="bulk").where(s.id == c).execute() for c in chats]

        def one(chat: str) -> int:
            calls.append("one")
            return int(s.update(title="bulk").where(s.id == chat).execute())

        kind: Bulk[str, int] = Bulk("titles", one, many)
        queued = threading.Event()
        gate = a.writer.submit(lambda: queued.wait(10))
        replies = [a.writer.submit_bulk(kind, chat) for chat in ("s1", "s2")]
        queued.set()
        assert gate.result(10)
        assert [r.result(20) for r in replies] == [1, 1]
        assert calls == ["many", "many"]
        assert a.writer.statistics().retried_operations == 2
        assert {b.store.session(c).title for c in ("s1", "s2")} == {"bulk"}
    finally:
        a.close()
        b.close()


def test_a_fence_over_several_chunks_locks_its_rows_in_one_global_order(pg_url: str) -> None:
    """A fence of more ids than one ``IN`` list holds locks them chunk by chunk. Each
    chunk's ``ORDER BY message_id FOR UPDATE`` orders it only within itself, so the ids are
    sorted before they are cut: two fences over the same rows, given in different orders,
    then lock them in the same order and cannot deadlock."""
    from kinbox.persistence.hot_path import IN_LIST_LIMIT, HotPath

    s = Stores(pg_url)
    try:
        hot = HotPath(s.db)
        ids = [f"m{i:05d}" for i in range(IN_LIST_LIMIT * 2 + 7)]
        seen: list[list[str]] = []
        run = s.db.execute_sql

        def recording(sql: str, params: Any = None, *args: Any, **kwargs: Any) -> Any:
            if "FOR UPDATE" in sql:
                seen.append(list(params))
            return run(sql, params, *args, **kwargs)

        s.db.execute_sql = recording  # type: ignore[method-assign]
        with s.db.atomic():
            hot.fence_rows(list(reversed(ids)))
        assert len(seen) == 3
        locked = [mid for part in seen for mid in part]
        assert locked == sorted(ids)
    finally:
        s.close()
