"""A worker process for the scale-out tests: delivers with a brain that records each turn.

Usage: python scale_child.py DB_URL
Each turn writes its start and its end, with the server's clock, to the
``scale_turns`` table (created by the test), on a connection of its own
that commits at once: a SIGKILL mid-turn leaves the start without an end.
Prints "ready" once delivering, then runs until SIGTERM (a graceful stop).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import uuid
from typing import Any

import psycopg2

from kinbox.actors import Runtime, Turn

TABLE_SQL = ("CREATE TABLE IF NOT EXISTS scale_turns (turn_id TEXT, session_id TEXT, "
             "message_id TEXT, pid INTEGER, phase TEXT, at DOUBLE PRECISION)")
RECORD_SQL = ("INSERT INTO scale_turns VALUES (%s, %s, %s, %s, %s, "
              "EXTRACT(EPOCH FROM clock_timestamp()))")
WORK_SECONDS = 0.002


class Recorder:
    """A brain that records each turn's start and end on the server's clock."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.local = threading.local()
        self.pid = os.getpid()
        self.work = threading.Event()  # never set: waiting on it stands in for the brain's work

    def _cursor(self) -> Any:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = psycopg2.connect(self.url)
            conn.autocommit = True
            with conn.cursor() as cur:  # the server keeps it if this process dies
                cur.execute("SET synchronous_commit = off")
        return conn.cursor()

    def __call__(self, turn: Turn) -> None:
        turn_id = uuid.uuid4().hex
        mid = turn.messages[0].message_id
        with self._cursor() as cur:
            cur.execute(RECORD_SQL, (turn_id, turn.session_id, mid, self.pid, "start"))
            self.work.wait(WORK_SECONDS)  # a turn that takes a moment, so overlaps would show
            cur.execute(RECORD_SQL, (turn_id, turn.session_id, mid, self.pid, "end"))


def main() -> None:
    url = sys.argv[1]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Runtime(db=url, brain=Recorder(url), max_active_sessions=8):
        print("ready", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
