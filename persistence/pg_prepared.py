"""Server-side prepared statements on PostgreSQL, for the claim's two statements.

psycopg2 sends every statement as text, so the server plans it each time. For
a claim that is most of its cost: the window read planned in 0.5 ms and ran in
0.07 ms, the lock-and-lease statement the same (measured on a small backlog,
where the latency of a send across processes is decided). ``PREPARE``d once
per connection, a statement is planned by the server's plan cache the way
asyncpg's or JDBC's are: custom plans for its first executions, then a
generic plan kept only if it costs no more (``plan_cache_mode`` is left to
the server; ``tests/test_scaleout_open_indexes.py`` checks the plans a
prepared claim settles on, on a large table as on a small one).

A prepared statement lives as long as its server session. A pooler in
transaction mode (PgBouncer) gives each transaction any backend, where the
name is unknown: an ``EXECUTE`` that finds its statement gone prepares it
again and retries once; if it is gone again, the statement goes back to
plain text on every connection for good, with one warning saying why.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import peewee as pw

log = logging.getLogger("kinbox.pg_prepared")

UNDEFINED, DUPLICATE = "26000", "42P05"
"""SQLSTATEs: no prepared statement of that name here; one exists already."""


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error as peewee re-raises it (raised while handling the
    driver's, whose ``pgcode`` it is), else None."""
    driver = exc.__cause__ or exc.__context__
    return getattr(driver, "pgcode", None)


class PreparedStatement:
    """One statement with named ``%(name)s`` parameters, prepared on each connection that
    runs it (``params``: its parameters' names and PostgreSQL types, in order)."""

    def __init__(self, db: pw.Database, name: str, sql: str,
                 params: Sequence[tuple[str, str]]) -> None:
        numbers = {n: f"${i}" for i, (n, _) in enumerate(params, 1)}
        body = re.sub(r"%\((\w+)\)s", lambda m: numbers[m.group(1)], sql)
        types = ", ".join(t for _, t in params)
        # The name carries a hash of the text: a backend shared through a pooler may hold
        # a statement of this name from another version or program, never this text's.
        digest = hashlib.sha256(f"{types}|{body}".encode()).hexdigest()[:12]
        self.db, self.name, self.sql = db, f"{name}_{digest}", sql
        self.prepare_sql = f"PREPARE {self.name} ({types}) AS {body}"
        self.execute_text = (f"EXECUTE {self.name} ("
                             + ", ".join(f"%({n})s::{t}" for n, t in params) + ")")
        self._ready: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.plain = False
        """True once the statement went back to plain text (it did not stay prepared)."""

    def run(self, params: Mapping[str, Any]) -> list[Any]:
        """The statement's rows for ``params``. Inside a transaction block the plain text
        runs: an ``EXECUTE`` that failed there would abort the transaction."""
        if self.plain or self.db.in_transaction():
            return list(self.db.execute_sql(self.sql, params).fetchall())
        for attempt in (1, 2):
            self._prepare()
            try:
                return list(self.db.execute_sql(self.execute_text, params).fetchall())
            except pw.DatabaseError as exc:
                if _sqlstate(exc) != UNDEFINED:
                    raise
                with self._lock:  # gone from this server session (a pooler, a DISCARD)
                    self._ready.pop(self.db.connection(), None)
                if attempt == 2:
                    log.warning("prepared statement %s does not stay on its connection "
                                "(a transaction-mode pooler?); it is planned each time "
                                "from now on", self.name)
                    self.plain = True
        return list(self.db.execute_sql(self.sql, params).fetchall())

    def _prepare(self) -> None:
        conn = self.db.connection()
        with self._lock:
            if self._ready.get(conn):
                return
        try:
            self.db.execute_sql(self.prepare_sql)
        except pw.DatabaseError as exc:
            if _sqlstate(exc) != DUPLICATE:  # already there: this session prepared it
                raise
        with self._lock:
            self._ready[conn] = True
