"""The group-commit writer: shared commits, per-operation undo, nothing half-written."""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

import peewee as pw
import pytest

from kinbox.persistence import DatabaseFailed, PersistenceError, WriterClosed, WriteTimeout

from .conftest import Stores
from .helpers import wait_for


def insert_project(s: Stores, pid: str) -> None:
    s.tables.project.insert(id=pid, slug=pid, name=pid, created_at=0).execute()


def test_a_failing_operation_undoes_only_its_own_writes(stores: Stores) -> None:
    gate = threading.Event()
    blocker = stores.writer.submit(lambda: gate.wait(10))  # holds the writer so a batch forms

    def half_then_fail() -> None:
        insert_project(stores, "half")
        raise ValueError("boom after a write")

    good = stores.writer.submit(lambda: insert_project(stores, "good"))
    bad = stores.writer.submit(half_then_fail)
    also_good = stores.writer.submit(lambda: insert_project(stores, "also-good"))
    gate.set()
    blocker.result(10)
    good.result(10)
    also_good.result(10)
    with pytest.raises(ValueError, match="boom after a write"):
        bad.result(10)
    slugs = {p.slug for p in stores.store.projects()}
    assert slugs == {"good", "also-good"}
    assert stores.writer.statistics().largest_batch >= 3


def test_a_result_means_other_connections_already_see_the_write(stores: Stores) -> None:
    stores.writer.call(lambda: insert_project(stores, "p1"))
    seen: list[bool] = []

    def look() -> None:  # its own thread, so its own connection
        seen.append(stores.tables.project.select().where(
            stores.tables.project.slug == "p1").exists())
        stores.db.close()

    reader = threading.Thread(target=look)
    reader.start()
    reader.join(10)
    assert seen == [True]


def test_a_stopped_writer_refuses_new_work(stores: Stores) -> None:
    stores.writer.stop()
    with pytest.raises(WriterClosed):
        stores.writer.submit(lambda: None)


def test_abort_refuses_what_was_queued(stores: Stores) -> None:
    gate, inside = threading.Event(), threading.Event()
    running = stores.writer.submit(lambda: (inside.set(), gate.wait(10)))
    assert inside.wait(10)  # the writer is busy with the first operation
    queued = stores.writer.submit(lambda: insert_project(stores, "never"))
    stores.writer.abort()
    gate.set()
    running.result(10)
    with pytest.raises(WriterClosed):
        queued.result(10)
    assert stores.store.projects() == []


def test_reply_callbacks_run_once_each_in_order_after_the_commit(stores: Stores) -> None:
    """Callbacks registered before the answer run on the writer thread after the commit, in
    order, each once; one registered after the answer runs at once; one that raises is
    logged and neither stops the others nor the writer."""
    gate = threading.Event()
    reply = stores.writer.submit(lambda: (gate.wait(10), insert_project(stores, "p1"))[1])
    calls: list[tuple[str, str, bool]] = []

    def note(name: str) -> None:
        visible = stores.tables.project.select().where(
            stores.tables.project.slug == "p1").exists()
        calls.append((name, threading.current_thread().name, visible))

    def broken() -> None:
        raise RuntimeError("a waiter's bug")

    reply.add_done_callback(lambda: note("first"))
    reply.add_done_callback(broken)
    reply.add_done_callback(lambda: note("second"))
    gate.set()
    reply.result(10)
    wait_for(lambda: len(calls) == 2, timeout=10, what="both callbacks")  # after the answer
    assert [c[0] for c in calls] == ["first", "second"]
    assert all(thread == "kinbox-writer" and visible for _, thread, visible in calls)
    reply.add_done_callback(lambda: note("late"))
    assert calls[-1] == ("late", threading.current_thread().name, True)
    assert stores.writer.call(lambda: "still writing") == "still writing"


def test_a_reply_refused_by_abort_runs_its_callbacks_with_the_error(stores: Stores) -> None:
    gate, inside = threading.Event(), threading.Event()
    running = stores.writer.submit(lambda: (inside.set(), gate.wait(10)))
    assert inside.wait(10)
    queued = stores.writer.submit(lambda: insert_project(stores, "never"))
    errors: list[type[BaseException]] = []

    def outcome() -> None:
        try:
            queued.outcome()
        except WriterClosed as exc:
            errors.append(type(exc))

    queued.add_done_callback(outcome)
    stores.writer.abort()
    gate.set()
    running.result(10)
    assert errors == [WriterClosed]


def test_writes_queued_while_a_batch_begins_commit_with_it(db_url: str) -> None:
    # The batch is taken once its transaction has begun: on SQLite beginning waits (here
    # for another connection's write lock, under load for the interpreter lock), and what
    # queues meanwhile commits in that batch, not one more batch later.
    s = Stores(db_url)
    other = sqlite3.connect(db_url[len("sqlite:///"):], isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # the writer's BEGIN IMMEDIATE waits for this
        first = s.writer.submit(lambda: insert_project(s, "first"))
        wait_for(lambda: s.writer.queued() == 0, what="the writer to take the first write")
        second = s.writer.submit(lambda: insert_project(s, "second"))
        other.execute("ROLLBACK")
        first.result(10)
        second.result(10)
        stats = s.writer.statistics()
        assert (stats.batches, stats.largest_batch) == (1, 2)
        assert {p.slug for p in s.store.projects()} == {"first", "second"}
    finally:
        other.close()
        s.close()


def test_a_batch_that_cannot_begin_answers_what_queued_behind_it_at_once(db_url: str) -> None:
    # Beginning is busy past the timeout: the write it began for and those queued while it
    # waited all get that error from the one failed batch (not one timeout after another).
    s = Stores(db_url)
    other = sqlite3.connect(db_url[len("sqlite:///"):], isolation_level=None)
    try:
        s.writer.call(lambda: s.db.execute_sql("PRAGMA busy_timeout = 1000"))
        other.execute("BEGIN IMMEDIATE")
        writes = [s.writer.submit(lambda: insert_project(s, "first"))]
        wait_for(lambda: s.writer.queued() == 0, what="the writer to take the first write")
        writes += [s.writer.submit(lambda p=p: insert_project(s, p)) for p in ("b", "c")]
        for write in writes:
            # A kinbox error (no bare driver error reaches a caller), and peewee's BEGIN's.
            with pytest.raises(DatabaseFailed, match="locked") as info:
                write.result(10)
            assert isinstance(info.value, pw.OperationalError)
            assert info.value.kind == "OperationalError"
        assert s.writer.statistics().rollbacks == 1
        other.execute("ROLLBACK")
        s.writer.call(lambda: insert_project(s, "after"))
        assert [p.slug for p in s.store.projects()] == ["after"]
    finally:
        other.close()
        s.close()


def test_a_write_whose_waiter_gave_up_while_it_was_queued_never_runs(stores: Stores) -> None:
    """The waiter's timeout was a bare TimeoutError and the write stayed queued: it
    committed later, after its caller was told it failed (a retried send: two messages)."""
    gate, entered = threading.Event(), threading.Event()
    blocker = stores.writer.submit(lambda: (entered.set(), gate.wait(10)))  # a slow batch
    assert entered.wait(10)
    with pytest.raises(WriteTimeout) as late:
        stores.writer.call(lambda: insert_project(stores, "late"), timeout=0.2)
    assert late.value.withdrawn and isinstance(late.value, PersistenceError)
    gate.set()
    blocker.result(10)
    stores.writer.call(lambda: insert_project(stores, "after"))
    assert {p.slug for p in stores.store.projects()} == {"after"}


def test_a_write_whose_batch_was_running_when_its_waiter_gave_up_says_it_may_commit(
        stores: Stores) -> None:
    gate, entered = threading.Event(), threading.Event()

    def slow() -> None:
        entered.set()
        gate.wait(10)
        insert_project(stores, "slow")

    with pytest.raises(WriteTimeout) as late:
        stores.writer.submit(lambda: None)  # so the next call's batch is running
        reply = stores.writer.submit(slow)
        assert entered.wait(10)
        reply.result(0.2)
    assert not late.value.withdrawn and "may yet commit" in str(late.value)
    gate.set()
    stores.writer.call(lambda: None)
    assert {p.slug for p in stores.store.projects()} == {"slow"}


@pytest.mark.timeout(60)
def test_a_full_sqlite_disk_is_reported_as_such_not_as_a_failed_rollback(tmp_path: Any) -> None:
    """SQLite rolls a whole transaction back when the disk is full, so the writer's own
    rollback failed too, and its 'cannot rollback - no transaction is active' was what
    every sender got in place of the disk being full."""
    from kinbox.actors import Runtime

    rt = Runtime(db=f"sqlite:///{tmp_path / 'k.db'}", data_dir=str(tmp_path)).start()
    try:
        sid = rt.create_session(rt.create_project("p").id, "S").id
        writer = rt.context.journal.writer
        db = rt.context.journal.t.db
        pages = writer.call(lambda: db.execute_sql("PRAGMA page_count").fetchone()[0])
        writer.call(lambda: db.execute_sql(f"PRAGMA max_page_count = {pages + 2}"))
        with pytest.raises(DatabaseFailed) as full:
            for i in range(200):
                rt.post(sid, "x" * 900, message_id=f"m-{i}")
        assert "full" in str(full.value), f"{full.value.kind}: {full.value}"
        sent = i
    finally:
        rt.stop()
    with Runtime(db=f"sqlite:///{tmp_path / 'k.db'}", data_dir=str(tmp_path)) as again:
        assert len(again.inbox()) == sent  # each acknowledged send, and no other


@pytest.mark.timeout(120)
def test_a_disk_that_fills_during_a_sqlite_commit_is_reported_as_such(tmp_path: Any) -> None:
    """The disk filled while a batch's COMMIT wrote the WAL: SQLite rolled the transaction
    back itself, peewee's rollback after it failed, and every sender of the batch got
    'cannot rollback - no transaction is active' in place of the write that failed."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from kinbox.actors import Runtime

    url = f"sqlite:///{tmp_path / 'k.db'}"
    with Runtime(db=url) as rt:
        sid = rt.create_session(rt.create_project("p").id, "S").id
    child = Path(__file__).with_name("full_disk_child.py")
    run = subprocess.run([sys.executable, str(child), url, sid], capture_output=True,
                         text=True, timeout=100)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["type"] == "OperationalError" and seen["kind"] == "OperationalError", seen
    assert "rollback" not in seen["error"] and "transaction" not in seen["error"], seen
    with Runtime(db=url) as again:  # the disk has room again: each acknowledged send
        assert len(again.inbox()) == seen["sent"] > 0


@pytest.mark.timeout(120)
def test_a_turn_commit_the_database_refused_runs_again_once_it_is_back_not_a_lease_later(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process held the SQLite file's write lock past the busy timeout while a
    turn committed: nothing of the turn was written, and its row stayed leased to a run
    that had let go of it, so the session waited out the whole lease (30 s) before it ran
    again. The row goes back at once; its turn runs again when the database is back."""
    import time

    from kinbox.actors import Runtime, Turn
    from kinbox.persistence import database

    monkeypatch.setattr(database, "BUSY_TIMEOUT_MS", 300)
    path = tmp_path / "k.db"
    entered, release = threading.Event(), threading.Event()
    seen: list[str] = []

    def brain(turn: Turn) -> None:
        mid = turn.messages[0].message_id
        seen.append(mid)
        if mid == "m1" and seen.count("m1") == 1:
            entered.set()
            release.wait(30)

    rt = Runtime(db=f"sqlite:///{path}", brain=brain, data_dir=str(tmp_path)).start()
    other = sqlite3.connect(str(path), isolation_level=None)
    try:
        sid = rt.create_session(rt.create_project("p").id, "S").id
        rt.post(sid, "one", message_id="m1")
        assert entered.wait(10)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        release.set()  # m1's commit meets the lock
        wait_for(lambda: not rt.health(timeout=1.0)["healthy"], timeout=10,
                 what="the runtime to see its database refuse")
        other.execute("ROLLBACK")  # the database is back
        began = time.monotonic()
        rt.post(sid, "two", message_id="m2")
        wait_for(lambda: {r["message_id"]: r["status"] for r in rt.inbox()}
                 == {"m1": "delivered", "m2": "delivered"}, timeout=60, what="delivery")
        assert time.monotonic() - began < 10  # not the 30 s lease
        assert seen == ["m1", "m1", "m2"]
    finally:
        release.set()
        other.close()
        rt.stop()
