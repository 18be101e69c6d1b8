"""The savepoints of one writer batch: how each operation's writes are undone alone.

Each operation of a batch runs under a savepoint of its own (or, first in a SQLite
transaction, none: beginning the transaction again undoes it), so one that raises takes
back only its own writes. On PostgreSQL the savepoint statements ride with the next
statement (:mod:`.pg_database`); on SQLite they run on the batch's bare cursor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import peewee as pw

from .database import is_sqlite
from .driver_errors import sqlite_statement
from .errors import DatabaseFailed
from .pg_database import PostgresDatabase

log = logging.getLogger("kinbox.writer")

SQLITE_LOCK = "IMMEDIATE"
"""How the writer begins a SQLite transaction: with the write lock at once (a batch that
began again after a rollback, :meth:`Control.undo`, too)."""



def undo_step(undo: Callable[[], object], cause: Exception) -> None:
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


class Control:
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
                self.now(f"BEGIN {SQLITE_LOCK}")
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
