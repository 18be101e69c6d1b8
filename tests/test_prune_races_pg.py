"""A prune racing another process on PostgreSQL: two connections, a fixed interleaving.

PostgreSQL runs each transaction at READ COMMITTED, and several runtimes (or a runtime
and ``kinbox inbox prune``) write one database. A prune batch judges its rows and then
deletes them in one transaction; these tests commit the other process's write between
that judgement and the delete (a test-side subclass runs it there), and check that what
the prune deleted is what the rules allow once both have committed. On SQLite the other
process could not write there at all: a writer's transaction holds the file's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg2
import pytest

from kinbox.persistence import Journal, NewMessage, PruneCounts

from .conftest import Stores
from .helpers import wait_for
from .test_journal_prune import CUTOFF, T0, deliver, ids

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]


class JudgedThenRaced(Journal):
    """A journal whose prune runs ``between`` after judging a batch, before deleting it."""

    between: Callable[[], None] | None = None

    def _going(self, *args: Any, **kwargs: Any) -> list[str]:
        going = super()._going(*args, **kwargs)
        between, self.between = self.between, None
        if between is not None:  # the first batch's judgement, in the prune's transaction
            between()
        return going


class Other:
    """Another process's write, run on its own connection in a thread of its own."""

    def __init__(self, url: str, stores: Stores, op: Callable[[Stores], object]) -> None:
        self.url, self.stores, self.op = url, stores, op
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.finished_first = False
        """It committed before the prune went on to delete."""

    def _run(self) -> None:
        try:
            self.stores.writer.call(lambda: self.op(self.stores))
        except BaseException as exc:  # the test reports it
            self.error = exc
        finally:
            self.done.set()

    def __call__(self) -> None:
        """Start the write; return once it committed or waits for a lock the prune
        holds (it can then commit only after the prune)."""
        threading.Thread(target=self._run, daemon=True).start()
        wait_for(lambda: self.done.is_set() or waiting_for_a_lock(self.url),
                 what="the other process's write to commit or to wait for a lock")
        self.finished_first = self.done.is_set()


def waiting_for_a_lock(url: str) -> bool:
    """Some session of the database waits for a lock."""
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND wait_event_type = 'Lock'")
            return bool(cur.fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def two(pg_url: str) -> Iterator[tuple[Stores, Stores]]:
    """The pruning process and another one, on one PostgreSQL database."""
    pruner, other = Stores(pg_url), Stores(pg_url)
    yield pruner, other
    other.close()
    pruner.close()


def racing(s: Stores) -> JudgedThenRaced:
    return JudgedThenRaced(s.tables, s.writer)


def add_task(s: Stores, task_id: str, status: str) -> None:
    s.tables.task.insert(id=task_id, project_id=None, chat_id="child", title="work",
                         status=status, created_at=T0, updated_at=T0).execute()


def next_notice(s: Stores) -> str:
    """The other process's Focal: the next finished notice of a task, id chosen in its
    transaction as ``subagents.next_free_id`` chooses it."""
    mid = s.journal.hot.first_free("focal-finished-s1-t2")
    s.journal.enqueue_now(NewMessage(mid, "focal", "finished again",
                                     payload={"task_id": "t2"}), T0 + 500)
    return mid


def test_a_chains_next_member_written_meanwhile_never_loses_its_base(
        pg_url: str, two: tuple[Stores, Stores]) -> None:
    """The base of a chain is deleted only if no later member is committed with it gone:
    the walk from the base would stop there, and the later notice would not count."""
    pruner, other = two
    add_task(pruner, "t2", "completed")  # a finished notice names a settled task
    deliver(pruner.journal, "focal-finished-s1-t2", "focal", payload={"task_id": "t2"})
    j = racing(pruner)
    j.between = write = Other(pg_url, other, next_notice)
    j.prune(CUTOFF)
    assert write.done.wait(30) and write.error is None, write.error
    left = ids(pruner.journal)
    assert not ("focal-finished-s1-t2-2" in left and "focal-finished-s1-t2" not in left), left


def test_a_task_reopened_meanwhile_keeps_its_rows(pg_url: str,
                                                  two: tuple[Stores, Stores]) -> None:
    """A row of a task reopened before the prune deletes it stays (rule 4 at the delete,
    not only at the read); a reopen that waits for the prune comes after it."""
    pruner, other = two
    add_task(pruner, "t1", "completed")
    deliver(pruner.journal, "subagent-task-t1", "child", payload={"task_id": "t1"})

    def reopen(s: Stores) -> None:
        task = s.tables.task
        task.update(status="in_progress").where(task.id == "t1").execute()

    j = racing(pruner)
    j.between = write = Other(pg_url, other, reopen)
    counts = j.prune(CUTOFF)
    assert write.done.wait(30) and write.error is None, write.error
    if write.finished_first:
        assert counts == PruneCounts() and ids(pruner.journal) == ["subagent-task-t1"]
    else:  # it waited for the prune's commit: the prune came first, and was right then
        assert counts.rows == 1


def test_a_chain_member_whose_successor_is_being_written_stays(
        pg_url: str, two: tuple[Stores, Stores]) -> None:
    """The other process chose the next id (its walk holds the base) and has not
    committed yet when the prune runs whole: the prune neither waits for it nor deletes
    the base it builds on."""
    pruner, other = two
    add_task(pruner, "t2", "completed")
    deliver(pruner.journal, "focal-finished-s1-t2", "focal", payload={"task_id": "t2"})
    chosen, go_on = threading.Event(), threading.Event()
    taken: list[str] = []

    def slow_notice(s: Stores) -> None:
        taken.append(next_notice(s))
        chosen.set()
        assert go_on.wait(30)

    write = Other(pg_url, other, slow_notice)
    threading.Thread(target=write._run, daemon=True).start()
    assert chosen.wait(30)
    try:
        assert pruner.journal.prune(CUTOFF) == PruneCounts()
    finally:
        go_on.set()
    assert write.done.wait(30) and write.error is None, write.error
    assert taken == ["focal-finished-s1-t2-2"]
    assert ids(pruner.journal) == ["focal-finished-s1-t2", "focal-finished-s1-t2-2"]
    assert pruner.journal.prune(CUTOFF) == PruneCounts()  # -2 is recent: the base stays
