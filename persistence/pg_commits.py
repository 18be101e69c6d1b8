"""PostgreSQL's set-wise turn commit: one statement for a whole batch of turns.

On PostgreSQL each statement of the writer is a round trip, a plan and a
release of the interpreter lock; getting the lock back, with the session
threads the last commit woke all wanting it, costs the writer more than the
server's work (measured in the drain: a ``BEGIN`` of 20 us of server time
took the writer 1.8 ms). A batch of turn commits ran eight statements, then
three; data-modifying ``WITH`` clauses let one statement write several
tables, and arrays (``unnest``, ``= ANY``) and JSON texts (the entries and
markers, read as ``jsonb``) carry any number of rows in a fixed statement
text, so the batch is now one (:attr:`PgTurnSql.sql_commit`):

* the fenced ack (only rows still processing under the owner's lease), the
  transcript entries and the delivery markers;
* each chaining session's next head, locked (rows others hold skipped, never
  waited for), and leased when it is due, plain (not suspect) and has no
  committed turn yet; whether any due head has one (it sends the batch one
  by one, as the eight statements did).

A session's status is not written: it is read off its processing rows (see
:mod:`.session_view`).

All of it reads one snapshot, the statement's: the next head of a target is
its oldest open row *other than the rows this batch acknowledges* (they are
still open in that snapshot), which is the head the ack leaves behind. A row
another process committed after the snapshot is seen by the lock (which
takes its newest version and checks it again) or not at all (no chaining:
the dispatcher's claim gets it), never leased twice.

The statement is prepared (:meth:`.pg_prepared.PreparedStatement.run_guarded`:
the writer's batch savepoint undoes an ``EXECUTE`` that fails, and the batch
goes one by one). Planned as text for every batch, its parse and plan were a
third of the writer backend's CPU; prepared, a batch's statement took 14% less
time (93.7 against 108.7 us a turn, interleaved on one connection, 40 turns a
batch). Its generic plan must not depend on what the statistics say of the
small open-row indexes, so the ack's state is a parameter: with the literal,
the generic plan walked ``agent_inbox_processing_seq`` (every row version a
lease ever made, until vacuum) for the batch's ids instead of probing them by
primary key.

The rules stay in :mod:`.set_wise` (which commits, which answers); this module
only says them to PostgreSQL. SQLite keeps its separate statements, whose
cost there is not the round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import peewee as pw

from .hot_path import (
    CLAIM_COLUMNS,
    DELIVERED,
    INBOX,
    PENDING,
    PROCESSING,
    Head,
    direct_turn_marked,
    is_open,
)
from .pg_claims import marker_probe
from .pg_params import float8_array, json_rows, text_array
from .pg_prepared import PreparedStatement


class BatchOutcome(NamedTuple):
    """What one fused commit statement did."""

    acked: int
    """Rows acknowledged (fewer than asked: a lease was lost; the batch goes one by one)."""
    committed_heads: int
    """Due next heads that already have a committed turn (the batch goes one by one)."""
    leased: dict[str, Head]
    """target -> its next head, leased in this statement."""


class PgTurnSql:
    """The fused statements of a set-wise turn commit on one PostgreSQL database."""

    def __init__(self, db: pw.Database) -> None:
        self.db = db
        ucols = ", ".join(f"u.{c}" for c in CLAIM_COLUMNS)
        # ``inbox_core.chains`` at each chaining commit's time (``n.at``: its
        # ``BulkSql.chain_time``), as committing it alone would judge it.
        due = (f"n.status = '{PENDING}' AND n.available_at <= n.at "
               f"AND n.suspect IS NOT TRUE")
        # The next head: the oldest open row that this batch does not acknowledge.
        next_head = (f"(SELECT o.seq FROM {INBOX} o WHERE o.target_chat_id = t.target "
                     f"AND {is_open('o')} "
                     f"AND o.message_id <> ALL(%(ids)s) ORDER BY o.seq LIMIT 1)")
        self.sql_commit = (
            f"WITH acked AS (UPDATE {INBOX} SET status = '{DELIVERED}', "
            f"delivered_at = %(now)s, updated_at = %(now)s, lease_owner = NULL, "
            f"lease_until = NULL WHERE message_id = ANY(%(ids)s) "
            f"AND status = %(processing)s AND lease_owner = %(owner)s RETURNING 1), "
            f"entries AS (INSERT INTO transcript_entries (session_id, role, text, visible, "
            f"message_id, sender_id, kind, created_at) SELECT e->>0, e->>1, e->>2, "
            f"(e->>3)::boolean, e->>4, e->>5, e->>6, (e->>7)::float8 "
            f"FROM jsonb_array_elements(%(entries)s::jsonb) WITH ORDINALITY AS x(e, n) "
            f"ORDER BY n), "
            f"markers AS (INSERT INTO delivery_markers (session_id, message_id, created_at) "
            f"SELECT k->>0, k->>1, (k->>2)::float8 "
            f"FROM jsonb_array_elements(%(markers)s::jsonb) AS y(k)), "
            f"n AS (SELECT m.message_id, m.status, m.available_at, m.suspect, t.at, "
            f"{marker_probe('m.message_id')} AS done "
            f"FROM unnest(%(chaining)s::text[], %(chain_at)s::float8[]) AS t(target, at) "
            f"JOIN {INBOX} m ON m.seq = {next_head} FOR UPDATE OF m SKIP LOCKED), "
            # The state is checked again on the row being updated (its newest version).
            f"leased AS (UPDATE {INBOX} u SET status = '{PROCESSING}', "
            f"lease_owner = %(owner)s, lease_until = %(until)s, updated_at = %(now)s "
            f"FROM n WHERE u.message_id = n.message_id AND {due} AND NOT n.done "
            # A session a direct turn has marked gets no new lease: the turn waits for this
            # one, and a steady stream would otherwise never leave it a moment.
            f"AND NOT {direct_turn_marked('u.target_chat_id')} "
            f"AND u.status = '{PENDING}' AND u.available_at <= n.at "
            f"AND u.suspect IS NOT TRUE RETURNING {ucols}) "
            f"SELECT (SELECT COUNT(*) FROM acked), "
            f"(SELECT COUNT(*) FROM n WHERE {due} AND n.done), l.* "
            f"FROM (SELECT 1) AS one LEFT JOIN leased l ON TRUE")
        self.commit = PreparedStatement(db, "kinbox_turn_commit", self.sql_commit, [
            ("now", "float8"), ("ids", "text[]"), ("owner", "text"), ("until", "float8"),
            ("chaining", "text[]"), ("chain_at", "float8[]"), ("entries", "jsonb"),
            ("markers", "jsonb"), ("processing", "text")])

    def commit_batch(self, owner: str, ids: Sequence[str],
                     entries: Sequence[tuple[Any, ...]],
                     markers: Sequence[tuple[str, str, float]],
                     chaining: Sequence[tuple[str, float]], until: float,
                     now: float) -> BatchOutcome:
        """In one statement: acknowledge the rows of ``ids`` ``owner`` leases, insert
        ``entries`` (rows of ``entry_row``) and ``markers`` (session, message, time), lease
        each ``(session, time)`` of ``chaining``'s next head until ``until`` where it is due
        at that time."""
        # Every list goes as one string (see .pg_params): the ids, sessions and times as
        # array literals, the entries and markers (rows of several values) as one JSON text
        # each. Adapted by the driver, a list is quoted a value at a time, under the
        # interpreter lock (12 us a message in the writer for a batch's 28 turns), and the
        # server read the rows faster as JSON than as arrays of arrays (measured: 89
        # against 611 us a batch, round trip).
        # As ``jsonb``, each text is parsed once; as ``json`` every ``->>`` of an element
        # parsed it again, eight times for an entry (the statement took 85.6 against 94.2
        # us a turn, 40 turns a batch, interleaved on one connection). Times keep every
        # bit: ``jsonb`` holds the decimal text ``repr`` wrote as a ``numeric``, exactly
        # (it drops only the sign of a zero, which no time has).
        params = {"now": now, "ids": text_array(ids), "owner": owner, "until": until,
                  "chaining": text_array([t for t, _ in chaining]),
                  "chain_at": float8_array([a for _, a in chaining]),
                  "entries": json_rows(entries, 8), "markers": json_rows(markers, 3),
                  "processing": PROCESSING}
        rows = self.commit.run_guarded(params)
        leased = {}
        for r in rows:
            if r[2] is not None:
                head = Head._make(r[2:])
                leased[head.target_chat_id] = head
        return BatchOutcome(int(rows[0][0]), int(rows[0][1]), leased)
