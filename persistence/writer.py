"""The group-commit writer: one thread that commits concurrent writes together.

With ``synchronous=FULL`` every SQLite commit waits for the disk. Sending all
writes through one thread that drains whatever has queued up and commits it
as one transaction turns N waits into one, so durability stays cheap under
load and SQLite never sees two writers from this process.

Each operation (a zero-argument callable run on the writer thread) runs
inside its own savepoint: if it raises, its writes are undone, its caller
gets the exception, and the rest of the batch commits. Results are handed
out only after the commit returned; if the commit itself fails, every
caller of the batch gets that error and nothing of it is durable.

Operations of the same :class:`Bulk` kind that land in one batch run
together (a few set-wise statements instead of a few per operation), and
every kind of the batch under one savepoint (on SQLite, none when they come
first in the transaction: the transaction begun again undoes them): that
is what keeps the per-message cost flat under load. If a set-wise run
raises, that savepoint is rolled back (or the transaction begun again) and
each kind runs under its own: the others set-wise again,
the one that raised one operation at a time, so the outcome is exactly what
one-by-one execution gives. Bulk kinds run where the batch's first bulk item
stands, plain operations in the order they arrived. Callers wait for each
result before depending on it, so operations in one batch are concurrent and
may commit in any order within it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import peewee as pw

from .database import is_sqlite
from .driver_errors import sqlite_statement
from .errors import DatabaseFailed, WriterClosed, WriteTimeout
from .pg_database import PostgresDatabase

T = TypeVar("T")
A = TypeVar("A")

_STOP = object()

log = logging.getLogger("kinbox.writer")

WRITE_TIMEOUT = 30.0
"""How long a blocking write waits for its commit by default."""

_SQLITE_LOCK = "IMMEDIATE"
"""How the writer begins a SQLite transaction: with the write lock at once (a batch that
began again after a rollback, :meth:`_Control.undo`, too)."""


@dataclass(frozen=True, eq=False)
class Bulk(Generic[A, T]):
    """A kind of operation the writer may run many of at once.

    ``one`` runs a single item; ``many`` runs several and returns their
    results in order, or raises to have them run one by one (a rare case it
    does not handle, such as an idempotent repeat or a lost lease). Every kind
    of a batch shares one savepoint (or, first in a SQLite transaction, none: the
    transaction begins again), so when one kind raises the others' work
    is undone too and their ``many`` runs again on the same items: ``many``
    must do nothing but its database writes (no effect outside the
    transaction, nothing it would be wrong to do twice).
    """

    name: str
    one: Callable[[A], T]
    many: Callable[[list[A]], list[T]]


class Reply(Generic[T]):
    """The answer to one operation, handed over once its batch has committed.

    A lock held until the answer is set: under load every message waits for
    two of these, and a lock costs a fraction of a ``Future``'s condition.
    Event-loop code does not wait on the lock: it registers a callback
    (:meth:`add_done_callback`), run on the writer thread once the answer is in.
    """

    __slots__ = ("_callbacks", "_done", "_error", "_set", "_taken", "_value")

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self._value: Any = None
        self._error: BaseException | None = None
        self._set = False
        self._callbacks: list[Callable[[], None]] | None = None
        self._taken: bool | None = None
        """None while queued; True once a batch took the operation; False once its waiter
        withdrew it (it timed out first): the writer then never runs it."""

    def take(self) -> bool:
        """The writer starts the operation: False when its waiter withdrew it already."""
        with _CALLBACKS:
            if self._taken is None:
                self._taken = True
            return self._taken

    def withdraw(self, timeout: float | None) -> WriteTimeout:
        """The waiter gives up: the error to raise (the operation is withdrawn unless a
        batch took it first)."""
        with _CALLBACKS:
            if self._taken is None:
                self._taken = False
            return WriteTimeout(timeout, withdrawn=not self._taken)

    def set_result(self, value: T) -> None:
        """Hand over the result (once)."""
        self._value = value
        self._settle()

    def set_exception(self, error: BaseException) -> None:
        """Hand over the error (once)."""
        self._error = error
        self._settle()

    def _settle(self) -> None:
        with _CALLBACKS:
            self._set = True
            callbacks, self._callbacks = self._callbacks, None
        self._done.release()
        for callback in callbacks or ():
            _run_callback(callback)

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the answer is in: at once if it is, else on the writer
        thread right after the commit, in the order of registration. It must be quick and
        must neither block nor write (the writer waits for it)."""
        with _CALLBACKS:
            if not self._set:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        _run_callback(callback)

    def done(self) -> bool:
        """Is the answer in? (A look that gives nothing up: :meth:`result` with a timeout
        withdraws a write still queued when the wait ends.)"""
        return self._set

    def outcome(self) -> T:
        """The answer of a settled reply (raise the operation's error)."""
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[no-any-return]

    def result(self, timeout: float | None = None) -> T:
        """Wait for the answer; raise the operation's error, or :class:`WriteTimeout`."""
        # Positional: a keyword makes the lock parse its arguments (twice a message).
        if not self._done.acquire(True, -1 if timeout is None else timeout):
            late = self.withdraw(timeout)
            if not self._done.acquire(False):  # not answered since the wait ended either
                raise late
        self._done.release()  # so that a later result() sees the answer too
        if self._error is not None:  # outcome(), inline: every send and turn waits here
            raise self._error
        return self._value  # type: ignore[no-any-return]


_CALLBACKS = threading.Lock()
"""Orders a callback's registration against its reply's answer: one lock for all replies,
held for two attribute writes (a lock per reply would cost every send)."""


def _run_callback(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:  # a waiter's bug must not stop the writer or lose the batch's answers
        log.exception("a writer reply's callback failed")


@dataclass
class WriterStatistics:
    """Counters of a writer (a snapshot from :meth:`GroupCommitWriter.statistics`)."""

    batches: int = 0
    operations: int = 0
    largest_batch: int = 0
    rollbacks: int = 0
    bulk_runs: int = 0
    bulk_fallbacks: int = 0
    shared_fallbacks: int = 0
    """Batches whose bulk kinds, run together, raised and ran again one kind at a time."""


class GroupCommitWriter:
    """Runs write operations on one thread, committing each drained batch once."""

    def __init__(self, db: pw.Database, *, max_batch: int = 1024, name: str = "kinbox-writer"):
        self._db = db
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self._lock = threading.Lock()
        self._stats = WriterStatistics()

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def submit(self, op: Callable[[], T]) -> Reply[T]:
        """Queue ``op``; the reply resolves once its batch has committed."""
        return self._put(op)

    def submit_bulk(self, kind: Bulk[A, T], item: A) -> Reply[T]:
        """Queue ``item`` with the other items of ``kind`` in the next batch."""
        return self._put(kind, item)

    def call(self, op: Callable[[], T], timeout: float | None = WRITE_TIMEOUT) -> T:
        """Run ``op`` in the next batch and return its result after the commit."""
        return self.submit(op).result(timeout)

    def call_bulk(self, kind: Bulk[A, T], item: A, timeout: float | None = WRITE_TIMEOUT) -> T:
        """Run ``item`` with the other items of ``kind`` in the next batch; result after commit."""
        return self.submit_bulk(kind, item).result(timeout)

    def _put(self, *entry: Any) -> Reply[Any]:
        # Queue entries: (op, reply) or (bulk kind, item, reply).
        reply: Reply[Any] = Reply()
        with self._lock:
            if self._closed:
                raise WriterClosed("the writer is stopped; no more writes are accepted")
            self._queue.put((*entry, reply))
        return reply

    def stop(self, timeout: float = 10.0) -> None:
        """Commit what is queued, then stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def abort(self) -> None:
        """Stop at once, as a crash would: queued work is refused, not committed.

        A batch already inside its transaction finishes (or not) exactly as it
        would if the process died at this instant.
        """
        with self._lock:
            self._closed = True
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    item[-1].set_exception(WriterClosed("the runtime crashed before this commit"))
            self._queue.put(_STOP)

    @property
    def closed(self) -> bool:
        """Stopped or aborted: no more writes are accepted."""
        return self._closed

    def queued(self) -> int:
        """Operations waiting for the next batch (approximate, for monitoring and tests)."""
        return self._queue.qsize()

    def statistics(self) -> WriterStatistics:
        """A snapshot of the counters."""
        s = self._stats
        return WriterStatistics(s.batches, s.operations, s.largest_batch, s.rollbacks,
                                s.bulk_runs, s.bulk_fallbacks, s.shared_fallbacks)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """A batch's transaction. When its body failed in the database and the rollback
        fails too, the body's error is what the batch's callers get: the rollback's would
        hide why. (A transaction the database ended itself, on a full disk or a closed
        connection, is no rollback failure: the database classes skip that rollback.)"""
        failed: list[BaseException] = []
        try:
            with (self._db.atomic(_SQLITE_LOCK) if is_sqlite(self._db) else self._db.atomic()):
                try:
                    yield
                except BaseException as exc:
                    failed.append(exc)
                    raise
        except Exception as exc:
            if failed and exc is not failed[0] and isinstance(failed[0], DatabaseFailed):
                log.debug("the rollback after %s failed too: %s", type(failed[0]).__name__, exc)
                raise failed[0] from None
            raise

    def _run(self) -> None:
        stopping = False
        try:
            while not stopping:
                first = self._queue.get()
                if first is _STOP:
                    break
                stopping = self._commit([first])
        finally:
            self._db.close()

    def _gather(self, batch: list[tuple[Any, ...]]) -> bool:
        """Add what is queued to ``batch`` (up to the batch limit); True when the stop
        request came with it."""
        while len(batch) < self._max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return False
            if item is _STOP:
                return True
            batch.append(item)
        return False

    def _commit(self, batch: list[tuple[Any, ...]]) -> bool:
        """Commit ``batch`` (its first operation) and what queued behind it; True when the
        stop request came with them."""
        outcomes: dict[int, tuple[bool, Any]] = {}
        stopping, gathered = False, False
        try:
            with self._transaction():
                # The batch is taken once the transaction has begun: on SQLite beginning
                # is a statement, which hands the interpreter lock to the threads the last
                # commit woke, and they submit their next writes while the writer waits to
                # get it back. Taken before, those writes would wait a whole batch more.
                stopping, gathered = self._gather(batch), True
                # Writes whose waiters gave up are left out: they were answered already.
                batch[:] = [item for item in batch if item[-1].take()]
                control = _Control(self._db)
                for unit in _plan(batch):
                    if isinstance(unit, int):
                        outcomes[unit] = self._run_one(control, batch[unit][0])
                    elif (failed := self._run_groups(control, batch, unit, outcomes)) is not None:
                        for group in unit:  # the one that raised goes straight one by one
                            self._run_bulk(control, batch, group, outcomes,
                                           set_wise=group is not failed)
                    control.fresh = False
        except Exception as exc:  # the commit itself failed: nothing of the batch is durable
            self._stats.rollbacks += 1
            if not gathered:
                # Beginning failed (busy past the timeout): what queued gets this answer
                # now, not one busy timeout after another, a batch each.
                stopping = self._gather(batch)
            for item in batch:
                item[-1].set_exception(exc)
            return stopping
        self._count(len(batch))
        for i, item in enumerate(batch):
            ok, value = outcomes[i]
            if ok:
                item[-1].set_result(value)
            else:
                item[-1].set_exception(value)
        return stopping

    @staticmethod
    def _run_one(control: _Control, op: Callable[[], Any]) -> tuple[bool, Any]:
        # A savepoint per operation: a failing op undoes only itself. Plain
        # statements: peewee's nested atomic() costs more than the op itself.
        name = control.savepoint("kinbox_op")
        try:
            outcome: tuple[bool, Any] = (True, op())
        except Exception as exc:
            _undo(lambda: control.now(f"ROLLBACK TO SAVEPOINT {name}"), exc)
            outcome = (False, exc)
        control.later(f"RELEASE SAVEPOINT {name}")
        return outcome

    def _run_groups(self, control: _Control, batch: list[tuple[Any, ...]], groups: list[list[int]],
                    outcomes: dict[int, tuple[bool, Any]]) -> list[int] | None:
        """Run every bulk kind's items set-wise under one savepoint; the group of the kind
        that raised (all of it undone), for the caller to run each kind on its own, or
        None.

        Every statement hands the interpreter lock over and waits to get it back, and
        under load that wait, not the statement, is most of the writer's time: one
        savepoint for all kinds instead of one each saves three of the dozen or so
        statements of a typical batch. There is no release: the commit releases it.
        On SQLite, when nothing ran before them in the transaction (the usual batch: all
        sends and turn commits), they take no savepoint at all: undoing them is rolling
        the transaction back and beginning it again (:meth:`_Control.undo`).
        """
        name = control.savepoint("kinbox_bulk") if not control.restartable else None
        answers: list[tuple[list[int], list[Any]]] = []
        for group in groups:
            kind: Bulk[Any, Any] = batch[group[0]][0]
            try:
                answers.append((group, _all_of(kind, [batch[i][1] for i in group])))
            except Exception as exc:
                _undo(lambda: control.undo(name), exc)
                self._stats.shared_fallbacks += 1
                log.debug("a batch's bulk kinds run one kind at a time: %s",
                          type(exc).__name__)
                return group
        for group, results in answers:
            if len(group) > 1:
                self._stats.bulk_runs += 1
            for i, result in zip(group, results, strict=True):
                outcomes[i] = (True, result)
        return None

    def _run_bulk(self, control: _Control, batch: list[tuple[Any, ...]], indexes: list[int],
                  outcomes: dict[int, tuple[bool, Any]], *, set_wise: bool = True) -> None:
        """One kind's items under their own savepoint: set-wise (unless ``set_wise`` is
        False: it just failed that way), else one by one."""
        kind: Bulk[Any, Any] = batch[indexes[0]][0]
        items = [batch[i][1] for i in indexes]
        if len(items) > 1:
            if set_wise:
                ok, results = self._run_one(control, lambda: _all_of(kind, items))
                if ok:
                    self._stats.bulk_runs += 1
                    for i, result in zip(indexes, results, strict=True):
                        outcomes[i] = (True, result)
                    return
            self._stats.bulk_fallbacks += 1
        for i, item in zip(indexes, items, strict=True):
            outcomes[i] = self._run_one(control, lambda item=item: kind.one(item))

    def _count(self, n: int) -> None:
        self._stats.batches += 1
        self._stats.operations += n
        self._stats.largest_batch = max(self._stats.largest_batch, n)


def _undo(undo: Callable[[], object], cause: Exception) -> None:
    """Undo a step that raised ``cause``. When the step failed in the database and the undo
    fails too, the database ended the transaction with it (see
    :meth:`GroupCommitWriter._transaction`): ``cause`` fails the batch, as what says why.
    Any other undo failure (a restart that found the database busy) is its own reason."""
    try:
        undo()
    except Exception as undo_error:
        if not isinstance(cause, DatabaseFailed):
            raise
        log.debug("undoing after %s failed: %s", type(cause).__name__, undo_error)
        raise cause from None


class _Control:
    """How the writer sends its savepoint statements in one batch: ``later`` for those that
    answer nothing (deferred on PostgreSQL, where they ride with the next statement instead
    of costing a round trip each: :mod:`.pg_database`), ``now`` for a rollback to a
    savepoint; on SQLite both run at once on the batch's cursor (no peewee layer: they are
    part of every batch).

    Every savepoint of a batch has a name of its own: a deferred one that never ran (its
    statement's message failed to parse) makes the rollback to it fail, and the batch with
    it, where a name reused from an earlier operation would roll that one's writes back
    while its caller is told they committed."""

    __slots__ = ("count", "fresh", "later", "now", "sqlite")

    def __init__(self, db: pw.Database) -> None:
        self.now: Callable[[str], object]
        self.later: Callable[[str], object]
        self.count = 0
        self.fresh = True
        """Nothing has run in the batch's transaction yet."""
        self.sqlite = is_sqlite(db)
        if isinstance(db, PostgresDatabase):
            self.now, self.later = db.execute_sql, db.defer
        else:
            self.now = self.later = sqlite_statement(db.cursor())

    @property
    def restartable(self) -> bool:
        """Work may run without a savepoint, undone by beginning the transaction again:
        on SQLite, where a savepoint costs a statement (a hand-over of the interpreter
        lock, most of a statement's time in the writer under load), while nothing has
        run in the transaction. PostgreSQL's savepoints ride with the next statement."""
        return self.sqlite and self.fresh

    def undo(self, name: str | None) -> None:
        """Undo what ran since the savepoint ``name`` was opened; None: since the
        transaction began, with nothing before it (see :attr:`restartable`), by rolling
        it back and beginning it again, which leaves it as it was when it began."""
        if name is None:
            self.now("ROLLBACK")
            try:
                self.now(f"BEGIN {_SQLITE_LOCK}")
            except Exception:
                # Busy past the timeout: the batch fails with this error. A deferred BEGIN
                # takes no lock (it cannot be busy) and leaves the writer's own rollback a
                # transaction to end, which would fail ("no transaction is active") and
                # hide this error; nothing of the batch was kept either way.
                self.now("BEGIN")
                raise
        else:
            self.now(f"ROLLBACK TO SAVEPOINT {name}")
            self.later(f"RELEASE SAVEPOINT {name}")

    def savepoint(self, prefix: str) -> str:
        """Open a savepoint with a name new in this batch (``later``); its name."""
        self.count += 1
        name = f"{prefix}_{self.count}"
        self.later(f"SAVEPOINT {name}")
        return name


def _all_of(kind: Bulk[Any, Any], items: list[Any]) -> list[Any]:
    results = kind.many(items)
    if len(results) != len(items):  # undone by the savepoint, then run one by one
        raise ValueError(f"bulk {kind.name!r} returned {len(results)} results "
                         f"for {len(items)} items")
    return results


def _plan(batch: list[tuple[Any, ...]]) -> list[int | list[list[int]]]:
    """Execution units in arrival order: a plain operation's index, or, where the batch's
    first bulk item stands, every bulk kind's items (a group per kind, in the order the
    kinds first appear), which run together."""
    units: list[int | list[list[int]]] = []
    groups: dict[int, list[int]] = {}
    for i, item in enumerate(batch):
        if len(item) == 2:
            units.append(i)
            continue
        if not groups:
            units.append([])  # the bulk unit's place; filled in below
        groups.setdefault(id(item[0]), []).append(i)
    return [list(groups.values()) if isinstance(u, list) else u for u in units]
