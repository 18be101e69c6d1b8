"""Set-wise statements: one statement for many rows.

The writer shares the interpreter with every actor and producer thread, and
the database driver lets go of the interpreter lock on every statement (and
on every row of an ``executemany``). Under load, getting the lock back costs
far more than the statement: it is the writer's main cost. These statements
touch many rows at once (multi-row ``VALUES``, ``IN`` lists), so a batch of
turn commits costs a handful of lock hand-offs instead of several per message.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

import peewee as pw

from .database import is_postgres
from .hot_path import CLAIM_COLUMNS, INBOX, PENDING, PROCESSING, Head, HotPath, chunks, head_probe
from .inbox_notify import NOTIFY_SQL
from .models import InboxMessage
from .pg_claims import PgClaims
from .pg_commits import PgTurnSql
from .pg_database import defer
from .pg_params import json_rows
from .schema import INBOX_SEQUENCE
from .seq_mark import NEXT_SEQ_SQL

ROWS_PER_INSERT = 200
"""Rows per multi-row ``INSERT``: 200 x 15 parameters stays under every backend's bound."""

TEXT_PER_INSERT = 16_384
"""Characters of text (message bodies, transcript texts) a multi-row ``INSERT`` binds at
most on SQLite; a longer row goes in one of its own. Python's sqlite3 keeps each statement
it cached (one per row count) with the values last bound to it until it runs again: 200
statements a table, each holding up to 200 rows of 64 kB bodies, would keep gigabytes of
text alive for the process's life. So each holds at most this (a single-row one, one
row)."""

_INBOX_COLUMN_NAMES = ("message_id", "seq", "transport", "destination_peer_id",
                       "sender_chat_id", "target_chat_id", "kind", "content", "payload",
                       "attempts", "max_attempts", "available_at", "created_at", "updated_at",
                       "status", "lease_owner", "lease_until")
"""The columns a new inbox row is written with, in the order of every statement below."""
_INBOX_COLUMNS = ", ".join(_INBOX_COLUMN_NAMES)

_NEW_ROW = tuple(c for c in _INBOX_COLUMN_NAMES if c not in ("seq", "attempts"))
"""The values ``inbox_records.insert_params`` gives a new row, in order: every column above
but ``seq`` (numbered by the writer on SQLite, by the sequence on PostgreSQL) and
``attempts`` (0)."""
_BODY, _PAYLOAD = _NEW_ROW.index("content"), _NEW_ROW.index("payload")
_INBOX_TEXTS = (_INBOX_COLUMN_NAMES.index("content"), _INBOX_COLUMN_NAMES.index("payload"))
"""Where a SQLite row (``seq`` included) has its long texts."""


def _parts(rows: Sequence[Sequence[Any]], texts: tuple[int, ...]
           ) -> Iterator[Sequence[Sequence[Any]]]:
    """``rows`` in runs of at most :data:`ROWS_PER_INSERT` rows and, but for a single row,
    :data:`TEXT_PER_INSERT` characters at the positions ``texts``."""
    if not texts or sum(len(r[t] or "") for t in texts for r in rows) <= TEXT_PER_INSERT:
        for start in range(0, len(rows), ROWS_PER_INSERT):  # nearly every batch: one run
            yield rows[start:start + ROWS_PER_INSERT]
        return
    start = size = 0
    for i, row in enumerate(rows):
        n = sum(len(row[t] or "") for t in texts)
        if i > start and (i - start == ROWS_PER_INSERT or size + n > TEXT_PER_INSERT):
            yield rows[start:i]
            start, size = i, 0
        size += n
    if start < len(rows):
        yield rows[start:]


def _pg_new_value(column: str) -> str:
    """What PostgreSQL's new-rows statement puts in ``column``: from the row's JSON (``r``),
    cast to the model's type where it is a number."""
    if column == "seq":
        return f"nextval('{INBOX_SEQUENCE}')"
    if column == "attempts":
        return "0"
    field = InboxMessage._meta.fields[column]  # type: ignore[attr-defined]
    cast = ("::integer" if isinstance(field, pw.IntegerField) else
            "::float8" if isinstance(field, pw.DoubleField) else "")
    value = f"r->>{_NEW_ROW.index(column)}"
    return f"({value}){cast}" if cast else value


_PG_NEW_ROWS = (
    # PostgreSQL: the rows as one JSON text (``json_rows``), numbered in their order.
    f"WITH written AS (INSERT INTO {INBOX} ({_INBOX_COLUMNS}) "
    f"SELECT {', '.join(_pg_new_value(c) for c in _INBOX_COLUMN_NAMES)} "
    f"FROM (SELECT r FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS x(r, n) "
    f"ORDER BY n) o ON CONFLICT (message_id) DO NOTHING RETURNING 1) "
    f"SELECT COUNT(*) FROM written")
"""New rows on PostgreSQL in one statement of one parameter. As a multi-row ``VALUES``
the driver quoted each of the 15 values of each row on the writer thread, under the
interpreter lock, and the server parsed them all as one long text: a batch of 16 sends
took 1,649 us against 1,169 this way, interleaved on one connection (925 prepared, which
a transaction-mode pooler would not keep; see :mod:`.pg_prepared`)."""

PG_ROWS_CHARS = 32 * 1024 * 1024
"""Characters of message text (body and payload) in one new-rows statement on PostgreSQL,
at most: a ``jsonb`` array holds at most 256 MiB, a character takes at most four bytes,
and the rest of a row is a few short fields. A batch with more goes in several statements
(a thousand sends of a 256 KiB body would not fit in one)."""


def pg_row_parts(rows: Sequence[Sequence[Any]]) -> list[Sequence[Sequence[Any]]]:
    """``rows`` (``insert_params`` each) in consecutive parts of at most
    :data:`PG_ROWS_CHARS` of body and payload (a row larger alone is a part of its own)."""
    parts: list[Sequence[Sequence[Any]]] = []
    start, size = 0, 0
    for i, row in enumerate(rows):
        n = len(row[_BODY]) + len(row[_PAYLOAD])
        if i > start and size + n > PG_ROWS_CHARS:
            parts.append(rows[start:i])
            start, size = i, 0
        size += n
    if start < len(rows):
        parts.append(rows[start:])
    return parts


CHAIN_SLACK = 1.0
"""The most, in seconds, a turn commit's chain time runs past its own time: more than a
commit waits between reading the time and running, on a loaded writer."""


class BulkSql:
    """Set-wise statements on the hot path's database."""

    def __init__(self, hot: HotPath) -> None:
        self.hot = hot
        self.db = hot.db
        self.postgres = is_postgres(hot.db)
        self.pg = PgClaims(hot.db) if self.postgres else None
        """PostgreSQL's claim reads (None on SQLite)."""
        self.pg_turns = PgTurnSql(hot.db) if self.postgres else None
        """PostgreSQL's fused turn-commit statements (None on SQLite)."""
        self.sent_until = 0.0
        """The latest time a send this writer wrote (or tried to: a batch undone leaves
        it raised, still a time that has passed) was stamped with, its row's
        ``available_at``: see :meth:`chain_time`. Only the writer thread uses it."""
        p = hot.p
        self._inbox_row = "(" + ", ".join(  # SQLite's: seq numbered by the writer
            "0" if c == "attempts" else p for c in _INBOX_COLUMN_NAMES) + ")"
        self._entry_row = f"({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})"
        self._marker_row = f"({p}, {p}, {p})"

    def chain_time(self, now: float) -> float:
        """The time a turn commit stamped ``now`` judges its session's next head due at.

        A commit's time is read on its session's thread before it queues for the writer;
        a send stamped after it may be written first (an earlier batch, or its batch's
        sends running before its commits), and judged at the commit's own time that row
        would not be due yet: nothing would chain it, its send leased nothing either (an
        older row was in flight), and it would wait for the dispatcher's next tick (3% of
        a closed loop's messages did, its p99 send -> turn 200 ms against 36). Every row
        the commit can see was written before it runs, so the latest stamp written is a
        time the commit runs after; but at most :data:`CHAIN_SLACK` past the commit's own
        time, so that a clock set back (a wall clock stepped, a scenario's clock started
        again) cannot leave the mark ahead of it to cut backoffs short or stamp leases
        long for more than that."""
        return max(now, min(self.sent_until, now + CHAIN_SLACK))

    def _insert(self, head: str, row_sql: str, rows: Sequence[Sequence[Any]],
                texts: tuple[int, ...], tail: str = "") -> int:
        """Insert ``rows`` (their long texts at the positions ``texts``); how many were
        written."""
        written = 0
        for part in _parts(rows, texts):
            cursor = self.db.execute_sql(
                f"{head} VALUES " + ", ".join([row_sql] * len(part)) + tail,
                list(chain.from_iterable(part)))  # flattened in C: ~28 values a message
            written += cursor.rowcount
        return written

    def next_seq(self, targets: Sequence[str] = ()) -> tuple[int, set[str]]:
        """SQLite: the ``seq`` the next new row gets, and which of ``targets`` have an open
        row, in one read (for up to :data:`~.hot_path.IN_LIST_LIMIT` targets).

        SQLite numbers rows here: the writer holds the database's write lock for
        the whole transaction, so the number stays free until the commit; past the rows
        a prune deleted too (:mod:`.seq_mark`).
        """
        parts = chunks(targets)
        sql, params = NEXT_SEQ_SQL, []
        if parts:
            sql, params = f"{sql} UNION ALL {self.hot.open_rows_sql(len(parts[0]))}", parts[0]
        first, busy = 1, set()
        for target, top in self.db.execute_sql(sql, list(params)):
            if target is None:  # the MAX row (a target is never NULL)
                first = int(top) + 1
            else:
                busy.add(target)
        for part in parts[1:]:
            busy |= self.hot.with_open_rows(part)
        return first, busy

    def announce(self) -> None:
        """PostgreSQL: have the current transaction notify :data:`~.inbox_notify.CHANNEL`
        when it commits (other processes' listeners claim then), because it made rows
        claimable: new ones, or rows handed back, requeued, or behind a cancelled head.
        Sent with the transaction's next statement (or its ``COMMIT``); nothing on SQLite,
        where one runtime delivers."""
        if self.postgres:
            defer(self.db, NOTIFY_SQL)

    def insert_inbox(self, rows: Sequence[Sequence[Any]], first: int | None = None
                     ) -> tuple[int, int | None]:
        """New rows, in order (``inbox_records.insert_params`` each); an id that already
        has a row is skipped. How many were written, and on SQLite the first row's ``seq``
        (``first`` if given, from :meth:`next_seq` in this transaction; the others follow
        it by one): fewer written than ``rows`` means a repeat, which the caller must
        handle (the set-wise path undoes its savepoint).

        PostgreSQL takes the numbers from its sequence, and the transaction notifies
        :data:`~.inbox_notify.CHANNEL` (see there).
        """
        if self.postgres:
            written = sum(int(self.db.execute_sql(
                _PG_NEW_ROWS, (json_rows(part, len(_NEW_ROW)),)).fetchone()[0])
                for part in pg_row_parts(rows))
            if written:
                self.announce()
            return written, None
        if first is None:
            first = self.next_seq()[0]
        rows = [(r[0], first + i, *r[1:]) for i, r in enumerate(rows)]
        written = self._insert(f"INSERT INTO {INBOX} ({_INBOX_COLUMNS})", self._inbox_row,
                               rows, _INBOX_TEXTS, " ON CONFLICT (message_id) DO NOTHING")
        return written, first

    def insert_entries(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Transcript entries: (session_id, role, text, visible, message_id, sender_id, kind,
        created_at)."""
        self._insert("INSERT INTO transcript_entries (session_id, role, text, visible, "
                     "message_id, sender_id, kind, created_at)", self._entry_row, rows, (2,))

    def insert_markers(self, rows: Sequence[tuple[str, str, float]]) -> None:
        """Delivery markers: (session_id, message_id, created_at)."""
        self._insert("INSERT INTO delivery_markers (session_id, message_id, created_at)",
                     self._marker_row, rows, ())

    def lease_heads(self, targets: Sequence[tuple[str, float]], owner: str, until: float,
                    now: float) -> tuple[dict[str, Head], set[str]]:
        """SQLite: lease to ``owner`` until ``until`` (stamped ``now``) the head of each
        ``(target, time)`` of ``targets`` that may chain at that time (pending, due, not
        suspect: ``inbox_core.chains`` as a condition), in one statement; target -> the
        leased row (CLAIM_COLUMNS, as it is now), and which of those rows already have a
        committed turn (a delivery marker), for the caller to undo the lot.
        """
        if self.postgres:
            raise TypeError("lease_heads is SQLite's: PostgreSQL's commits lock their heads "
                            "(pg_commits)")
        cols = ", ".join(CLAIM_COLUMNS)
        found: dict[str, Head] = {}
        committed: set[str] = set()
        p = self.hot.p
        for part in chunks(targets):
            values = ", ".join([f"({p}, {p})"] * len(part))
            sql = (f"UPDATE {INBOX} SET status = '{PROCESSING}', lease_owner = {p}, "
                   f"lease_until = {p}, updated_at = {p} WHERE seq IN (WITH t(target, at) AS "
                   f"(VALUES {values}) SELECT h.seq FROM t JOIN {INBOX} h "
                   f"ON h.seq = {head_probe('t.target')} WHERE h.status = '{PENDING}' "
                   f"AND h.available_at <= t.at AND h.suspect IS NOT 1) "
                   f"RETURNING {cols}, EXISTS (SELECT 1 FROM delivery_markers d "
                   f"WHERE d.message_id = {INBOX}.message_id)")
            params = [owner, until, now, *(x for pair in part for x in pair)]
            for r in self.db.execute_sql(sql, params):
                head = Head._make(r[:-1])
                found[head.target_chat_id] = head
                if r[-1]:
                    committed.add(head.message_id)
        return found, committed
