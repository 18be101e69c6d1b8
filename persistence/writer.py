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
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import peewee as pw

from .database import is_sqlite
from .errors import WriterClosed

T = TypeVar("T")

_STOP = object()


@dataclass
class WriterStatistics:
    """Counters of a writer (a snapshot from :meth:`GroupCommitWriter.statistics`)."""

    batches: int = 0
    operations: int = 0
    largest_batch: int = 0
    rollbacks: int = 0


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

    def submit(self, op: Callable[[], T]) -> Future[T]:
        """Queue ``op``; the future resolves once its batch has committed."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise WriterClosed("the writer is stopped; no more writes are accepted")
            self._queue.put((op, future))
        return future

    def call(self, op: Callable[[], T], timeout: float | None = 30.0) -> T:
        """Run ``op`` in the next batch and return its result after the commit."""
        return self.submit(op).result(timeout)

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
                    item[1].set_exception(WriterClosed("the runtime crashed before this commit"))
            self._queue.put(_STOP)

    def statistics(self) -> WriterStatistics:
        """A snapshot of the counters."""
        s = self._stats
        return WriterStatistics(s.batches, s.operations, s.largest_batch, s.rollbacks)

    def _transaction(self) -> Any:
        return self._db.atomic("IMMEDIATE") if is_sqlite(self._db) else self._db.atomic()

    def _run(self) -> None:
        stopping = False
        try:
            while not stopping:
                batch = []
                item = self._queue.get()
                while True:
                    if item is _STOP:
                        stopping = True
                        break
                    batch.append(item)
                    if len(batch) >= self._max_batch:
                        break
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                if batch:
                    self._commit(batch)
        finally:
            self._db.close()

    def _commit(self, batch: list[tuple[Callable[[], Any], Future[Any]]]) -> None:
        outcomes: list[tuple[bool, Any]] = []
        try:
            with self._transaction():
                cursor = self._db.cursor()
                for op, _ in batch:
                    # A savepoint per operation: a failing op undoes only itself. Plain
                    # statements: peewee's nested atomic() costs more than the op itself.
                    cursor.execute("SAVEPOINT kinbox_op")
                    try:
                        outcomes.append((True, op()))
                    except Exception as exc:
                        cursor.execute("ROLLBACK TO SAVEPOINT kinbox_op")
                        outcomes.append((False, exc))
                    cursor.execute("RELEASE SAVEPOINT kinbox_op")
        except Exception as exc:  # the commit itself failed: nothing of the batch is durable
            self._stats.rollbacks += 1
            for _, future in batch:
                future.set_exception(exc)
            return
        self._count(len(batch))
        for (ok, value), (_, future) in zip(outcomes, batch, strict=True):
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def _count(self, n: int) -> None:
        self._stats.batches += 1
        self._stats.operations += n
        self._stats.largest_batch = max(self._stats.largest_batch, n)
