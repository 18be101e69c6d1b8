"""The schema's version number: what a kinbox does with a database another version made.

A database records the schema version the last upgrade left it at. This code upgrades
an older one (the version raised in the upgrade's own transaction) and refuses one a
newer kinbox upgraded, touching nothing; two processes upgrading one PostgreSQL database
at once migrate it once.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import peewee as pw
import pytest

from kinbox.actors import ManualClock, Runtime
from kinbox.persistence import (
    KinboxError,
    SchemaError,
    SchemaTooNew,
    bind_tables,
    open_database,
    pending_changes,
    require_current,
    upgrade,
)
from kinbox.persistence.database import is_sqlite
from kinbox.persistence.schema_version import (
    SCHEMA_VERSION,
    VERSION_TABLE,
    VersionVerdict,
    read_version,
    verdict,
)

from .helpers import wait_for
from .test_cli import ROOT, kinbox

SCHEMA_FINGERPRINTS = {
    1: "b01da8103f3867dcd60e6aaf1738e8bb17e20a5fb715ceb72d460f0a8fe269c6",
}
"""schema version -> SHA-256 of the schema a fresh SQLite upgrade makes (every table's
and index's statement, sorted). A change to the models or the indexes changes it: raise
:data:`SCHEMA_VERSION` with it and pin the new fingerprint here."""


def _set_version(db: pw.Database, version: int) -> None:
    db.execute_sql(f"UPDATE {VERSION_TABLE} SET version = %s" if not is_sqlite(db)
                   else f"UPDATE {VERSION_TABLE} SET version = ?", (version,))


def _columns(db: pw.Database, table: str) -> set[str]:
    return {c.name for c in db.get_columns(table)}


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("found", "expected"), [
    (0, VersionVerdict.OLDER), (SCHEMA_VERSION - 1, VersionVerdict.OLDER),
    (SCHEMA_VERSION, VersionVerdict.CURRENT), (SCHEMA_VERSION + 1, VersionVerdict.NEWER),
])
def test_the_version_rule_compares_the_database_with_the_code(
        found: int, expected: VersionVerdict) -> None:
    assert verdict(found, SCHEMA_VERSION) is expected


@pytest.mark.timeout(60)
def test_a_new_database_is_stamped_with_the_code_schema_version(any_db_url: str) -> None:
    db = open_database(any_db_url)
    tables = bind_tables(db)
    assert read_version(db) == 0
    applied = upgrade(tables)
    assert f"set schema version to {SCHEMA_VERSION} (from 0)" in applied
    assert read_version(db) == SCHEMA_VERSION
    assert pending_changes(tables) == []
    db.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("older", ["unversioned", "version 0"])
def test_an_older_database_is_migrated_and_its_version_raised_by_one_upgrade(
        any_db_url: str, older: str) -> None:
    """A database from before the version number (no table) and one stamped older are
    upgraded alike: the missing column added, the version raised, both in one upgrade."""
    db = open_database(any_db_url)
    tables = bind_tables(db)
    upgrade(tables)
    if older == "unversioned":
        db.execute_sql(f"DROP TABLE {VERSION_TABLE}")
    else:
        _set_version(db, 0)
    db.execute_sql("ALTER TABLE agent_inbox_messages DROP COLUMN last_error")
    expected = ["add column agent_inbox_messages.last_error",
                f"set schema version to {SCHEMA_VERSION} (from 0)"]
    if older == "unversioned":
        expected.insert(0, f"create table {VERSION_TABLE}")
    assert sorted(pending_changes(tables)) == sorted(expected)
    with pytest.raises(SchemaError, match="kinbox db upgrade"):
        require_current(tables)
    assert sorted(upgrade(tables)) == sorted(expected)
    assert read_version(db) == SCHEMA_VERSION
    assert "last_error" in _columns(db, "agent_inbox_messages")
    require_current(tables)
    db.close()


@pytest.mark.timeout(60)
def test_a_database_newer_than_the_code_is_refused_and_left_as_it_is(
        any_db_url: str) -> None:
    """A newer kinbox's upgrade may have changed what a column means, or dropped an index
    this code would build again: this code changes nothing and says what to do."""
    db = open_database(any_db_url)
    tables = bind_tables(db)
    upgrade(tables)
    _set_version(db, SCHEMA_VERSION + 1)
    db.execute_sql("ALTER TABLE agent_inbox_messages DROP COLUMN last_error")
    for call in (upgrade, require_current, pending_changes):
        with pytest.raises(SchemaTooNew) as refused:
            call(tables)
        assert (refused.value.found, refused.value.known) == (SCHEMA_VERSION + 1,
                                                              SCHEMA_VERSION)
        assert isinstance(refused.value, SchemaError)
        assert isinstance(refused.value, KinboxError)
    assert read_version(db) == SCHEMA_VERSION + 1
    assert "last_error" not in _columns(db, "agent_inbox_messages")
    db.close()


@pytest.mark.timeout(60)
def test_db_status_on_a_newer_database_names_both_versions_and_fails(db_url: str) -> None:
    db = open_database(db_url)
    upgrade(bind_tables(db))
    _set_version(db, SCHEMA_VERSION + 1)
    db.close()
    done = kinbox("db", "status", "--db", db_url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"version {SCHEMA_VERSION + 1}" in done.stderr
    assert f"version {SCHEMA_VERSION}" in done.stderr
    done = kinbox("db", "upgrade", "--db", db_url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"version {SCHEMA_VERSION + 1}" in done.stderr


@pytest.mark.timeout(60)
def test_a_runtime_refuses_to_start_on_a_newer_database_and_can_start_after(
        db_url: str, clock: ManualClock) -> None:
    db = open_database(db_url)
    upgrade(bind_tables(db))
    _set_version(db, SCHEMA_VERSION + 1)
    db.close()
    rt = Runtime(db=db_url, clock=clock)
    with pytest.raises(SchemaTooNew):
        rt.start()
    db = open_database(db_url)
    _set_version(db, SCHEMA_VERSION)  # a backup of this version restored
    db.close()
    rt = Runtime(db=db_url, clock=clock)  # the refusal let go of the file's lock
    rt.start()
    rt.stop()


@pytest.mark.timeout(60)
def test_a_failed_migration_leaves_the_version_and_the_tables_as_they_were(
        any_db_url: str) -> None:
    """The version is raised in the upgrade's transaction: an upgrade that fails part way
    (here a table kinbox did not make, refused after another table was created) leaves
    neither the version nor the table it had made."""
    db = open_database(any_db_url)
    tables = bind_tables(db)
    upgrade(tables)
    db.execute_sql(f"DROP TABLE {VERSION_TABLE}")
    db.execute_sql("DROP TABLE agent_inbox_seq_mark")
    db.execute_sql("ALTER TABLE stop_requests DROP COLUMN session_id")  # required, no default
    with pytest.raises(SchemaError) as refused:
        upgrade(tables)
    assert not isinstance(refused.value, SchemaTooNew)
    assert read_version(db) == 0
    assert not {VERSION_TABLE, "agent_inbox_seq_mark"} & set(db.get_tables())
    db.close()


@pytest.mark.timeout(120)
def test_two_processes_upgrading_one_postgres_database_at_once_migrate_it_once(
        pg_url: str) -> None:
    import psycopg2

    from kinbox.persistence.schema import SCHEMA_LOCK_SQL

    holder = psycopg2.connect(pg_url)  # keeps both waiting, so they start together
    probe = psycopg2.connect(pg_url)
    probe.autocommit = True

    def waiting() -> int:
        with probe.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND wait_event_type = 'Lock' "
                        "AND wait_event = 'advisory'")
            return int(cur.fetchone()[0])
    procs: list[subprocess.Popen[str]] = []
    try:
        with holder.cursor() as cur:
            cur.execute(SCHEMA_LOCK_SQL)
        procs = [subprocess.Popen(
            [sys.executable, "-m", "kinbox.actors", "db", "upgrade", "--json", "--db",
             pg_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
            for _ in range(2)]
        wait_for(lambda: waiting() == 2 or any(p.poll() is not None for p in procs),
                 timeout=60, what="both upgrades to wait for the schema lock")
        holder.commit()
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        holder.close()
        probe.close()
    assert [p.returncode for p in procs] == [0, 0], outs
    applied = sorted((json.loads(out)["applied"] for out, _ in outs), key=len)
    assert applied[0] == []
    assert f"set schema version to {SCHEMA_VERSION} (from 0)" in applied[1]
    db = open_database(pg_url)
    assert db.execute_sql(f"SELECT version FROM {VERSION_TABLE}").fetchall() == [
        (SCHEMA_VERSION,)]
    db.close()


@pytest.mark.timeout(60)
def test_the_schema_version_is_raised_whenever_the_schema_changes(tmp_path: Path) -> None:
    """A guard on the number itself: a schema that differs from the one pinned for
    :data:`SCHEMA_VERSION` is a change an older kinbox must be told of."""
    db = open_database(f"sqlite:///{tmp_path / 'fresh.db'}")
    upgrade(bind_tables(db))
    statements = sorted(r[0] for r in db.execute_sql(
        "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall())
    db.close()
    fingerprint = hashlib.sha256("\n".join(statements).encode()).hexdigest()
    assert SCHEMA_FINGERPRINTS.get(SCHEMA_VERSION) == fingerprint, (
        f"the schema differs from version {SCHEMA_VERSION}'s: raise SCHEMA_VERSION in "
        f"persistence/schema_version.py and pin {fingerprint} for it here")
