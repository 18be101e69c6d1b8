"""PostgreSQL's set-wise turn commit in three statements instead of eight.

On PostgreSQL each statement of the writer is a round trip, a plan and a
release of the interpreter lock; a batch of turn commits ran eight of them
(the fenced ack, the entries, the markers, the next heads, their markers, the
leases, two status updates). Data-modifying ``WITH`` clauses let one
statement write several tables, and arrays (``unnest``, ``= ANY``) carry any
number of rows in a fixed statement text, so the batch costs three:

1. the fenced ack, the transcript entries and the delivery markers;
2. each chaining session's new head, locked (others' rows skipped), with
   whether a turn of it has already committed;
3. the new heads' leases and every session's active/idle status.

The rules stay in :mod:`.set_wise` (which rows, which answers); this module
only says them to PostgreSQL. SQLite keeps its separate statements, whose
cost there is not the round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import peewee as pw

from .hot_path import CLAIM_COLUMNS, DELIVERED, INBOX, PROCESSING, Head, head_probe


class PgTurnSql:
    """The fused statements of a set-wise turn commit on one PostgreSQL database."""

    def __init__(self, db: pw.Database) -> None:
        self.db = db
        cols = ", ".join(f"m.{c}" for c in CLAIM_COLUMNS)
        self.sql_write = (
            f"WITH acked AS (UPDATE {INBOX} SET status = '{DELIVERED}', delivered_at = %s, "
            f"updated_at = %s, lease_owner = NULL, lease_until = NULL "
            f"WHERE message_id = ANY(%s) AND status = '{PROCESSING}' AND lease_owner = %s "
            f"RETURNING 1), "
            f"entries AS (INSERT INTO transcript_entries (session_id, role, text, visible, "
            f"message_id, sender_id, kind, created_at) SELECT * FROM unnest(%s::text[], "
            f"%s::text[], %s::text[], %s::boolean[], %s::text[], %s::text[], %s::text[], "
            f"%s::float8[])), "
            f"markers AS (INSERT INTO delivery_markers (session_id, message_id, created_at) "
            f"SELECT * FROM unnest(%s::text[], %s::text[], %s::float8[])) "
            f"SELECT COUNT(*) FROM acked")
        self.sql_heads = (
            f"SELECT {cols}, EXISTS (SELECT 1 FROM delivery_markers d "
            f"WHERE d.message_id = m.message_id) FROM {INBOX} m WHERE m.seq = ANY(ARRAY("
            f"SELECT {head_probe('t.target')} FROM unnest(%s::text[]) AS t(target))) "
            f"FOR UPDATE OF m SKIP LOCKED")
        self.sql_lease_and_status = (
            f"WITH leased AS (UPDATE {INBOX} SET status = '{PROCESSING}', lease_owner = %s, "
            f"lease_until = %s, updated_at = %s WHERE message_id = ANY(%s)), "
            f"active AS (UPDATE sessions SET status = 'active', updated_at = %s "
            f"WHERE id = ANY(%s) AND status <> 'active') "
            f"UPDATE sessions SET status = 'idle', updated_at = %s WHERE id = ANY(%s) "
            f"AND status <> 'idle'")

    def ack_and_write(self, owner: str, ids: Sequence[str], entries: Sequence[tuple[Any, ...]],
                      markers: Sequence[tuple[str, str, float]], now: float) -> int:
        """Acknowledge the rows of ``ids`` ``owner`` leases and insert ``entries`` (rows of
        ``entry_row``) and ``markers`` (session, message, time); how many it acknowledged."""
        columns = [list(c) for c in zip(*entries, strict=True)] if entries else [[]] * 8
        marks = [list(c) for c in zip(*markers, strict=True)] if markers else [[]] * 3
        row = self.db.execute_sql(self.sql_write,
                                  [now, now, list(ids), owner, *columns, *marks]).fetchone()
        return int(row[0])

    def heads_of(self, targets: Sequence[str]) -> tuple[dict[str, Head], set[str]]:
        """target -> its head (locked; rows others hold skipped), and the ids among those
        heads that already have a committed turn."""
        heads: dict[str, Head] = {}
        committed: set[str] = set()
        for r in self.db.execute_sql(self.sql_heads, (list(targets),)):
            head = Head._make(r[:-1])
            heads[head.target_chat_id] = head
            if r[-1]:
                committed.add(head.message_id)
        return heads, committed

    def lease_and_status(self, owner: str, until: float, lease: Sequence[str],
                         active: Sequence[str], idle: Sequence[str], now: float) -> None:
        """Lease ``lease`` to ``owner`` until ``until``; mark sessions active and idle."""
        self.db.execute_sql(self.sql_lease_and_status,
                            [owner, until, now, list(lease), now, list(active), now, list(idle)])
