"""PostgreSQL's database class: a transaction's control statements travel with its next statement.

On PostgreSQL every statement is a round trip, and every round trip lets
go of the interpreter lock, which the writer then waits to get back behind
the session threads its last commit woke. A transaction's ``BEGIN``, its
savepoints and its notifications carry no data the caller reads, so they
need not travel alone. :class:`PostgresDatabase` keeps them, per thread and
in order, and sends them in front of the next statement as one
simple-query message (``BEGIN; SAVEPOINT kinbox_bulk_1; WITH acked AS ...``),
or in front of ``COMMIT``. A batch of turn commits was four round trips
(``BEGIN``, ``SAVEPOINT``, the fused commit, ``COMMIT``) and is two; a
batch of sends also lost its ``NOTIFY`` round trip. Measured on the
backlog drain: three statements more per batch cost 13% of its rate.

The statements run in the same order in the same transaction (an explicit
``BEGIN`` at the head of a message opens a transaction block that outlives
the message), and the caller reads the result of its own statement, which
comes last. A transaction that ran no statement sends nothing at all, not
even its ``COMMIT``. What differs is where an error lands:

- a statement the driver cannot format (a value it cannot adapt or encode)
  fails before anything is sent, and what waits keeps waiting;
- a message the server cannot parse runs none of its statements: at the
  head of a transaction its ``BEGIN`` keeps waiting; inside one, the
  deferred savepoint was never made, so the writer's ``ROLLBACK TO`` it
  fails and its whole batch fails with it (loudly: every caller gets the
  error, nothing of the batch is durable). Each of the writer's savepoints
  has a name of its own for that reason: a rollback to a name reused from an
  earlier operation would undo that one's writes instead;
- a deferred statement that fails (none should: they answer nothing) fails
  the statement it travelled with.

Only statements that answer nothing may be deferred: :meth:`defer` is for
``SAVEPOINT``, ``RELEASE SAVEPOINT`` and notifications; a statement whose
failure the caller must see at once (``ROLLBACK TO SAVEPOINT``) is run,
with whatever is deferred in front of it. Not for ``manual_commit`` blocks
(kinbox has none): there a deferred statement waits for the next one.
"""

from __future__ import annotations

import threading
from typing import Any

import peewee as pw

from .connections import ThreadConnections
from .driver_errors import kinbox_errors

_CONTROL = ("SAVEPOINT ", "RELEASE SAVEPOINT ")
"""The deferred statements that only structure a transaction: a transaction whose pending
statements are its ``BEGIN`` and these ran nothing, and its end sends nothing."""

GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"
"""Sent once on each connection: kinbox's prepared statements (:mod:`.pg_prepared`, the
only ones its connections run) use their generic plan from the first execution. Left to
the server, the claim's window read kept making a custom plan every time, a fifth of a
claim's time on an idle connection (1.60 against 1.28 ms, interleaved); their generic
plans are the ones the tests check, and they are made again as the tables grow."""

LOCK_WAIT_MS = 10_000
"""How long a statement on a kinbox connection waits for a lock another connection holds
before it fails (``lock_timeout``): what SQLite's busy timeout is there. A lock kept by a
stuck client (a psql session left in an open transaction) fails the batch that waits for
it, every caller told, where it used to halt the writer, and every send behind it, until
that client let go. Nothing of kinbox waits on a lock longer than a transaction of its
own lasts, but a schema upgrade (see :mod:`.schema`), which waits for another's."""

_ERRORS = pw.__exception_wrapper__
"""peewee's mapping of driver errors to its own (``IntegrityError``...), as every statement
that goes through peewee gets it."""


@kinbox_errors
class PostgresDatabase(ThreadConnections, pw.PostgresqlDatabase):  # type: ignore[misc]
    """peewee's PostgreSQL database, with control statements deferred (see the module),
    failing with kinbox errors (:mod:`.driver_errors`), every thread's connection noted
    (:mod:`.connections`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting = threading.local()

    def is_closed(self) -> bool:
        """peewee's answer, and also True for a connection the server ended (a restart, a
        failover, ``pg_terminate_backend``) outside a transaction: the driver knows once a
        statement on it failed, and the thread's next statement connects again (peewee's
        ``autoconnect``). Nothing is retried: the statement that found the connection gone
        failed to its caller. Inside a transaction the connection stays, for the
        transaction to fail and end as it must."""
        if super().is_closed():
            return True
        conn = self._state.conn
        if conn is not None and conn.closed and not self.in_transaction():
            self._pending().clear()
            self._state.reset()
            return True
        return False

    def _pending(self) -> list[str]:
        pending: list[str] | None = getattr(self._waiting, "statements", None)
        if pending is None:
            pending = self._waiting.statements = []
        return pending

    def defer(self, sql: str) -> None:
        """Send ``sql`` (a statement that answers nothing) in front of this thread's next
        statement on this database, at the latest with its ``COMMIT``; outside a
        transaction at once (nothing might follow it)."""
        if self.in_transaction():
            self._pending().append(sql)
        else:
            self.execute_sql(sql)

    def waiting(self) -> tuple[str, ...]:
        """The statements waiting for this thread's next one (for tests and monitoring)."""
        return tuple(self._pending())

    def begin(self, isolation_level: Any = None) -> None:
        if self.is_closed():  # opening later would reset peewee's transaction stack
            if not self.autoconnect:
                raise pw.InterfaceError("Error, database connection not opened.")
            self.connect()
        if isolation_level is None:
            isolation_level = self._isolation_level
        if isolation_level:
            level = self._adapter.isolation_level_str(isolation_level)
            self._pending().append(f"BEGIN TRANSACTION ISOLATION LEVEL {level}")
        else:
            self._pending().append("BEGIN")

    def execute_sql(self, sql: str, params: Any = None) -> Any:
        pending = self._pending()
        if not pending:
            return self._execute_cursor(sql, params)
        cursor = self.cursor()
        with _ERRORS:  # formatted first: a value the driver refuses loses nothing deferred
            body = cursor.mogrify(sql, params or ())
        # Each statement ends with a line break before its semicolon: a trailing comment
        # ends with its line, and cannot swallow the statement after it.
        message = "".join(f"{statement}\n;" for statement in pending).encode() + body
        sent = pending[:]
        pending.clear()
        self._log_query(message, None)
        try:
            with _ERRORS:
                cursor.execute(message)  # formatted already: no parameters, no second pass
        except Exception:
            # Nothing of the message ran (a syntax error is found before any of it runs):
            # the transaction has not begun, its BEGIN (and the rest) still waits.
            from psycopg2.extensions import TRANSACTION_STATUS_IDLE  # the extra's driver

            conn = self._state.conn
            if sent[0].startswith("BEGIN") and conn is not None and not conn.closed and (
                    conn.get_transaction_status() == TRANSACTION_STATUS_IDLE):
                pending[:0] = sent
            raise
        return cursor

    def commit(self) -> None:
        self._end("COMMIT")

    def rollback(self) -> None:
        self._end("ROLLBACK")

    def _end(self, statement: str) -> None:
        pending = self._pending()
        if pending and pending[0].startswith("BEGIN") and (
                statement == "ROLLBACK" or all(s.startswith(_CONTROL) for s in pending[1:])):
            pending.clear()  # the transaction ran no statement: there is nothing to end
            return
        if statement == "ROLLBACK":
            pending.clear()  # what is deferred would be undone with the rest
            conn = self._state.conn
            if conn is not None and conn.closed:
                # The server ended the transaction with the connection (a restart,
                # pg_terminate_backend, even during COMMIT): nothing is left to undo, and
                # the error that found it gone is the one the caller gets, not this one's.
                return
        if self.is_closed():
            raise pw.InterfaceError(f"cannot {statement.lower()}: the connection is not open")
        self.execute_sql(statement)

    def _initialize_connection(self, conn: Any) -> None:
        self._pending().clear()  # nothing deferred on a connection outlives it
        with conn.cursor() as cursor:  # autocommit here: for the server session
            cursor.execute(f"SET lock_timeout = {int(LOCK_WAIT_MS)}")
            if conn.server_version >= 120000:  # the setting is PostgreSQL 12's
                cursor.execute(GENERIC_PLANS)
        super()._initialize_connection(conn)

    def _close(self, conn: Any) -> None:
        self._pending().clear()
        super()._close(conn)


def defer(db: pw.Database, sql: str) -> None:
    """Send ``sql`` (a statement that answers nothing) in front of this thread's next statement
    on ``db``: deferred on a :class:`PostgresDatabase`, at once on any other database."""
    if isinstance(db, PostgresDatabase):
        db.defer(sql)
    else:
        db.execute_sql(sql)
