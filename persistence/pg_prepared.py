"""Server-side prepared statements on PostgreSQL: the claim's two statements, the turn commit.

psycopg2 sends every statement as text, so the server plans it each time. For
a claim that is most of its cost: the window read planned in 0.5 ms and ran in
0.07 ms, the lock-and-lease statement the same (measured on a small backlog,
where the latency of a send across processes is decided). ``PREPARE``d once
per connection, a statement is planned once: kinbox's connections use the
generic plan from the first execution (``plan_cache_mode``, set by
:data:`.pg_database.GENERIC_PLANS`; left to the server, the claim's window read
was planned anew every time), and ``tests/test_scaleout_open_indexes.py``
checks those plans on a large table as on a small one.

A prepared statement lives as long as its server session. A pooler in
transaction mode (PgBouncer) gives each transaction any backend, where the
name is unknown: an ``EXECUTE`` that finds its statement gone prepares it
again and retries once; if it is gone again, the statement goes back to
plain text on every connection for good, with one warning saying why.

Inside a transaction block a failed ``EXECUTE`` aborts the transaction, so
:meth:`PreparedStatement.run` sends the text there. The writer's batch turn
commit runs inside one, under a savepoint that undoes a failure and sends the
batch through the one-by-one path; it uses :meth:`PreparedStatement.run_guarded`,
which lets such a failure raise after putting its bookkeeping right (what
preparing it saves is in :mod:`.pg_commits`). ``PREPARE`` itself is not
transactional: a rollback keeps it.

A generic plan is made once, from the table sizes of that moment, and
PostgreSQL makes it again only when a table's statistics change (``ANALYZE``,
autovacuum's). With autovacuum off, or between its runs on a table that grows
from empty, the commit kept the plan chosen while ``delivery_markers`` had a
page: a sequential read of the table for each next head's marker probe,
which tripled the server's CPU per drained message by 10,000 markers. So each
connection prepares a statement again after :attr:`PreparedStatement.REPLAN_FIRST`
executions, then after twice as many each time, at most every
:attr:`~PreparedStatement.REPLAN_MOST`: its plan follows the tables as they
grow, at the cost of a round trip and a few custom plans each time.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import peewee as pw

from .driver_errors import sqlstate_of

log = logging.getLogger("kinbox.pg_prepared")

UNDEFINED, DUPLICATE, STALE = "26000", "42P05", "0A000"
"""SQLSTATEs: no prepared statement of that name here; one exists already; its cached plan
no longer fits its tables ("cached plan must not change result type", after a schema
change)."""


@dataclass
class _Use:
    """A statement's executions on one connection since it was prepared there, and how
    many it may have before it is prepared again."""

    runs: int
    limit: int


class PreparedStatement:
    """One statement with named ``%(name)s`` parameters, prepared on each connection that
    runs it (``params``: its parameters' names and PostgreSQL types, in order)."""

    REPLAN_FIRST, REPLAN_MOST = 8, 65_536
    """Executions on a connection before the statement is prepared there again: the first
    time, and the most (the limit doubles in between)."""

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
        self.deallocate_sql = f"DEALLOCATE {self.name}"
        self.execute_text = (f"EXECUTE {self.name} ("
                             + ", ".join(f"%({n})s::{t}" for n, t in params) + ")")
        self._uses: weakref.WeakKeyDictionary[Any, _Use] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._losses = 0
        self.plain = False
        """True once the statement went back to plain text (it did not stay prepared)."""

    def run(self, params: Mapping[str, Any]) -> list[Any]:
        """The statement's rows for ``params``. Inside a transaction block the plain text
        runs: an ``EXECUTE`` that failed there would abort the transaction."""
        if self.plain or self.db.in_transaction():
            return self._text(params)
        for _attempt in (1, 2):
            self._prepare()
            try:
                return self._execute(params)
            except pw.DatabaseError as exc:
                if sqlstate_of(exc) != UNDEFINED:
                    raise
                self._lost()
                if self.plain:
                    break
        return self._text(params)

    def run_guarded(self, params: Mapping[str, Any]) -> list[Any]:
        """The statement's rows for ``params``, prepared, for a caller inside a transaction
        block whose savepoint undoes a failure. A statement gone from the server session,
        or a name another statement of this text already took there, raises (the
        savepoint is aborted either way) after setting things right for the next call:
        prepared again, or used as it is."""
        if self.plain:
            return self._text(params)
        try:
            self._prepare()
        except pw.DatabaseError as exc:
            if sqlstate_of(exc) == DUPLICATE:
                self._mark_ready(self.REPLAN_FIRST)
            raise
        try:
            return self._execute(params)
        except pw.DatabaseError as exc:
            if sqlstate_of(exc) == UNDEFINED:
                self._lost()
            elif sqlstate_of(exc) == STALE:
                self._replan_next()
            raise

    def _text(self, params: Mapping[str, Any]) -> list[Any]:
        return list(self.db.execute_sql(self.sql, params).fetchall())

    def _execute(self, params: Mapping[str, Any]) -> list[Any]:
        rows = list(self.db.execute_sql(self.execute_text, params).fetchall())
        self._losses = 0
        return rows

    def _lost(self) -> None:
        """The statement was gone from this connection's server session (a pooler, a
        ``DISCARD``): prepare it again next time; lost twice with no success between, plain
        text for good."""
        with self._lock:
            self._uses.pop(self.db.connection(), None)
            self._losses += 1
            if self._losses < 2 or self.plain:
                return
            self.plain = True
        log.warning("prepared statement %s does not stay on its connection "
                    "(a transaction-mode pooler?); it is planned each time "
                    "from now on", self.name)

    def _replan_next(self) -> None:
        """Deallocate and prepare the statement again at this connection's next call."""
        with self._lock:
            use = self._uses.get(self.db.connection())
            if use is not None:
                use.runs = use.limit

    def _prepare(self) -> None:
        """``PREPARE`` on this connection unless it is there and not due to be planned
        again. On a plain connection a duplicate name is this text's (the name carries
        its hash) and is used as it is."""
        conn = self.db.connection()
        with self._lock:
            use = self._uses.get(conn)
            if use is not None and use.runs < use.limit:
                use.runs += 1
                return
            self._uses.pop(conn, None)  # whatever happens below, the next call starts over
        if use is not None:
            try:
                self.db.execute_sql(self.deallocate_sql)
            except pw.DatabaseError as exc:
                if sqlstate_of(exc) != UNDEFINED or self.db.in_transaction():
                    raise
        try:
            self.db.execute_sql(self.prepare_sql)
        except pw.DatabaseError as exc:
            if sqlstate_of(exc) != DUPLICATE or self.db.in_transaction():
                raise
        self._mark_ready(min(self.REPLAN_MOST, 2 * use.limit) if use else self.REPLAN_FIRST)

    def _mark_ready(self, limit: int) -> None:
        """Prepared on this connection, to be prepared again after ``limit`` executions."""
        with self._lock:
            self._uses[self.db.connection()] = _Use(1, limit)
