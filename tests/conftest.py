"""Shared fixtures: real SQLite files, a real PostgreSQL when configured, runtimes."""

from __future__ import annotations

import compileall
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from hypothesis import settings as hypothesis_settings

from kinbox.actors import ManualClock, Runtime
from kinbox.persistence import (
    GroupCommitWriter,
    Journal,
    SessionStore,
    Tables,
    bind_tables,
    open_database,
    upgrade,
)
from kinbox.persistence.models import MODELS

# Property tests keep no example database (a .hypothesis folder in the checkout shows in
# git status, and the packaging test would walk it while another worker writes it) and
# have no per-example deadline (a loaded CI machine is not a failing property).
hypothesis_settings.register_profile("kinbox", database=None, deadline=None)
hypothesis_settings.load_profile("kinbox")

SERVER_PG_URL = os.environ.get("KINBOX_TEST_PG_URL")


def _worker_database(url: str | None) -> str | None:
    """The PostgreSQL database of this pytest-xdist worker, ``<name>_<worker>`` on the same
    server, so two workers never drop each other's tables (``url`` itself outside xdist;
    None without a URL). Made by :func:`reset_postgres` when missing."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not url or not worker:
        return url
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{parts.path.lstrip('/') or 'postgres'}_{worker}"))


PG_URL = _worker_database(SERVER_PG_URL)
_made: set[str] = set()
"""Worker databases this process made sure exist."""
KINBOX_TABLES = tuple(model._meta.table_name for model in reversed(MODELS))
"""Every table kinbox makes, from its models (a new one is dropped too)."""


@pytest.fixture
def runtimes() -> Iterator[list[Runtime]]:
    """Runtimes a test started (it appends them), stopped at its end, the last first."""
    made: list[Runtime] = []
    yield made
    for rt in reversed(made):
        rt.stop()


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """A fresh SQLite file URL."""
    return f"sqlite:///{tmp_path / 'kinbox.db'}"


def reset_postgres(url: str) -> None:
    """Drop every kinbox table so a test starts from an empty database (created first, once
    per process, when it is this worker's and does not exist yet)."""
    if url == PG_URL and url != SERVER_PG_URL and url not in _made:
        _create_database(url)
        _made.add(url)
    db = open_database(url)
    for table in KINBOX_TABLES:
        db.execute_sql(f"DROP TABLE IF EXISTS {table} CASCADE")
    db.execute_sql("DROP SEQUENCE IF EXISTS agent_inbox_seq")
    db.close()


def _create_database(url: str) -> None:
    """Create ``url``'s database on the server ``KINBOX_TEST_PG_URL`` names, when missing."""
    import psycopg2

    assert SERVER_PG_URL is not None
    name = urlsplit(url).path.lstrip("/")
    conn = psycopg2.connect(SERVER_PG_URL)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            try:
                cur.execute(f'CREATE DATABASE "{name}"')
            except psycopg2.errors.DuplicateDatabase:
                pass  # an earlier run, or another one on this server, made it
    finally:
        conn.close()


@pytest.fixture
def pg_url() -> str:
    """A fresh PostgreSQL database (skips without KINBOX_TEST_PG_URL; fails in CI)."""
    return _fresh_postgres()


@pytest.fixture(params=["sqlite", "postgres"])
def any_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of each backend (PostgreSQL skips without KINBOX_TEST_PG_URL)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'kinbox.db'}"
    return _fresh_postgres()


def _fresh_postgres() -> str:
    if not PG_URL:
        if os.environ.get("CI"):
            pytest.fail("CI must run the PostgreSQL tests: .ci/run sets KINBOX_TEST_PG_URL")
        pytest.skip("PostgreSQL tests need KINBOX_TEST_PG_URL (set by .ci/run)")
    reset_postgres(PG_URL)
    return PG_URL


class Stores:
    """A journal and session store on one database, for tests below the runtime."""

    def __init__(self, url: str) -> None:
        self.db = open_database(url)
        self.tables: Tables = bind_tables(self.db)
        upgrade(self.tables)
        self.writer = GroupCommitWriter(self.db)
        self.writer.start()
        self.journal = Journal(self.tables, self.writer)
        self.store = SessionStore(self.tables, self.writer)

    def close(self) -> None:
        self.writer.stop()
        self.db.close()


@pytest.fixture
def stores(any_db_url: str) -> Iterator[Stores]:
    """Journal + store on each backend."""
    s = Stores(any_db_url)
    yield s
    s.close()


@pytest.fixture
def clock() -> ManualClock:
    """A clock that moves only when a test says so."""
    return ManualClock()


@pytest.fixture
def make_runtime(db_url: str, clock: ManualClock) -> Iterator[Callable[..., Runtime]]:
    """Start runtimes on the test's database and clock; all are stopped at the end."""
    started: list[Runtime] = []

    def make(**options: object) -> Runtime:
        options.setdefault("db", db_url)
        options.setdefault("clock", clock)
        rt = Runtime(**options)  # type: ignore[arg-type]
        rt.start()
        started.append(rt)
        return rt

    yield make
    for rt in started:
        rt.stop()  # a no-op unless it is running


@pytest.fixture
def pg_runtimes(pg_url: str) -> Iterator[Callable[..., Runtime]]:
    """Start runtimes on the test's PostgreSQL; all are stopped at the end."""
    made: list[Runtime] = []

    def make(**options: Any) -> Runtime:
        rt = Runtime(db=pg_url, **options).start()
        made.append(rt)
        return rt

    yield make
    for rt in reversed(made):
        rt.stop()


_TEST_HOME = tempfile.mkdtemp(prefix="kinbox-test-home-")


SOURCE_FOLDERS = ("actors", "persistence", "transport", "scenarios")
"""The checkout's folders of Python that test processes and their children import."""


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Any]:
    """A receiving device (:class:`.peer_harness.Receiver`) in a process of its own, for
    the peer tests; stopped after the test."""
    from .peer_harness import Receiver

    r = Receiver(tmp_path / "b").start()
    yield r
    r.stop()


def pytest_configure(config: pytest.Config) -> None:
    """Each test process (and every child it starts) keeps kinbox's files (device keys,
    heartbeat files of server databases) in a folder of its own, removed at the end, never
    in the user's data directory; and a ``KINBOX_DB`` of the user's is never the default
    database of a test.

    The first process (before any worker) also compiles the checkout's modules once
    (``__pycache__``, git-ignored). An editable install has no bytecode, and where
    ``PYTHONDONTWRITEBYTECODE`` is set (CI machines, containers) no process writes any:
    each of the suite's hundreds of processes (the workers, every CLI call, server and
    crash child) compiled all of kinbox again, about half a CPU-second each."""
    os.environ["KINBOX_HOME"] = _TEST_HOME
    os.environ.pop("KINBOX_DB", None)
    if not hasattr(config, "workerinput"):
        root = Path(__file__).resolve().parent.parent
        for folder in SOURCE_FOLDERS:
            compileall.compile_dir(root / folder, quiet=1)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_TEST_HOME, ignore_errors=True)


def pytest_report_header() -> str:
    """Say up front whether the PostgreSQL half of the contract tests runs."""
    return ("postgresql: " + ("KINBOX_TEST_PG_URL set, contract tests run on it" if PG_URL
                              else "KINBOX_TEST_PG_URL unset, PostgreSQL tests skip"))


def ids_read(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[str]:
    """From now on, the id of every row ``module.name`` (a store's row-to-record function)
    turns into a record, in order: how many rows a listing or a look read."""
    read: list[str] = []
    real = getattr(module, name)

    def counting(row: Any) -> Any:
        read.append(row.id)
        return real(row)
    monkeypatch.setattr(module, name, counting)
    return read
