"""``Runtime.stop()`` called from a thread other than the one that started it.

peewee keeps a connection per thread. The thread that called ``start()`` opened one (the
schema upgrade, the first reads), and so does any thread that calls the runtime's API; a
stop from a signal handler's thread or a web server's shutdown hook closed only its own.
After a stop, from whatever thread, the runtime holds no server connection and no handle
of the SQLite file.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from kinbox.actors import Runtime

from .helpers import quiet_brain, wait_for


def sqlite_handles(path: Path) -> int:
    """This process's open files that are the database (its WAL and shared memory too)."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own)
        if target.startswith(str(path)):
            found += 1
    return found


def server_connections(pg_url: str) -> set[int]:
    """The backends of the other connections to ``pg_url``'s database on the server now
    (an earlier test's may still be ending: compare with the set before, not with none)."""
    probe = psycopg2.connect(pg_url)
    try:
        with probe.cursor() as cur:
            cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = "
                        "current_database() AND pid <> pg_backend_pid()")
            return {int(pid) for (pid,) in cur.fetchall()}
    finally:
        probe.close()


def stop_elsewhere(rt: Runtime) -> None:
    """Stop ``rt`` from a new thread, as a signal handler's or a shutdown hook's would."""
    failures: list[BaseException] = []

    def stop() -> None:
        try:
            rt.stop()
        except BaseException as exc:  # reported to the test below
            failures.append(exc)

    stopper = threading.Thread(target=stop, name="stopper")
    stopper.start()
    stopper.join(30)
    assert not stopper.is_alive() and not failures


@pytest.fixture
def stopped_at_end() -> Iterator[list[Runtime]]:
    made: list[Runtime] = []
    yield made
    for rt in made:
        rt.stop()


def _use(rt: Runtime) -> None:
    """Use ``rt`` from this thread (its connection) and have it deliver a message."""
    sid = rt.create_session("default", "T").id
    rt.post(sid, "hello", sender="u")
    wait_for(lambda: bool(rt.inbox(state="delivered")), what="the delivery")



def stop_from(where: str, rt: Runtime) -> None:
    """Stop ``rt`` from this thread, or from a thread of its own."""
    if where == "same thread":
        rt.stop()
    else:
        stop_elsewhere(rt)

@pytest.mark.parametrize("where", ["same thread", "another thread"])
def test_a_stop_leaves_no_handle_of_the_sqlite_file(
        tmp_path: Path, where: str, stopped_at_end: list[Runtime]) -> None:
    path = tmp_path / "kinbox.db"
    rt = Runtime(db=f"sqlite:///{path}", brain=quiet_brain).start()
    stopped_at_end.append(rt)
    _use(rt)
    assert sqlite_handles(path) > 0
    stop_from(where, rt)
    gc.collect()  # a thread's connection that ended with it, not yet freed
    assert sqlite_handles(path) == 0


@pytest.mark.postgres
@pytest.mark.parametrize("where", ["same thread", "another thread"])
def test_a_stop_leaves_no_server_connection(
        pg_url: str, where: str, stopped_at_end: list[Runtime]) -> None:
    before = server_connections(pg_url)
    rt = Runtime(db=pg_url, brain=quiet_brain).start()
    stopped_at_end.append(rt)
    _use(rt)
    assert server_connections(pg_url) - before
    stop_from(where, rt)
    gc.collect()
    wait_for(lambda: not server_connections(pg_url) - before, timeout=30,
             what="the server to see every connection of the runtime closed")


def test_the_starting_thread_reads_after_a_stop_from_another_thread(
        tmp_path: Path, stopped_at_end: list[Runtime]) -> None:
    """The thread whose connection another thread's stop closed still reads a stopped
    runtime's records (its next statement connects again), as after a stop of its own."""
    rt = Runtime(db=f"sqlite:///{tmp_path / 'kinbox.db'}", brain=quiet_brain).start()
    stopped_at_end.append(rt)
    _use(rt)
    stop_elsewhere(rt)
    assert [r["status"] for r in rt.inbox()] == ["delivered"]


@pytest.mark.timeout(60)
def test_a_writer_still_committing_after_the_stop_keeps_its_connection(
        tmp_path: Path, stopped_at_end: list[Runtime]) -> None:
    """A batch that outlives the stop's wait for the writer (its timeout) is still inside its
    transaction: closing every thread's connection would end it under the batch. The stop
    leaves the writer's connection to it, and the batch commits."""
    rt = Runtime(db=f"sqlite:///{tmp_path / 'kinbox.db'}", brain=quiet_brain).start()
    stopped_at_end.append(rt)
    db = rt.context.journal.t.db
    inside, release = threading.Event(), threading.Event()

    def slow_batch() -> int:
        inside.set()
        release.wait(30)
        return int(db.execute_sql("SELECT count(*) FROM agent_inbox_messages").fetchone()[0])

    reply = rt.context.journal.writer.submit(slow_batch)
    assert inside.wait(10)
    rt.stop(timeout=1.0)  # its wait for the writer ends while the batch still runs
    release.set()
    assert reply.result(10) == 0
