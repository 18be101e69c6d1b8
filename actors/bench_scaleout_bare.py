"""``bare_pg``: the smallest drain with kinbox's worker guarantees on PostgreSQL, in raw psycopg2.

The yardstick for ``kinbox_vs_bare_pg`` in ``kinbox bench scaleout`` (issue
#16), as ``bench_bare`` is for ``bench throughput`` on SQLite: what the same
guarantees cost with no runtime around them. No kinbox code; psycopg2, the
driver kinbox itself uses, sending every statement as text (as kinbox does).
The guarantees, each kept by one statement:

- a claim leases up to 64 rows at once (``FOR UPDATE SKIP LOCKED``, a lease
  owner and a lease time from the server's clock) and only a session's oldest
  open row can be claimed, so a session has one turn at a time across every
  process and its turns run in order; an expired lease makes the row
  claimable again (a dead worker's rows move);
- one transaction per claimed batch commits each turn's transcript entries
  (user, then assistant), its delivery marker and its ack in one
  data-modifying ``WITH``, fenced by the lease: a row this worker no longer
  holds (lease expired or taken over) is not acked and gets no entry and no
  marker, so no message has two committed turns;
- every commit is durable (``synchronous_commit = on``, set on the connection);
- a send inserts its row and notifies in one transaction; an idle worker
  waits on ``LISTEN`` (with a poll as the fallback), like kinbox's workers.

What it leaves out, because the benchmark's brain does not need it: retries
and failed turns, lease renewal for long turns, session records, cron and
everything else a runtime owns.
"""

from __future__ import annotations

import os
import select
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

BATCH = 64
LEASE_SECONDS = 30.0

SCHEMA = (
    "CREATE TABLE bare_inbox (id BIGSERIAL PRIMARY KEY, session TEXT NOT NULL,"
    " body TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending',"
    " lease_owner TEXT, lease_until TIMESTAMPTZ)",
    # The open rows by id (the claim's walk) and by session (the head probe): partial, so
    # done rows leave both indexes and neither grows with the table's history.
    "CREATE INDEX bare_inbox_open ON bare_inbox (id) WHERE status <> 'done'",
    "CREATE INDEX bare_inbox_session_open ON bare_inbox (session, id) WHERE status <> 'done'",
    "CREATE TABLE bare_transcript (id BIGSERIAL PRIMARY KEY, message_id BIGINT NOT NULL,"
    " session TEXT NOT NULL, role TEXT NOT NULL, text TEXT NOT NULL)",
    "CREATE TABLE bare_markers (message_id BIGINT PRIMARY KEY, session TEXT NOT NULL)",
)

SEND = "INSERT INTO bare_inbox (session, body) VALUES (%s, %s); NOTIFY bare_inbox"

CLAIM = (
    "UPDATE bare_inbox SET status = 'leased', lease_owner = %(owner)s,"
    " lease_until = now() + make_interval(secs => %(lease)s)"
    " WHERE id IN (SELECT i.id FROM bare_inbox i"
    "  WHERE i.status <> 'done' AND (i.status = 'pending' OR i.lease_until < now())"
    "  AND NOT EXISTS (SELECT 1 FROM bare_inbox o WHERE o.session = i.session"
    "   AND o.status <> 'done' AND o.id < i.id)"
    "  ORDER BY i.id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
    " RETURNING id, session, body"
)
"""Lease the oldest open row of up to ``limit`` sessions. A head another worker holds is
skipped (locked) or, once its lease committed, fails the re-checked ``status`` test; a
session's later row is no head while an older one is open, so it is never claimed."""

ACK = (
    "WITH turns AS (SELECT * FROM unnest(%(ids)s::bigint[], %(replies)s::text[])"
    "  AS t(id, reply)),"
    " acked AS (UPDATE bare_inbox i SET status = 'done', lease_owner = NULL,"
    "  lease_until = NULL FROM turns t WHERE i.id = t.id AND i.status = 'leased'"
    "  AND i.lease_owner = %(owner)s AND i.lease_until > now()"
    "  RETURNING i.id, i.session, i.body, t.reply),"
    " entries AS (INSERT INTO bare_transcript (message_id, session, role, text)"
    "  SELECT a.id, a.session, r.role, CASE r.k WHEN 1 THEN a.body ELSE a.reply END"
    "  FROM acked a CROSS JOIN (VALUES (1, 'user'), (2, 'assistant')) AS r(k, role)"
    "  ORDER BY a.id, r.k),"
    " markers AS (INSERT INTO bare_markers (message_id, session)"
    "  SELECT id, session FROM acked)"
    " SELECT id FROM acked"
)
"""The turns' transcript entries, markers and acks, fenced: only rows still leased to
``owner`` with an unexpired lease are acked, and only acked rows get entries and markers."""


class Cursor(Protocol):
    def execute(self, sql: str, params: Any = None) -> None: ...
    def fetchall(self) -> list[tuple[Any, ...]]: ...


def install(cur: Cursor) -> None:
    """Create the tables and indexes on a fresh database."""
    for statement in SCHEMA:
        cur.execute(statement)


def claim(cur: Cursor, owner: str, limit: int = BATCH,
          lease: float = LEASE_SECONDS) -> list[tuple[Any, str, str]]:
    """Lease up to ``limit`` session heads to ``owner``; (id, session, body) each."""
    cur.execute(CLAIM, {"owner": owner, "lease": lease, "limit": limit})
    return sorted(cur.fetchall())


def ack(cur: Cursor, owner: str, turns: list[tuple[Any, str | None]]) -> set[Any]:
    """Commit ``(id, reply)`` turns' effects under ``owner``'s leases; the ids acked."""
    cur.execute(ACK, {"owner": owner, "ids": [t[0] for t in turns],
                      "replies": [t[1] for t in turns]})
    return {r[0] for r in cur.fetchall()}


def audit(cur: Cursor) -> dict[str, int]:
    """Lost (rows not done, done without a marker) and duplicate (more than one user
    entry for a message) counts, from the committed rows."""
    cur.execute("SELECT (SELECT COUNT(*) FROM bare_inbox i WHERE i.status <> 'done'"
                " OR NOT EXISTS (SELECT 1 FROM bare_markers m WHERE m.message_id = i.id)),"
                " (SELECT COUNT(*) FROM (SELECT message_id FROM bare_transcript"
                "  WHERE role = 'user' GROUP BY message_id HAVING COUNT(*) > 1) d)")
    lost, duplicate = cur.fetchall()[0]
    return {"lost": int(lost), "duplicate": int(duplicate)}


class Brain(Protocol):
    def handle(self, key: str, body: str) -> None: ...


class Stages:
    """Wall time per stage of the worker loop, summed, and the messages it acked."""

    def __init__(self) -> None:
        self.seconds = {"claim": 0.0, "turns": 0.0, "ack": 0.0, "commit": 0.0}
        self.claims = 0
        self.acked = 0
        self.refused = 0

    def report(self) -> dict[str, Any]:
        per = max(1, self.acked)
        return {"stages_us_per_msg": {k: round(v * 1e6 / per, 1)
                                      for k, v in self.seconds.items()},
                "claims": self.claims, "acked": self.acked, "refused": self.refused}


class Statements(NamedTuple):
    """What the worker loop runs: ``bare_pg``'s own (:data:`NARROW`), or a variant's over
    other rows (:mod:`.bench_scaleout_bare_rows`)."""

    claim: Callable[[Cursor, str], list[tuple[Any, str, str]]]
    ack: Callable[[Cursor, str, list[tuple[Any, str | None]]], set[Any]]
    channel: str
    """What a send notifies and an idle worker listens on."""
    reply: str | None
    """Each turn's reply (an assistant entry), None for none."""


NARROW = Statements(claim, ack, "bare_inbox", reply="ok")


def run_bare_pg(url: str, brain: Brain, stop: threading.Event,
                statements: Statements = NARROW) -> dict[str, Any]:
    """The worker loop: claim a batch (commit), run its turns, ack them (commit); idle on
    ``LISTEN``. Returns the stage times for the child's report."""
    import psycopg2

    owner = f"bare:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(url)
    listen = psycopg2.connect(url)
    listen.autocommit = True
    with conn, conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
    with listen.cursor() as cur:
        cur.execute(f"LISTEN {statements.channel}")
    stages = Stages()
    clock = time.perf_counter
    print("ready", flush=True)
    while not stop.is_set():
        t0 = clock()
        with conn.cursor() as cur:
            rows = statements.claim(cur, owner)
        conn.commit()
        t1 = clock()
        stages.seconds["claim"] += t1 - t0
        stages.claims += 1
        if not rows:
            select.select([listen], [], [], 0.1)
            listen.poll()
            listen.notifies.clear()
            continue
        turns = []
        for mid, _session, body in rows:
            brain.handle(str(mid), body)
            turns.append((mid, statements.reply))
        t2 = clock()
        with conn.cursor() as cur:
            done = statements.ack(cur, owner, turns)
        t3 = clock()
        conn.commit()
        t4 = clock()
        stages.seconds["turns"] += t2 - t1
        stages.seconds["ack"] += t3 - t2
        stages.seconds["commit"] += t4 - t3
        stages.acked += len(done)
        stages.refused += len(turns) - len(done)
    conn.close()
    listen.close()
    return stages.report()
