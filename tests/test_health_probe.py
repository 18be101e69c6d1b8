"""The database read of ``health()`` (and ``/healthz``) keeps its thread and connection
between probes, on each backend."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import Runtime
from kinbox.actors.health import HealthChecks

pytestmark = pytest.mark.timeout(60)


def count_connects(rt: Runtime) -> list[tuple[str, Any]]:
    """The connections opened to ``rt``'s database from now on, with their thread's name."""
    db = rt.context.store.t.db
    opened: list[tuple[str, Any]] = []
    connect: Callable[[], Any] = db._connect

    def counted() -> Any:
        conn = connect()
        opened.append((threading.current_thread().name, conn))
        return conn
    db._connect = counted  # this instance only: the test's seam
    return opened


def by_probes(opened: list[tuple[str, Any]]) -> list[Any]:
    return [conn for name, conn in opened if name == "kinbox-health"]


def is_closed(conn: Any) -> bool:
    """Is the driver's connection closed (sqlite3 or psycopg2)?"""
    if isinstance(conn, sqlite3.Connection):
        try:
            conn.total_changes  # noqa: B018 (a closed connection raises on any use)
        except sqlite3.ProgrammingError:
            return True
        return False
    return bool(conn.closed)


def test_probes_reuse_one_connection_instead_of_opening_one_each(
        any_db_url: str, tmp_path: Path) -> None:
    """A load balancer asking /healthz every second made the read open a connection each
    time (on PostgreSQL a server process forked and authenticated per probe) on a new
    thread: the read thread now stays with its connection for the next probe."""
    rt = Runtime(db=any_db_url, data_dir=str(tmp_path), brain=lambda turn: None).start()
    try:
        opened = count_connects(rt)
        for _ in range(5):
            assert rt.health(timeout=10.0)["checks"]["database"] == {"ok": True}
        assert len(by_probes(opened)) == 1, opened
        assert len(probe_threads()) == 1
    finally:
        rt.stop()


def probe_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "kinbox-health"}


def test_a_stop_ends_the_read_thread_and_closes_its_connection(
        any_db_url: str, tmp_path: Path) -> None:
    """The thread and its connection go with the runtime, not a minute later."""
    before = probe_threads()
    rt = Runtime(db=any_db_url, data_dir=str(tmp_path), brain=lambda turn: None).start()
    opened = count_connects(rt)
    assert rt.health(timeout=10.0)["healthy"]
    (reader,) = probe_threads() - before
    rt.stop()
    reader.join(10)
    assert not reader.is_alive(), "the read thread outlived its runtime"
    assert [is_closed(conn) for conn in by_probes(opened)] == [True]


def test_the_read_thread_ends_with_its_connection_once_no_probe_comes(
        any_db_url: str, tmp_path: Path) -> None:
    rt = Runtime(db=any_db_url, data_dir=str(tmp_path), brain=lambda turn: None).start()
    checks = HealthChecks(idle=0.2)
    before = probe_threads()
    try:
        opened = count_connects(rt)
        ctx = rt.context

        def probe() -> dict[str, Any]:
            return checks.report("running", ctx, None, True, timeout=10.0)["checks"]["database"]
        assert probe() == {"ok": True}
        (reader,) = probe_threads() - before
        reader.join(10)
        assert not reader.is_alive(), "the idle read thread did not end"
        assert [is_closed(conn) for conn in by_probes(opened)] == [True]
        assert probe() == {"ok": True}  # a new thread, a new connection
        assert [is_closed(conn) for conn in by_probes(opened)] == [True, False]
    finally:
        rt.stop()


def test_a_probe_after_the_stop_keeps_no_thread_nor_connection(
        any_db_url: str, tmp_path: Path) -> None:
    """A runtime starts once: a probe after its stop (a load balancer's, as it shuts down)
    has no next probe to keep its connection for. Its read thread stayed a minute with a
    connection to the stopped runtime's database (a PostgreSQL backend that kept a
    ``DROP DATABASE`` waiting)."""
    before = probe_threads()
    rt = Runtime(db=any_db_url, data_dir=str(tmp_path), brain=lambda turn: None).start()
    opened = count_connects(rt)
    assert rt.health(timeout=10.0)["healthy"]
    rt.stop()
    for reader in probe_threads() - before:
        reader.join(10)
    after = probe_threads() - before
    rt.health(timeout=10.0)  # answered or not: what matters is what stays
    for reader in probe_threads() - before - after:
        reader.join(10)
        assert not reader.is_alive(), "the read thread outlived its stopped runtime"
    assert all(is_closed(conn) for conn in by_probes(opened)), by_probes(opened)
