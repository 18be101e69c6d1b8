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
may commit in any order within it. The kinds and the plan are :mod:`.bulk`'s,
running a batch between begin and commit :mod:`.batch_run`'s; this module owns
the thread, the transaction, the conflict retries and the answers.

On PostgreSQL, batches of several processes (and their claims) lock rows in
whatever order their operations arrived, and two that wait for each other are
a deadlock: PostgreSQL aborts one statement (SQLSTATE ``40P01``; a
serialization failure, ``40001``, is the same kind of answer under a stricter
isolation). That undid the statement's whole operation (its savepoint), and
its caller was told the write failed although nothing was wrong with it. Such
an operation now runs again, in the writer's next transaction, after the rest
of its batch committed and let go of its locks (run again at once, in the same
transaction, it would wait for the same locks); a set-wise run that a
conflict aborted goes there whole instead of one by one. A commit the
conflict aborted runs its whole batch again. At most :data:`~.batch_run.CONFLICT_RETRIES`
times each: then the caller gets the error (``DatabaseFailed.retryable``).
An operation may therefore run more than once; like a :class:`Bulk` kind's
``many`` it must do nothing but its database writes (or keep only its last run's
result), and it may commit after operations queued behind it: a caller whose writes
must commit in order waits for each before it submits the next.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import peewee as pw

from .batch_run import conflict, may_run_again, run_batch
from .bulk import Bulk
from .database import is_sqlite
from .errors import DatabaseFailed, WriterClosed
from .reply import Reply
from .savepoints import SQLITE_LOCK

T = TypeVar("T")
A = TypeVar("A")

_STOP = object()

log = logging.getLogger("kinbox.writer")

WRITE_TIMEOUT = 30.0
"""How long a blocking write waits for its commit by default."""

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
    retried_operations: int = 0
    """Operations a deadlock or a serialization failure aborted, run again in a later
    transaction (PostgreSQL)."""
    retried_batches: int = 0
    """Batches whose commit a deadlock or a serialization failure aborted, run again whole."""


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
        self._again: list[tuple[Any, ...]] = []
        """Entries a conflict aborted, to run in the next transaction (writer thread only)."""
        self._aborted = False

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

    def call_landed(self, op: Callable[[], T]) -> T:
        """:meth:`call`, waiting on for the outcome of a write whose batch outran the wait
        (:class:`WriteTimeout`, not ``withdrawn``: it may commit yet), for a write whose
        outcome must be known (it leases rows, it marks a session). Taken as failed, such
        a write that then committed left its rows leased, or its mark set, with nothing
        to run them or take it back."""
        return self.submit(op).landed(WRITE_TIMEOUT)

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

    @property
    def alive(self) -> bool:
        """The writer thread still runs: a stop whose join timed out left it inside a
        batch, on its connection."""
        return self._thread.is_alive()

    def abort(self) -> None:
        """Stop at once, as a crash would: queued work is refused, not committed.

        A batch already inside its transaction finishes (or not) exactly as it
        would if the process died at this instant.
        """
        with self._lock:
            self._closed = True
            self._aborted = True  # the writer refuses what it meant to run again, too
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
                                s.bulk_runs, s.bulk_fallbacks, s.shared_fallbacks,
                                s.retried_operations, s.retried_batches)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """A batch's transaction. When its body failed in the database and the rollback
        fails too, the body's error is what the batch's callers get: the rollback's would
        hide why. (A transaction the database ended itself, on a full disk or a closed
        connection, is no rollback failure: the database classes skip that rollback.)"""
        failed: list[BaseException] = []
        try:
            with (self._db.atomic(SQLITE_LOCK) if is_sqlite(self._db) else self._db.atomic()):
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
            while not stopping or self._again:
                if self._again:  # a conflict's retries first, with what queued meanwhile
                    batch, self._again = self._again, []
                    if self._aborted:
                        self._refuse(batch)
                        continue
                    stopping = self._commit(batch) or stopping
                    continue
                first = self._queue.get()
                if first is _STOP:
                    break
                stopping = self._commit([first])
        finally:
            self._db.close()

    def _refuse(self, batch: list[tuple[Any, ...]]) -> None:
        """Answer retries the writer will not run: it was aborted (as a crash would)."""
        for item in batch:
            item[-1].set_exception(WriterClosed("the runtime crashed before this commit"))

    def _retry(self, item: tuple[Any, ...], error: BaseException) -> bool:
        """Keep ``item`` for the next transaction when ``error`` is a conflict and it has
        retries left; False: its caller gets ``error`` now."""
        reply = item[-1]
        if not may_run_again(error, reply.conflicts):
            if conflict(error):
                log.warning("a write failed with SQLSTATE %s %d times in a row; its caller "
                            "gets the error", error.sqlstate, reply.conflicts + 1)
            return False
        reply.conflicts += 1
        self._again.append(item)
        return True

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
                run_batch(self._db, batch, outcomes, self._stats)
        except Exception as exc:
            # The transaction failed, and every write of the batch with it: rolled back,
            # or (a connection lost at COMMIT) its outcome unknown here, so run again
            # only when the error says the server aborted it (a conflict).
            self._stats.rollbacks += 1
            if not gathered:
                # Beginning failed (busy past the timeout): what queued gets this answer
                # now, not one busy timeout after another, a batch each.
                stopping = self._gather(batch)
            kept = 0
            for item in batch:
                if self._retry(item, exc):
                    kept += 1
                else:
                    item[-1].set_exception(exc)
            if kept:
                self._stats.retried_batches += 1
                log.info("a batch of %d writes was rolled back by SQLSTATE %s; it runs again",
                         kept, getattr(exc, "sqlstate", None))
            return stopping
        self._count(len(batch))
        retried = 0
        for i, item in enumerate(batch):
            ok, value = outcomes[i]
            if ok:
                item[-1].set_result(value)
            elif self._retry(item, value):
                retried += 1
            else:
                item[-1].set_exception(value)
        if retried:
            self._stats.retried_operations += retried
            log.info("%d writes aborted by a deadlock or a serialization failure run again "
                     "in a new transaction", retried)
        return stopping

    def _count(self, n: int) -> None:
        self._stats.batches += 1
        self._stats.operations += n
        self._stats.largest_batch = max(self._stats.largest_batch, n)

