"""``bare_pg_rows``: ``bare_pg`` writing the rows kinbox writes, in raw psycopg2.

``bare_pg`` (:mod:`.bench_scaleout_bare`) keeps kinbox's worker guarantees
with the narrowest rows that carry them. kinbox's journal stores more for
each message, because its other features read it (see
:mod:`.bench_bare_rows`, the same split on SQLite): a text message id as the
primary key and a unique ``seq`` beside it, sender, kind, payload, attempts,
lease and times as columns; partial indexes over pending, processing, open
(by target) and failed rows; a transcript readable by session; delivery
markers found by message id. On PostgreSQL a status change is no HOT update
(``status`` is in those indexes' predicates), so each of a message's three
row versions (sent, leased, done) adds an entry to every index whose
predicate it matches. This variant runs ``bare_pg``'s worker loop and
statement shapes (one claim that leases a batch of heads, one fenced ``WITH``
that acks and writes each turn's entry and marker) over exactly kinbox's
tables, columns, sequence and indexes (``tests/test_bench_scaleout_bare.py``
compares them with what kinbox creates), so ``bare_pg_rows / bare_pg`` is what
storing kinbox's rows costs, and ``kinbox / bare_pg_rows`` what kinbox's code
and its fuller claim rules cost. No kinbox code runs here.
"""

from __future__ import annotations

from typing import Any

from .bench_scaleout_bare import BATCH, LEASE_SECONDS, Cursor, Statements

CHANNEL = "bare_pg_rows"

SCHEMA = (
    "CREATE TABLE agent_inbox_messages (message_id character varying(256) NOT NULL"
    " PRIMARY KEY, seq bigint NOT NULL, transport character varying(16) NOT NULL,"
    " destination_peer_id character varying(128), sender_chat_id character varying(128),"
    " target_chat_id character varying(128) NOT NULL, kind character varying(64) NOT NULL,"
    " content text NOT NULL, payload text NOT NULL, status character varying(16) NOT NULL,"
    " attempts integer NOT NULL, max_attempts integer NOT NULL, available_at double"
    " precision NOT NULL, lease_owner character varying(128), lease_until double precision,"
    " created_at double precision NOT NULL, updated_at double precision NOT NULL,"
    " delivered_at double precision, last_error text, suspect boolean, turn_started_at"
    " double precision)",
    "CREATE SEQUENCE agent_inbox_seq",
    "CREATE UNIQUE INDEX agent_inbox_messages_seq ON agent_inbox_messages (seq)",
    "CREATE INDEX agent_inbox_pending_seq ON agent_inbox_messages (seq)"
    " WHERE status = 'pending'",
    "CREATE INDEX agent_inbox_processing_seq ON agent_inbox_messages (seq)"
    " WHERE status = 'processing'",
    "CREATE INDEX agent_inbox_open_target_seq ON agent_inbox_messages (target_chat_id, seq)"
    " WHERE status IN ('pending', 'processing')",
    "CREATE INDEX agent_inbox_failed_seq ON agent_inbox_messages (seq) WHERE status = 'failed'",
    "CREATE TABLE transcript_entries (id bigserial PRIMARY KEY, session_id character"
    " varying(128) NOT NULL, role character varying(32) NOT NULL, text text NOT NULL,"
    " visible boolean NOT NULL, message_id character varying(256), created_at double"
    " precision NOT NULL, sender_id character varying(256), kind character varying(64))",
    "CREATE INDEX transcript_entries_session_id_id ON transcript_entries (session_id, id)",
    "CREATE TABLE delivery_markers (id bigserial PRIMARY KEY, session_id character"
    " varying(128) NOT NULL, message_id character varying(256) NOT NULL, created_at double"
    " precision NOT NULL)",
    "CREATE INDEX delivery_markers_message_id ON delivery_markers (message_id)",
)
"""kinbox's tables, sequence and indexes on the message path, as it creates them."""

_NOW = "extract(epoch FROM clock_timestamp())"

INSERT = (
    "INSERT INTO agent_inbox_messages (message_id, seq, transport, target_chat_id, kind,"
    " content, payload, attempts, max_attempts, available_at, created_at, updated_at, status)"
    " SELECT 'msg-' || lpad(to_hex(s.seq), 32, '0'), s.seq, 'local', s.target, 'agent_message',"
    f" s.body, '{{}}', 0, 5, {_NOW}, {_NOW}, {_NOW}, 'pending'"
    " FROM (SELECT nextval('agent_inbox_seq') AS seq, r.target, r.body"
    "  FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS r(target, body, k)"
    "  ORDER BY r.k) s"
)
"""New rows, pending, their ``seq`` from kinbox's sequence and their id time-ordered, as
kinbox's are (``actors/ids.py``)."""

SEND = f"{INSERT}; NOTIFY {CHANNEL}"

CLAIM = (
    "UPDATE agent_inbox_messages SET status = 'processing', lease_owner = %(owner)s,"
    f" lease_until = {_NOW} + %(lease)s, updated_at = {_NOW}"
    " WHERE message_id IN (SELECT i.message_id FROM agent_inbox_messages i"
    "  WHERE i.status IN ('pending', 'processing')"
    f"  AND (i.status = 'pending' OR i.lease_until < {_NOW})"
    "  AND NOT EXISTS (SELECT 1 FROM agent_inbox_messages o"
    "   WHERE o.target_chat_id = i.target_chat_id"
    "   AND o.status IN ('pending', 'processing') AND o.seq < i.seq)"
    "  ORDER BY i.seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
    " RETURNING message_id, target_chat_id, content, seq"
)
"""``bare_pg``'s claim over kinbox's rows: the oldest open row of up to ``limit`` targets."""

ACK = (
    "WITH turns AS (SELECT * FROM unnest(%(ids)s::text[], %(replies)s::text[])"
    "  AS t(id, reply)),"
    " acked AS (UPDATE agent_inbox_messages i SET status = 'delivered',"
    f"  delivered_at = {_NOW}, updated_at = {_NOW}, lease_owner = NULL, lease_until = NULL"
    "  FROM turns t WHERE i.message_id = t.id AND i.status = 'processing'"
    f"  AND i.lease_owner = %(owner)s AND i.lease_until > {_NOW}"
    "  RETURNING i.message_id, i.target_chat_id, i.content, i.seq, t.reply),"
    " entries AS (INSERT INTO transcript_entries (session_id, role, text, visible, message_id,"
    "  kind, created_at)"
    "  SELECT a.target_chat_id, r.role, CASE r.k WHEN 1 THEN a.content ELSE a.reply END, true,"
    f"  a.message_id, 'agent_message', {_NOW}"
    "  FROM acked a CROSS JOIN (VALUES (1, 'user'), (2, 'assistant')) AS r(k, role)"
    "  WHERE r.k = 1 OR a.reply IS NOT NULL ORDER BY a.seq, r.k),"
    " markers AS (INSERT INTO delivery_markers (session_id, message_id, created_at)"
    f"  SELECT target_chat_id, message_id, {_NOW} FROM acked)"
    " SELECT message_id FROM acked"
)
"""The turns' entries (the user's; the assistant's when it replied), markers and acks,
fenced by the lease, in one statement: as ``bare_pg``'s, in kinbox's columns."""

REMAINING = "SELECT COUNT(*) FROM agent_inbox_messages WHERE status IN ('pending', 'processing')"


def install(cur: Cursor) -> None:
    """Create kinbox's tables, sequence and indexes on a fresh database."""
    for statement in SCHEMA:
        cur.execute(statement)


def claim(cur: Cursor, owner: str, limit: int = BATCH,
          lease: float = LEASE_SECONDS) -> list[tuple[Any, str, str]]:
    """Lease up to ``limit`` session heads to ``owner``; (id, session, body) each, in
    ``seq`` order."""
    cur.execute(CLAIM, {"owner": owner, "lease": lease, "limit": limit})
    return [(mid, target, body) for mid, target, body, _seq in
            sorted(cur.fetchall(), key=lambda row: row[3])]


def ack(cur: Cursor, owner: str, turns: list[tuple[Any, str | None]]) -> set[Any]:
    """Commit ``(id, reply)`` turns' effects under ``owner``'s leases; the ids acked."""
    cur.execute(ACK, {"owner": owner, "ids": [t[0] for t in turns],
                      "replies": [t[1] for t in turns]})
    return {r[0] for r in cur.fetchall()}


def audit(cur: Cursor) -> dict[str, int]:
    """Lost (rows not delivered, delivered without a marker) and duplicate (more than one
    user entry for a message) counts, from the committed rows."""
    cur.execute("SELECT (SELECT COUNT(*) FROM agent_inbox_messages i"
                " WHERE i.status <> 'delivered' OR NOT EXISTS (SELECT 1 FROM delivery_markers m"
                "  WHERE m.message_id = i.message_id)),"
                " (SELECT COUNT(*) FROM (SELECT message_id FROM transcript_entries"
                "  WHERE role = 'user' GROUP BY message_id HAVING COUNT(*) > 1) d)")
    lost, duplicate = cur.fetchall()[0]
    return {"lost": int(lost), "duplicate": int(duplicate)}


STATEMENTS = Statements(claim, ack, CHANNEL, reply=None)
"""The worker loop's statements (:func:`.bench_scaleout_bare.run_bare_pg`); no reply, as
kinbox's bench brain: one transcript entry a turn, as kinbox writes for it."""
