"""``bare_rows``: the ``bare`` pipeline writing the rows kinbox writes, in raw sqlite3.

``bare`` (:mod:`.bench_bare`) keeps kinbox's guarantees with the narrowest rows
that can carry them: an integer id, a target, a body, an ``acked`` flag and one
index. kinbox's journal stores more for each message, because its other
features read it: the sender, kind, payload, attempts, lease and times of a
row; its transcript entry readable by session; a delivery marker found by
message id; and the indexes its claims, listings and recovery use (the open
rows of a target in order, pending and processing rows by ``seq``, failed
ones, ``seq`` unique). This variant runs the same threads, batches and waits
as ``bare`` and writes exactly those tables, columns and indexes (the DDL
below is what kinbox creates; ``tests/test_bench.py`` compares the two, so it
cannot drift), with kinbox's statement shapes: a send inserts its row already
leased (kinbox's fast path for a session it delivers), a turn inserts its
transcript entries and marker and acknowledges its row fenced by the lease.

So ``bare_rows / bare`` is what storing kinbox's rows costs by itself, and
``kinbox / bare_rows`` what the runtime's code costs: the two parts of
``kinbox_vs_bare``. Still no kinbox code runs here.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from .bench_bare import BarePipeline, _Batch, measure
from .bench_workload import Measured, Recorder, Workload

INBOX = "agent_inbox_messages"
SCHEMA = (
    'CREATE TABLE IF NOT EXISTS "agent_inbox_messages" ("message_id" VARCHAR(256) NOT NULL'
    ' PRIMARY KEY, "seq" INTEGER NOT NULL, "transport" VARCHAR(16) NOT NULL,'
    ' "destination_peer_id" VARCHAR(128), "sender_chat_id" VARCHAR(128), "target_chat_id"'
    ' VARCHAR(128) NOT NULL, "kind" VARCHAR(64) NOT NULL, "content" TEXT NOT NULL, "payload"'
    ' TEXT NOT NULL, "status" VARCHAR(16) NOT NULL, "attempts" INTEGER NOT NULL,'
    ' "max_attempts" INTEGER NOT NULL, "available_at" REAL NOT NULL, "lease_owner"'
    ' VARCHAR(128), "lease_until" REAL, "created_at" REAL NOT NULL, "updated_at" REAL NOT'
    ' NULL, "delivered_at" REAL, "last_error" TEXT, "suspect" INTEGER, "turn_started_at"'
    " REAL)",
    'CREATE UNIQUE INDEX IF NOT EXISTS "agent_inbox_messages_seq" ON "agent_inbox_messages"'
    ' ("seq")',
    "CREATE INDEX IF NOT EXISTS agent_inbox_pending_seq ON agent_inbox_messages (seq)"
    " WHERE status = 'pending'",
    "CREATE INDEX IF NOT EXISTS agent_inbox_processing_seq ON agent_inbox_messages (seq)"
    " WHERE status = 'processing'",
    "CREATE INDEX IF NOT EXISTS agent_inbox_open_target_seq ON agent_inbox_messages"
    " (target_chat_id, seq) WHERE status IN ('pending', 'processing')",
    "CREATE INDEX IF NOT EXISTS agent_inbox_failed_seq ON agent_inbox_messages (seq)"
    " WHERE status = 'failed'",
    'CREATE TABLE IF NOT EXISTS "transcript_entries" ("id" INTEGER NOT NULL PRIMARY KEY,'
    ' "session_id" VARCHAR(128) NOT NULL, "role" VARCHAR(32) NOT NULL, "text" TEXT NOT NULL,'
    ' "visible" INTEGER NOT NULL, "message_id" VARCHAR(256), "created_at" REAL NOT NULL,'
    ' "sender_id" VARCHAR(256), "kind" VARCHAR(64))',
    'CREATE INDEX IF NOT EXISTS "transcript_entries_session_id_id" ON "transcript_entries"'
    ' ("session_id", "id")',
    'CREATE TABLE IF NOT EXISTS "delivery_markers" ("id" INTEGER NOT NULL PRIMARY KEY,'
    ' "session_id" VARCHAR(128) NOT NULL, "message_id" VARCHAR(256) NOT NULL, "created_at"'
    " REAL NOT NULL)",
    'CREATE INDEX IF NOT EXISTS "delivery_markers_message_id" ON "delivery_markers"'
    ' ("message_id")',
)
"""kinbox's tables and indexes on the message path, as it creates them on SQLite."""

INSERT_ROW = (
    f"INSERT INTO {INBOX} (message_id, seq, transport, target_chat_id, kind, content,"
    " payload, attempts, max_attempts, available_at, created_at, updated_at, status,"
    " lease_owner, lease_until) VALUES (?, ?, 'local', ?, 'agent_message', ?, '{}', 0, 5,"
    " ?, ?, ?, 'processing', ?, ?)"
)
INSERT_ENTRY = (
    "INSERT INTO transcript_entries (session_id, role, text, visible, message_id, sender_id,"
    " kind, created_at) VALUES (?, ?, ?, 1, ?, NULL, 'agent_message', ?)"
)
INSERT_MARKER = "INSERT INTO delivery_markers (session_id, message_id, created_at) VALUES (?, ?, ?)"
ACK = (
    f"UPDATE {INBOX} SET status = 'delivered', delivered_at = ?, updated_at = ?,"
    " lease_owner = NULL, lease_until = NULL"
    " WHERE message_id = ? AND status = 'processing' AND lease_owner = ?"
)
LEASE_S = 30.0
OWNER = "bare-rows"


def session_name(target: int) -> str:
    """The session id of target ``target`` (kinbox's bench names them so too)."""
    return f"s{target:06d}"


class BareRowsPipeline(BarePipeline):
    """:class:`.bench_bare.BarePipeline` whose statements write kinbox's rows."""

    schema = SCHEMA

    def __init__(self, path: Path, sessions: int, brain: Callable[[int, str], str | None],
                 **kwargs: int) -> None:
        super().__init__(path, sessions, brain, **kwargs)
        self._names = [session_name(t) for t in range(sessions)]
        self._prefix = f"msg-{os.getpid():08x}"

    def _top(self, conn: sqlite3.Connection) -> int:
        return conn.execute(f"SELECT MAX(seq) FROM {INBOX}").fetchone()[0] or 0

    def _unacked(self, conn: sqlite3.Connection) -> list[tuple[object, int, str]]:
        rows = conn.execute(f"SELECT message_id, target_chat_id, content FROM {INBOX}"
                            " WHERE status IN ('pending', 'processing') ORDER BY seq").fetchall()
        return [(mid, int(target[1:]), body) for mid, target, body in rows]

    def send(self, target: int, body: str) -> object:
        """Queue one kinbox-shaped row for ``target``; its id once it is committed."""
        now = time.time()
        with self._lock:
            batch, seq = self._batch, self._next_id
            self._next_id += 1
            mid = f"{self._prefix}{seq:024x}"
            batch.sends.append((mid, target, body))
            batch.rows.append((mid, seq, self._names[target], body, now, now, now, OWNER,
                               now + LEASE_S))
            self._work.notify()
        batch.committed.wait()
        return mid

    def _commit_turn(self, target: int, mid: object, body: str, reply: str | None) -> None:
        now, name = time.time(), self._names[target]
        with self._lock:
            batch = self._batch
            batch.entries.append((name, "user", body, mid, now))
            if reply:
                batch.entries.append((name, "assistant", reply, mid, now))
            batch.markers.append((name, mid, now))
            batch.acks.append((now, now, mid, OWNER))
            self._work.notify()
        batch.committed.wait()

    def _write(self, conn: sqlite3.Connection, batch: _Batch) -> None:
        if batch.rows:
            conn.executemany(INSERT_ROW, batch.rows)
        if batch.markers:
            conn.executemany(INSERT_ENTRY, batch.entries)
            conn.executemany(INSERT_MARKER, batch.markers)
            conn.executemany(ACK, batch.acks)


def run_bare_rows(w: Workload, workdir: Path) -> Measured:
    """``bare_rows`` on the benchmark workload, a trivial brain that, as kinbox's in
    :func:`.bench_systems.run_kinbox`, records its turn and replies nothing."""
    rec = Recorder(w.messages)

    def brain(target: int, body: str) -> None:
        rec.handled(body)

    return measure("bare_rows", BareRowsPipeline(workdir / "bare-rows.db", w.sessions, brain),
                   w, rec)
