"""Test helpers: wait on a condition with a timeout instead of sleeping; make a write slow."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from kinbox.persistence import DatabaseFailed, GroupCommitWriter


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Return once ``condition()`` is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        pause.wait(0.005)  # re-check soon; the timeout above bounds the wait


def of_kind(kind: str, brain: Callable[[Any], object]) -> Callable[[Any], object]:
    """``brain`` itself (``kind`` "sync"), or an ``async def`` brain that calls it ("async"):
    one behaviour run by both kinds of brain."""
    if kind == "sync":
        return brain

    async def async_brain(turn: Any) -> object:
        return brain(turn)

    return async_brain


def end_backends(pg_url: str, pids: Iterable[int]) -> None:
    """End these server processes (``pg_terminate_backend``), as a server restart or a cut
    network ends a connection under its client."""
    import psycopg2

    admin = psycopg2.connect(pg_url)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            for pid in pids:
                cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
    finally:
        admin.close()


def end_database_sessions(pg_url: str) -> int:
    """End every other session on ``pg_url``'s database, as a server restart or a failover
    does to its clients (``pg_terminate_backend``); how many."""
    import psycopg2

    admin = psycopg2.connect(pg_url)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()")
            return len(cur.fetchall())
    finally:
        admin.close()


@contextmanager
def database_down(pg_url: str) -> Iterator[None]:
    """While in the block, ``pg_url``'s database takes no connections and every session it
    had is ended: a server down (restarting, failing over) as its clients see it, without
    stopping a server other tests share. Connections are taken again after the block."""
    import psycopg2

    parts = urlsplit(pg_url)
    name = parts.path.lstrip("/")
    admin = psycopg2.connect(urlunsplit(parts._replace(path="/postgres")))
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            with admin.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = %s", (name,))
            yield
        finally:
            with admin.cursor() as cur:
                cur.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    finally:
        admin.close()


def failing_once(real: Callable[..., Any], error: Exception,
                 failures: list[str], name: str) -> Callable[..., Any]:
    """``real``, but its first call raises ``error`` (and appends ``name`` to
    ``failures``, for the test to wait on and check)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if not failures:
            failures.append(name)
            raise error
        return real(*args, **kwargs)

    return call


def quiet_brain(turn: object) -> None:
    """A brain that reads its messages and says nothing (a runtime without one is send-only)."""


def skip_slow_unless_asked(request: pytest.FixtureRequest) -> None:
    """Skip a ``slow``-marked test unless the run asked for it (``-m slow``): the plain
    ``pytest`` of CI runs every other test, and these would push it past its budget."""
    asked = "slow" in (request.config.getoption("markexpr") or "")
    if request.node.get_closest_marker("slow") is not None and not asked:
        pytest.skip("a slow variant: runs with -m slow")


def pg_seq_scans(db: Any, sql: str, params: Any, table: str) -> list[str]:
    """PostgreSQL: the plan's sequential scans of ``table`` (EXPLAIN only, never executed)."""
    plan = db.execute_sql("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()[0][0]["Plan"]

    def nodes(n: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield n
        for child in n.get("Plans", []):
            yield from nodes(child)
    return [n["Node Type"] for n in nodes(plan)
            if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == table]


class FaultyCursor:
    """A database cursor whose statements first pass ``check(sql)``, which may raise (what
    a busy database raises, say): install with ``db.cursor = lambda *a, **k:
    FaultyCursor(real_cursor(*a, **k), check)``."""

    def __init__(self, cursor: Any, check: Callable[[str], None]) -> None:
        self._cursor = cursor
        self._check = check

    def execute(self, sql: str, params: Any = ()) -> Any:
        self._check(sql)
        return self._cursor.execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> Any:
        self._check(sql)
        return self._cursor.executemany(sql, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)


def lock_waits(pg_url: str) -> int:
    """How many lock requests wait on ``pg_url``'s server now (a statement blocked by
    another transaction's lock shows here)."""
    import psycopg2

    probe = psycopg2.connect(pg_url)
    try:
        with probe.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            return int(cur.fetchone()[0])
    finally:
        probe.close()


def db_upgrade_process(pg_url: str) -> subprocess.Popen[str]:
    """``kinbox db upgrade --json`` on ``pg_url`` in a process of its own, started (its
    output piped): to race it against a held schema lock or another upgrade."""
    return subprocess.Popen(
        [sys.executable, "-m", "kinbox.actors", "db", "upgrade", "--json", "--db", pg_url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parent.parent)


class AdvisoryWaiters:
    """Counts, when called, the sessions of ``pg_url``'s database that wait for an
    advisory lock now (an upgrade waiting for the schema lock shows here), on one
    connection of its own: a test polls it every few milliseconds. ``close`` it."""

    def __init__(self, pg_url: str) -> None:
        import psycopg2

        self.probe = psycopg2.connect(pg_url)
        self.probe.autocommit = True

    def __call__(self) -> int:
        with self.probe.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND wait_event_type = 'Lock' "
                        "AND wait_event = 'advisory'")
            return int(cur.fetchone()[0])

    def close(self) -> None:
        self.probe.close()


def life_locks(pg_url: str) -> int:
    """How many runtimes hold their life lock on ``pg_url``'s database now (a killed
    runtime's goes when its server process notices the connection closed, not at once)."""
    import psycopg2

    from kinbox.persistence.liveness import LOCK_CLASS

    probe = psycopg2.connect(pg_url)
    try:
        with probe.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid ="
                        " l.database WHERE l.locktype = 'advisory' AND l.granted AND"
                        " l.classid = %s AND l.objsubid = 2 AND d.datname ="
                        " current_database()", (LOCK_CLASS,))
            return int(cur.fetchone()[0])
    finally:
        probe.close()


SHORT = 0.3
"""A write timeout short enough for a test to outrun (the slow-write tests), in seconds."""


class SlowWriteHeard(logging.Handler):
    """Sets ``event`` on the first warning (or worse) of the session actors."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.event.set()


def heard_from(thread: str, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once the thread named ``thread`` logs a warning on the writer's log (a write it
    waits for outran its wait, and it waits on for the outcome); for the test."""
    heard = threading.Event()

    class Heard(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.threadName == thread and record.levelno >= logging.WARNING:
                heard.set()

    logger = logging.getLogger("kinbox.writer")
    monkeypatch.setattr(logger, "handlers", [*logger.handlers, Heard()])
    return heard


def heard_slow_write(monkeypatch: pytest.MonkeyPatch) -> SlowWriteHeard:
    """A :class:`SlowWriteHeard` on the writer's log for the test (gone after it)."""
    heard = SlowWriteHeard()
    logger = logging.getLogger("kinbox.writer")
    monkeypatch.setattr(logger, "handlers", [*logger.handlers, heard])
    return heard


def hold_next_batch(writer: GroupCommitWriter, until: threading.Event) -> None:
    """Once the write queued now (the turn's commit) is taken into a batch, make that batch
    wait for ``until`` after it (a plain write behind it in the same batch)."""
    gate, holding = threading.Event(), threading.Event()
    writer.submit(lambda: (holding.set(), gate.wait(10)))  # the writer is busy ...
    assert holding.wait(10)

    def then() -> None:
        wait_for(lambda: writer.queued() >= 1, what="the turn's commit to queue")
        writer.submit(lambda: until.wait(10))  # ... so these two form the next batch
        gate.set()
    threading.Thread(target=then, daemon=True).start()


def counting(real: Callable[..., Any], calls: list[int],
             outage: threading.Event | None = None) -> Callable[..., Any]:
    """``real``, noting each call in ``calls``; while ``outage`` is set each call fails as
    a dropped database connection does (a blip the caller must ride out)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if outage is not None and outage.is_set():
            raise DatabaseFailed("server closed the connection unexpectedly")
        return real(*args, **kwargs)
    return call


class Holding:
    """A brain whose first turn holds until ``release`` is set (``holding`` says it does);
    every turn replies ``reply``."""

    def __init__(self, reply: str = "done") -> None:
        self.reply = reply
        self.holding = threading.Event()
        self.release = threading.Event()
        self.turns = 0

    def __call__(self, turn: object) -> str:
        self.turns += 1
        if self.turns == 1:
            self.holding.set()
            self.release.wait(30)
        return self.reply
