"""Hand-written SQL for the statements every message runs through.

Peewee builds each query anew, which costs tens of microseconds a
statement; on the per-message path (enqueue, fence, commit a turn, lease
the next row) that was most of the writer thread's time. These statements
are fixed strings with the backend's placeholder, so they cost only the
database's own work. Everything else keeps using the models.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import peewee as pw

from .database import is_postgres
from .inbox_core import DELIVERED, OPEN_STATES, PENDING, PROCESSING, Fingerprint
from .models import InboxMessage
from .numbered_ids import numbered

INBOX = InboxMessage._meta.table_name  # type: ignore[attr-defined]


class Head(NamedTuple):
    """An open row as the claim statements read it (the columns of :data:`CLAIM_COLUMNS`)."""

    message_id: str
    seq: int
    target_chat_id: str
    sender_chat_id: str | None
    kind: str
    content: str
    payload: str | None
    attempts: int
    created_at: float
    status: str
    available_at: float
    lease_until: float | None
    suspect: bool | int | None
    """A nullable column: NULL (never a suspect), or true (SQLite: 1); read it with bool()."""


CLAIM_COLUMNS = Head._fields


class Existing(NamedTuple):
    """A row an enqueue finds under its id (the columns the idempotence rule compares,
    ``inbox_core.Fingerprint``, then the receipt's)."""

    target_chat_id: str
    kind: str
    content: str
    sender_chat_id: str | None
    payload: str | None
    status: str
    created_at: float

    def fingerprint(self) -> Fingerprint:
        """The row as the idempotence rule compares it."""
        return Fingerprint(self.target_chat_id, self.kind, self.content, self.sender_chat_id,
                           self.payload or "{}")


def is_open(alias: str = "") -> str:
    """SQL for "the row is open" (``inbox_core.OPEN_STATES``), of the row named ``alias``:
    the condition of the open rows' partial indexes (:mod:`.open_indexes`), word for word.
    A statement meaning to walk those indexes must say it so, with the states written out:
    SQLite uses a partial index only for a statement whose condition implies the index's
    as written (``status IN (?, ?)`` with bound values does not, and reads the table)."""
    states = ", ".join(f"'{state}'" for state in OPEN_STATES)
    return f"{alias + '.' if alias else ''}status IN ({states})"


IN_LIST_LIMIT = 500
"""Values per ``IN (...)`` list: well under every backend's bound on parameters."""


def chunks(values: Sequence[Any]) -> list[Sequence[Any]]:
    """``values`` in slices of at most :data:`IN_LIST_LIMIT`."""
    return [values[i:i + IN_LIST_LIMIT] for i in range(0, len(values), IN_LIST_LIMIT)]


def head_probe(target: str) -> str:
    """SQL for the ``seq`` of a target's head (its oldest open row), NULL if it has none:
    one probe of the partial index over open rows (:mod:`.open_indexes`), which holds no
    delivered row and no other state's. The condition repeats the index's word for word
    (SQLite uses a partial index only then)."""
    return (f"(SELECT o.seq FROM {INBOX} o WHERE o.target_chat_id = {target} "
            f"AND {is_open('o')} ORDER BY o.seq LIMIT 1)")


def direct_turn_marked(target: str) -> str:
    """SQL for "a direct turn (a cron run, a social event) of ``target`` runs, in any
    process": its session's mark (:meth:`.sessions.SessionStore.take_direct_turn`). No
    runtime on PostgreSQL leases a marked session a new row, whether it claims or chains."""
    return f"((SELECT s.turn_owner FROM sessions s WHERE s.id = {target}) IS NOT NULL)"


class HotPath:
    """The per-message statements for one database."""

    def __init__(self, db: pw.Database) -> None:
        self.db = db
        self.postgres = is_postgres(db)
        p = "%s" if self.postgres else "?"
        self.p = p
        cols = ", ".join(CLAIM_COLUMNS)
        self.sql_head = f"SELECT {cols} FROM {INBOX} WHERE seq = {head_probe(p)}"
        # Two EXISTS, each a walk of one state's partial index (an OR of the two
        # states in one WHERE reads the whole table).
        self.sql_runnable = (
            f"SELECT 1 WHERE EXISTS (SELECT 1 FROM {INBOX} r WHERE r.status = '{PROCESSING}' "
            f"AND r.transport = {p}) OR EXISTS (SELECT 1 FROM {INBOX} m "
            f"WHERE m.status = '{PENDING}' AND m.available_at <= {p} AND m.transport = {p} "
            f"AND m.seq = {head_probe('m.target_chat_id')})")
        self._head_params = self.sql_head.count(p)  # the target, once per placeholder
        # Compare-and-set: only a row that is still claimable is taken, so two
        # workers racing for the same row (another process's claim) cannot both win.
        self.sql_lease = (f"UPDATE {INBOX} SET status = '{PROCESSING}', lease_owner = {p}, "
                          f"lease_until = {p}, updated_at = {p} WHERE message_id = {p} "
                          f"AND ((status = '{PENDING}' AND available_at <= {p}) "
                          f"OR (status = '{PROCESSING}' AND lease_until <= {p}))")
        self.sql_marker_exists = f"SELECT 1 FROM delivery_markers WHERE message_id = {p} LIMIT 1"
        self.sql_marked = f"SELECT {direct_turn_marked(p)}"
        self.sql_existing = (f"SELECT {', '.join(Existing._fields)} "
                             f"FROM {INBOX} WHERE message_id = {p}")
        # PostgreSQL: the walk holds each member it finds until its transaction ends, so a
        # prune in another process cannot delete it before the next member is committed.
        self.sql_held = (f"SELECT 1 FROM {INBOX} WHERE message_id = {p}"
                         + (" FOR KEY SHARE" if is_postgres(db) else ""))

    def due_heads(self, transport: str, now: float, limit: int) -> list[Head]:
        """The oldest open row of each target, when due, oldest first (CLAIM_COLUMNS).

        SQLite's; PostgreSQL's claim walks and locks in :mod:`.pg_claims`.

        One query per open state, each walking that state's rows in ``seq``
        order on its partial index and stopping at ``limit`` heads, so
        a claim costs about ``limit`` index probes however long the backlog.
        """
        p = self.p
        cols = ", ".join(f"m.{c}" for c in CLAIM_COLUMNS)
        found: list[tuple[Any, ...]] = []
        for status, due in ((PENDING, "available_at"), (PROCESSING, "lease_until")):
            sql = (f"SELECT {cols} FROM {INBOX} m WHERE m.status = '{status}' "
                   f"AND m.{due} <= {p} AND m.transport = {p} "
                   f"AND m.seq = {head_probe('m.target_chat_id')} "
                   f"ORDER BY m.seq LIMIT {p}")
            found.extend(Head._make(r) for r in self.db.execute_sql(sql, (now, transport, limit)))
        return sorted(found, key=lambda r: r.seq)[:limit]

    def has_runnable(self, transport: str, now: float) -> bool:
        """A turn is in flight (a row is processing) or a target's head is due now.

        One statement, so both halves see the same snapshot: as two queries, a
        row claimed between them was seen by neither (pending no more, and not
        yet processing for the first).
        """
        return self.fetch_one(self.sql_runnable, (transport, now, transport)) is not None

    def lease_many(self, ids: Sequence[str], owner: str, until: float, now: float) -> None:
        """Lease several rows."""
        for part in chunks(ids):
            self.db.execute_sql(
                f"UPDATE {INBOX} SET status = '{PROCESSING}', lease_owner = {self.p}, "
                f"lease_until = {self.p}, updated_at = {self.p} "
                f"WHERE message_id IN ({self.in_list(len(part))})", [owner, until, now, *part])

    def with_open_rows(self, targets: Sequence[str]) -> set[str]:
        """Which of ``targets`` have an open (pending or processing) row."""
        return {r[0] for part in chunks(targets)
                for r in self.db.execute_sql(self.open_rows_sql(len(part)), list(part))}

    def open_rows_sql(self, n: int) -> str:
        """SQL for which of ``n`` targets have an open row: a probe each of the open rows'
        partial index, whose condition it repeats word for word (SQLite uses a partial
        index only then)."""
        return (f"SELECT DISTINCT target_chat_id, NULL FROM {INBOX} WHERE target_chat_id IN "
                f"({self.in_list(n)}) AND {is_open()}")

    def with_markers(self, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` already have a committed turn."""
        return {r[0] for part in chunks(ids) for r in self.db.execute_sql(
            f"SELECT DISTINCT message_id FROM delivery_markers "
            f"WHERE message_id IN ({self.in_list(len(part))})", list(part))}

    def session_exists(self, session_id: str) -> bool:
        """Cheap existence check for a session id."""
        return self.fetch_one(f"SELECT 1 FROM sessions WHERE id = {self.p}",
                              (session_id,)) is not None

    def in_list(self, n: int) -> str:
        """``n`` placeholders for an ``IN (...)`` list."""
        return ", ".join([self.p] * n)

    def fetch_one(self, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
        """The first row of a query, or None."""
        row = self.db.execute_sql(sql, params).fetchone()
        return tuple(row) if row is not None else None

    def fence_rows(self, ids: Sequence[str]) -> dict[str, tuple[str, str | None, int, int, str]]:
        """message_id -> (status, lease_owner, attempts, max_attempts, transport), the rows
        locked until the caller's transaction ends on PostgreSQL: what the caller then
        writes on the strength of this read (an ack, a retry, a release, a turn's
        entries) cannot meet a takeover committed in between. (SQLite's writer holds the
        database's write lock for the whole transaction already.)"""
        found = {}
        lock = " ORDER BY message_id FOR UPDATE" if self.postgres else ""
        # Sorted before chunking: every caller then locks in one global order across its
        # chunks as well as within each, so two fences of over a chunk cannot deadlock.
        for part in chunks(sorted(ids) if self.postgres else ids):
            sql = (f"SELECT message_id, status, lease_owner, attempts, max_attempts, transport "
                   f"FROM {INBOX} WHERE message_id IN ({self.in_list(len(part))}){lock}")
            found.update((r[0], tuple(r[1:])) for r in self.db.execute_sql(sql, list(part)))
        return found  # type: ignore[return-value]

    def mark_delivered(self, ids: Sequence[str], now: float) -> None:
        """Acknowledge rows."""
        for part in chunks(ids):
            self.db.execute_sql(
                f"UPDATE {INBOX} SET status = '{DELIVERED}', delivered_at = {self.p}, "
                f"updated_at = {self.p}, lease_owner = NULL, lease_until = NULL "
                f"WHERE message_id IN ({self.in_list(len(part))})", [now, now, *part])

    def deliver_fenced(self, ids: Sequence[str], owner: str, now: float) -> int:
        """Acknowledge the rows of ``ids`` that ``owner`` holds the lease of (the fence and
        the ack in one statement); how many it acknowledged."""
        return self._fenced(f"status = '{DELIVERED}', delivered_at = {self.p}, "
                            f"updated_at = {self.p}, lease_owner = NULL, lease_until = NULL",
                            [now, now], ids, owner)

    def release_fenced(self, ids: Sequence[str], owner: str, now: float) -> int:
        """Hand back to pending the rows of ``ids`` that ``owner`` holds the lease of (the
        fence and the release in one statement); how many it released."""
        return self._fenced(f"status = '{PENDING}', lease_owner = NULL, lease_until = NULL, "
                            f"turn_started_at = NULL, updated_at = {self.p}", [now], ids, owner)

    def _fenced(self, changes: str, params: list[Any], ids: Sequence[str], owner: str) -> int:
        """``UPDATE ... SET changes`` on the rows of ``ids`` that ``owner`` holds the lease
        of; how many it changed."""
        done = 0
        for part in chunks(ids):
            done += self.db.execute_sql(
                f"UPDATE {INBOX} SET {changes} WHERE message_id IN "
                f"({self.in_list(len(part))}) AND status = '{PROCESSING}' "
                f"AND lease_owner = {self.p}", [*params, *part, owner]).rowcount
        return done

    def head(self, target: str) -> Head | None:
        """The oldest open row of a target."""
        row = self.fetch_one(self.sql_head, (target,) * self._head_params)
        return Head._make(row) if row is not None else None

    def lease(self, message_id: str, owner: str, until: float, now: float) -> bool:
        """Lease one row if it is still claimable; False when someone else has it."""
        cursor = self.db.execute_sql(self.sql_lease, (owner, until, now, message_id, now, now))
        return cursor.rowcount == 1

    def marked(self, target: str) -> bool:
        """Does a direct turn mark ``target`` (:func:`direct_turn_marked`)?"""
        row = self.fetch_one(self.sql_marked, (target,))
        return row is not None and bool(row[0])

    def has_marker(self, message_id: str) -> bool:
        """A committed turn exists for this message."""
        return self.fetch_one(self.sql_marker_exists, (message_id,)) is not None

    def existing(self, message_id: str) -> Existing | None:
        """What the idempotence rule and the hooks read of a row, if the id has one."""
        row = self.fetch_one(self.sql_existing, (message_id,))
        return Existing(*row) if row is not None else None

    def first_free(self, base: str) -> str:
        """``base``, ``base-2``, ``base-3``... the first id no row holds (a chain's next
        member, :mod:`.numbered_ids`).

        Walked in the transaction that writes that member, it holds the members it
        found (PostgreSQL: ``FOR KEY SHARE``, which a delete waits for), so no prune
        deletes one before the new member commits; a walk that meets a prune's lock
        waits for its commit and finds the freed id. SQLite's writer holds the file."""
        return next(mid for mid in numbered(base)
                    if self.fetch_one(self.sql_held, (mid,)) is None)
