"""Driver errors as kinbox errors, where every statement passes: the database classes.

peewee maps each driver's exceptions to its own DB-API classes
(``OperationalError``, ``IntegrityError``...). A caller of
``kinbox.persistence`` catches one tree, :class:`~.errors.KinboxError`, so the
databases kinbox opens raise each of those as a :class:`~.errors.DatabaseFailed`
that is also the peewee class it stands for: code inside this layer that tests
for a peewee type (a prepared statement's way back to text) sees what it
always saw, and a caller gets no bare driver error (the first statement
after a server restart, a lock wait that timed out, a full disk, a value the
driver cannot send: :func:`refused_value`), with one exception: SQLite reads
a result's rows as they are fetched, after the statement ran, and an I/O error
in between comes as ``sqlite3``'s.

:func:`kinbox_errors` decorates a peewee ``Database`` class: it wraps the ways a
statement reaches the driver (connecting, every query, ``BEGIN``, ``COMMIT``,
``ROLLBACK``) in a ``try`` that costs one call until something fails;
:func:`sqlite_statement` does the same for the writer's bare cursor.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar
from urllib.parse import quote

import peewee as pw

from .connections import ThreadConnections
from .errors import DatabaseFailed


def _standing_for(base: type[pw.PeeweeException], doc: str) -> type[DatabaseFailed]:
    """The kinbox error for peewee's ``base``: both at once, named and kinded after it."""
    return type(base.__name__, (DatabaseFailed, base),
                {"__doc__": doc, "__module__": __name__, "kind": base.__name__})


DataError = _standing_for(pw.DataError, "A value the database refused (out of range, bad "
                          "text).")
IntegrityError = _standing_for(pw.IntegrityError, "A constraint the statement broke.")
InterfaceError = _standing_for(pw.InterfaceError, "The connection is closed or unusable.")
InternalError = _standing_for(pw.InternalError, "The database's own failure.")
NotSupportedError = _standing_for(pw.NotSupportedError, "A feature the database lacks.")
OperationalError = _standing_for(pw.OperationalError, "A lost connection, a lock wait that "
                                 "timed out, a full disk, a server shutting down.")
ProgrammingError = _standing_for(pw.ProgrammingError, "A statement the database cannot run "
                                 "(a missing table: run ``kinbox db upgrade``).")
OtherDatabaseError = _standing_for(pw.DatabaseError, "Any other database error.")

_DRIVER = (pw.DatabaseError, pw.InterfaceError)
_BY_NAME: dict[str, type[DatabaseFailed]] = {
    cls.kind: cls for cls in (DataError, IntegrityError, InterfaceError, InternalError,
                              NotSupportedError, OperationalError, ProgrammingError,
                              OtherDatabaseError)}
"""By DB-API class name, which peewee's classes and every driver's share (psycopg2's
``UniqueViolation`` is an ``IntegrityError``)."""


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE of the driver error behind ``exc`` (psycopg2's ``pgcode``), found along
    its chain (peewee raises its error while handling the driver's; kinbox's, from
    peewee's); None when there is none (SQLite's errors have no SQLSTATE)."""
    seen: BaseException | None = exc
    for _ in range(8):  # a short chain: kinbox's, peewee's, the driver's
        if seen is None:
            return None
        code = getattr(seen, "pgcode", None)
        if code is not None:
            return str(code)
        seen = seen.__cause__ or seen.__context__
    return None


def _primary_message(exc: BaseException) -> str | None:
    """PostgreSQL's primary message for ``exc`` (psycopg2's ``diag``; peewee's error holds
    the driver's as its argument); None when there is none (SQLite, a failed connect)."""
    for candidate in (exc, *exc.args, exc.__cause__, exc.__context__):
        primary = getattr(getattr(candidate, "diag", None), "message_primary", None)
        if primary:
            return str(primary)
    return None


def as_kinbox(exc: Exception) -> DatabaseFailed:
    """The kinbox error standing for ``exc``, peewee's or a driver's (by its nearest
    DB-API class). On PostgreSQL its text is the primary message alone, the driver's
    whole text (a refused row's values in its ``DETAIL``) kept on ``.detail``."""
    cls: type[DatabaseFailed] = OtherDatabaseError
    for base in type(exc).__mro__:
        if base.__name__ in _BY_NAME:
            cls = _BY_NAME[base.__name__]
            break
    primary = _primary_message(exc)
    failed = cls(*exc.args) if primary is None else cls(primary)
    failed.sqlstate = sqlstate_of(exc)
    if primary is not None:
        failed.detail = str(exc)
    return failed


def reraise(exc: Exception) -> NoReturn:
    """Raise the kinbox error standing for ``exc`` in its place. Chained to ``exc`` unless
    its text was cut: a traceback would print the driver's whole text with it. (Its
    ``__context__`` still holds ``exc``, where :func:`sqlstate_of` looks.)"""
    failed = as_kinbox(exc)
    if failed.detail is None:
        raise failed from exc
    raise failed from None


def sqlite_statement(cursor: sqlite3.Cursor) -> Callable[[str], object]:
    """Run statements on a bare SQLite cursor (no peewee layer), failing as kinbox errors."""
    def run(sql: str) -> object:
        try:
            return cursor.execute(sql)
        except sqlite3.Error as exc:
            reraise(exc)
    return run


_STATEMENT_METHODS = ("connect", "execute_sql", "begin", "commit", "rollback")
"""Every way a statement reaches the driver through peewee (``BEGIN``, ``COMMIT`` and
``ROLLBACK`` do not all go through ``execute_sql``; opening a connection is its own)."""

D = TypeVar("D", bound=type[pw.Database])


def refused_value(exc: ValueError) -> DatabaseFailed:
    """The kinbox error for a value the driver refused to send: a ``DataError``, as the
    database's own refusal of bad text is. A lone surrogate has no UTF-8
    (``UnicodeEncodeError``, both drivers) and psycopg2 refuses a NUL in text
    (``ValueError``), before the database sees anything; the same value in a statement's
    JSON text reaches PostgreSQL, which refuses it as a ``DataError``. So a write gets one
    answer whichever statement carries its value. The text names the position, never the
    value (``UnicodeEncodeError``'s arguments hold the whole string: a message body)."""
    return DataError(str(exc))


def _failing_as_kinbox(method: Callable[..., Any]) -> Callable[..., Any]:
    # A statement's parameter the driver cannot send (see refused_value); not a connect's
    # (a bad connection setting is no refused value).
    statement = method.__name__ != "connect"

    @functools.wraps(method)
    def call(self: pw.Database, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except DatabaseFailed:
            raise
        except _DRIVER as exc:
            reraise(exc)
        except ValueError as exc:
            if not statement:
                raise
            raise refused_value(exc) from None
    return call


def kinbox_errors(cls: D) -> D:
    """Class decorator for a peewee ``Database``: its statements fail as kinbox errors."""
    for name in _STATEMENT_METHODS:
        setattr(cls, name, _failing_as_kinbox(getattr(cls, name)))
    return cls


@kinbox_errors
class SqliteDatabase(ThreadConnections, pw.SqliteDatabase):
    """peewee's SQLite database, failing with kinbox errors, every thread's connection
    noted (:mod:`.connections`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Each thread uses its own connection alone; close_all() may close it from another.
        kwargs.setdefault("check_same_thread", False)
        super().__init__(*args, **kwargs)

    def _connect(self) -> sqlite3.Connection:
        """A connection to the file, which must exist (``mode=rw``): ``open_database``
        makes a new one, private, before the first. A thread's first connection made after
        the file was deleted (the health probe's, a request's) made an empty database in its
        place, which the next runtime started on; it fails now, saying the file is gone."""
        if self.connect_params.get("uri"):  # a URI names its own mode (the read-only one)
            return super()._connect()
        try:
            conn = sqlite3.connect(sqlite_uri(self.database, "rw"), uri=True,
                                   timeout=self._timeout, isolation_level=None,
                                   **self.connect_params)
        except sqlite3.OperationalError as exc:
            if os.path.exists(self.database):
                raise
            raise sqlite3.OperationalError(
                f"there is no database file at {self.database!r} (deleted or moved since "
                "it was opened); none is created in its place") from exc
        try:
            self._add_conn_hooks(conn)
        except Exception:
            conn.close()
            raise
        return conn

    def rollback(self) -> None:
        """Roll the transaction back; nothing to do when SQLite ended it already. A full
        disk or an I/O error (in a statement or in ``COMMIT``) rolls the whole transaction
        back inside SQLite, and peewee's rollback after it failed with 'no transaction is
        active', which its callers got in place of the error that ended it."""
        conn = self._state.conn
        if conn is not None and not self.is_closed() and not conn.in_transaction:
            return
        super().rollback()


def sqlite_uri(path: str, mode: str) -> str:
    """The ``file:`` URI of the SQLite file ``path`` opened in ``mode`` (``ro``, ``rw``):
    percent-encoded, so a '?' or '#' in the path stays part of the name."""
    return f"file:{quote(path)}?mode={mode}"
