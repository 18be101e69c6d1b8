"""Fencing under a real pause: worker A is SIGSTOPped past its lease mid-turn, B claims
and completes the message, A resumes: one committed turn, A's late commit writes nothing,
and A logs that its lease was lost.

PostgreSQL: A and B are two runtime processes on one database (the deployment that
shares a database). SQLite: a delivering runtime holds the file's exclusive lock, so two
runtimes with a brain cannot meet on one file (the second gets ``DatabaseInUse``); the
processes that do meet there are a runtime and a second process using the journal API
directly, which is B here. A is a real runtime in both, so the warning checked is the
runtime's own.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kinbox.actors.crash_run import prepare, stores

from .helpers import wait_for

CHILD = str(Path(__file__).with_name("fencing_child.py"))
LEASE = 1.0
"""A's lease: short, so B may take the row over about a second after A stops."""


def start(role: str, url: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, CHILD, role, url, str(LEASE)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr and proc.stderr.read()
    return proc


def sqlite_writer_free(url: str) -> bool:
    """True when no process holds SQLite's write lock (A was not stopped inside a write)."""
    con = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0.5, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()


def postgres_writer_free(url: str) -> bool:
    """True when no other backend of the test's database is inside a transaction (A was not
    stopped holding row locks, which B's ``SKIP LOCKED`` claim would skip for good)."""
    import psycopg2

    con = psycopg2.connect(url)
    try:
        with con.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND pid <> pg_backend_pid() "
                        "AND xact_start IS NOT NULL")
            return cur.fetchone()[0] == 0
    finally:
        con.close()


def writer_free(url: str) -> bool:
    """A holds no write lock or transaction that would keep B from the row."""
    return sqlite_writer_free(url) if url.startswith("sqlite") else postgres_writer_free(url)


def pause_and_take_over(url: str, b_role: str) -> None:
    prepare(url, sessions=1, messages=1)
    a = start("paused", url)
    lines: list[str] = []

    def read_log() -> None:
        assert a.stderr is not None
        lines.extend(iter(a.stderr.readline, ""))
    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    try:
        assert a.stdout is not None
        assert a.stdout.readline().strip() == "turn started m00000"
        os.kill(a.pid, signal.SIGSTOP)  # A's renewals stop with it: its lease runs out
        if not writer_free(url):
            os.kill(a.pid, signal.SIGCONT)  # stopped inside a renewal or claim: once more
            wait_for(lambda: writer_free(url), 10, "A's transaction to end")
            os.kill(a.pid, signal.SIGSTOP)
        b = start(b_role, url)
        out, err = b.communicate(timeout=60)
        assert b.returncode == 0 and out.strip() == "delivered", err[-2000:]
        os.kill(a.pid, signal.SIGCONT)
        assert a.stdin is not None
        a.stdin.write("go\n")
        a.stdin.flush()
        wait_for(lambda: any("lost the lease of m00000" in x for x in lines), 30,
                 "A's stale-lease warning")
        a.stdin.write("stop\n")
        a.stdin.flush()
        assert a.wait(30) == 0
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
            a.wait()
    reader.join(10)
    assert any("WARNING kinbox.session" in x and "wrote nothing" in x for x in lines), lines
    with stores(url) as (journal, store):
        assert store.marker_counts() == {"m00000": 1}
        assert journal.get("m00000")["status"] == "delivered"
        texts = [e.text for e in store.transcript("s00")]
    assert "reply from B" in texts and "late reply from A" not in texts


@pytest.mark.timeout(90)
def test_a_paused_runtime_on_sqlite_meets_a_journal_process_and_writes_nothing_late(
        tmp_path: Path) -> None:
    pause_and_take_over(f"sqlite:///{tmp_path / 'fence.db'}", "journal")


@pytest.mark.postgres
@pytest.mark.timeout(90)
def test_a_paused_runtime_on_postgres_loses_its_turn_to_another_runtime(pg_url: str) -> None:
    pause_and_take_over(pg_url, "runtime")
