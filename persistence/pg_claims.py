"""PostgreSQL's head reads: the claim's walk and the commit's next-head lookup.

Only the oldest open row of a target (its *head*) may be claimed. The
statement SQLite runs for that (:meth:`.hot_path.HotPath.due_heads`: the due
rows in ``seq`` order, filtered by a correlated "is it its target's head"
subquery, under a ``LIMIT``) leaves PostgreSQL's planner a choice, and on a
large backlog it chose badly: a walk of the whole table, or a scan and sort
of every pending row with the subquery run for each (seconds per claim).

Here every statement has one obvious plan over the partial indexes of
:mod:`.open_indexes`:

* a *window*: the next pending (or processing) rows after a ``seq`` cursor,
  ``ORDER BY seq LIMIT n`` on the index of that state alone, each marked
  claimable or not by a one-row probe of its target's head. The walk goes
  on window after window until it has enough heads or no rows are left,
  so no due head is ever out of reach, and only ids come back;
* a *lock*: the chosen rows by primary key, ``FOR UPDATE SKIP LOCKED``,
  with their state, due time and headship checked again in the lock's own
  (newer) snapshot, so a row another process took or finished meanwhile is
  dropped, and rows others hold are skipped, never waited for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import peewee as pw

from .hot_path import CLAIM_COLUMNS, INBOX, PENDING, PROCESSING, Head, chunks, head_probe

FIRST_WINDOW, LAST_WINDOW = 32, 4096
"""Rows in the walk's first window, and the most in one: each next window is eight times
the last (a claim of a few rows, the usual case, reads a few dozen; a walk past a deep
backlog of busy sessions takes a few round trips)."""


_DUE = {PENDING: "available_at", PROCESSING: "lease_until"}
"""The column that says when a row of each open state may be claimed."""


class PgClaims:
    """The head reads of one PostgreSQL database (run on the writer's connection)."""

    def __init__(self, db: pw.Database) -> None:
        self.db = db
        cols = ", ".join(CLAIM_COLUMNS)
        self.sql_window = {
            state: (f"SELECT w.message_id, w.seq, w.{due} <= %s AND w.transport = %s "
                    f"AND NOT (w.target_chat_id = ANY(%s)) "
                    f"AND w.seq = {head_probe('w.target_chat_id')} "
                    f"FROM (SELECT message_id, seq, target_chat_id, transport, {due} "
                    f"FROM {INBOX} WHERE status = '{state}' AND seq > %s "
                    f"ORDER BY seq LIMIT %s) w ORDER BY w.seq")
            for state, due in _DUE.items()}
        self.sql_lock = {
            state: (f"SELECT {cols} FROM {INBOX} m WHERE m.message_id = ANY(%s) "
                    f"AND m.status = '{state}' AND m.{due} <= %s "
                    f"AND m.seq = {head_probe('m.target_chat_id')} "
                    f"ORDER BY m.seq FOR UPDATE OF m SKIP LOCKED")
            for state, due in _DUE.items()}
        self.sql_heads_of = (f"SELECT {cols} FROM {INBOX} m WHERE m.seq = ANY(ARRAY("
                             f"SELECT {head_probe('t.target')} FROM unnest(%s::text[]) "
                             f"AS t(target))) FOR UPDATE OF m SKIP LOCKED")

    def due_heads(self, transport: str, now: float, limit: int,
                  exclude: Sequence[str] = ()) -> list[Head]:
        """Up to ``limit`` due heads of targets not in ``exclude``, oldest first, locked."""
        skip = list(exclude)
        found: list[Head] = []
        for state in (PENDING, PROCESSING):
            ids = self._walk(state, transport, now, limit, skip)
            if ids:
                rows = self.db.execute_sql(self.sql_lock[state], (ids, now))
                found.extend(Head._make(r) for r in rows)
        return sorted(found, key=lambda r: r.seq)[:limit]

    def _walk(self, state: str, transport: str, now: float, limit: int,
              skip: list[str]) -> list[str]:
        """Ids of up to ``limit`` claimable heads in ``state``, in ``seq`` order."""
        ids: list[str] = []
        after = 0
        window = max(FIRST_WINDOW, 4 * limit)
        while len(ids) < limit:
            rows: list[Any] = self.db.execute_sql(
                self.sql_window[state], (now, transport, skip, after, window)).fetchall()
            ids.extend(r[0] for r in rows if r[2])
            if len(rows) < window:
                break
            after = rows[-1][1]
            window = min(LAST_WINDOW, window * 8)
        return ids[:limit]

    def heads_of(self, targets: Sequence[str]) -> dict[str, Head]:
        """target -> its head, for the targets that have one; locked, rows others hold
        skipped (what is read stays true until the commit)."""
        found: dict[str, Head] = {}
        for part in chunks(targets):
            for r in self.db.execute_sql(self.sql_heads_of, (list(part),)):
                head = Head._make(r)
                found[head.target_chat_id] = head
        return found
