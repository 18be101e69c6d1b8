"""The schema's version number: what a kinbox does with a database another version made.

A database records the schema version the last upgrade left it at, and the oldest
version whose code may still work on it. This code upgrades an older one (the version
raised in the upgrade's own transaction), works on a newer one that says it may, as it
is, and refuses one a newer kinbox upgraded past it, touching nothing; two processes
upgrading one PostgreSQL database at once migrate it once.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import peewee as pw
import pytest
from playhouse import migrate

from kinbox.actors import ManualClock, Runtime
from kinbox.persistence import (
    KinboxError,
    SchemaError,
    SchemaIncomplete,
    SchemaTooNew,
    Tables,
    bind_tables,
    open_database,
    pending_changes,
    require_current,
    upgrade,
)
from kinbox.persistence.database import is_sqlite
from kinbox.persistence.open_indexes import index_names
from kinbox.persistence.schema_version import (
    COMPATIBLE_FROM,
    SCHEMA_VERSION,
    VERSION_TABLE,
    Stamp,
    VersionVerdict,
    read_stamp,
    verdict,
    write_version,
)

from .helpers import AdvisoryWaiters, db_upgrade_process, wait_for
from .test_cli import kinbox

SCHEMA_FINGERPRINTS = {
    1: ("b01da8103f3867dcd60e6aaf1738e8bb17e20a5fb715ceb72d460f0a8fe269c6", 1),
    2: ("d3eefdf812a5d741c2307968a06a83e8b97ff4ae64b7769fca033ae0967f0dbb", 1),
}
"""schema version -> (SHA-256 of the schema a fresh SQLite upgrade makes (every table's
and index's statement, sorted), its :data:`COMPATIBLE_FROM`). A change to the models or
the indexes changes the first: raise :data:`SCHEMA_VERSION` with it, pin the new
fingerprint here, and say which older versions may still work on it."""


def _set_version(db: pw.Database, version: int, compatible: int | None = None) -> None:
    """Stamp the database as an upgrade to ``version`` would (``compatible``: the oldest
    version it says may work on it; ``version`` itself by default)."""
    mark = "?" if is_sqlite(db) else "%s"
    db.execute_sql(f"UPDATE {VERSION_TABLE} SET version = {mark}, compatible = {mark}",
                   (version, version if compatible is None else compatible))


def _as_version_1(db: pw.Database) -> None:
    """Make an up-to-date database what version 1 left: no ``compatible`` column."""
    db.execute_sql(f"ALTER TABLE {VERSION_TABLE} DROP COLUMN compatible")
    db.execute_sql(f"UPDATE {VERSION_TABLE} SET version = 1")


def _columns(db: pw.Database, table: str) -> set[str]:
    return {c.name for c in db.get_columns(table)}


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("found", "compatible", "expected"), [
    (0, 0, VersionVerdict.OLDER), (4, 4, VersionVerdict.OLDER),
    (4, 2, VersionVerdict.OLDER), (5, 5, VersionVerdict.CURRENT),
    (5, 3, VersionVerdict.CURRENT), (6, 6, VersionVerdict.NEWER),
    (9, 6, VersionVerdict.NEWER), (6, 5, VersionVerdict.NEWER_COMPATIBLE),
    (9, 1, VersionVerdict.NEWER_COMPATIBLE),
])
def test_the_version_rule_compares_the_database_with_the_code(
        found: int, compatible: int, expected: VersionVerdict) -> None:
    """Code of version 5 against a database's version and the oldest version it says may
    work on it."""
    assert verdict(found, 5, compatible) is expected


@pytest.mark.timeout(60)
def test_a_new_database_is_stamped_with_the_code_schema_version(any_db_url: str) -> None:
    db = open_database(any_db_url)
    tables = bind_tables(db)
    assert read_stamp(db).version == 0
    applied = upgrade(tables)
    assert f"set schema version to {SCHEMA_VERSION} (from 0)" in applied
    assert read_stamp(db).version == SCHEMA_VERSION
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
    assert read_stamp(db).version == SCHEMA_VERSION
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
    _set_version(db, SCHEMA_VERSION + 1, compatible=SCHEMA_VERSION + 1)
    db.execute_sql("ALTER TABLE agent_inbox_messages DROP COLUMN last_error")
    for call in (upgrade, require_current, pending_changes):
        with pytest.raises(SchemaTooNew) as refused:
            call(tables)
        assert (refused.value.found, refused.value.known, refused.value.compatible) == (
            SCHEMA_VERSION + 1, SCHEMA_VERSION, SCHEMA_VERSION + 1)
        assert isinstance(refused.value, SchemaError)
        assert isinstance(refused.value, KinboxError)
    assert read_stamp(db).version == SCHEMA_VERSION + 1
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
    assert read_stamp(db).version == 0
    assert not {VERSION_TABLE, "agent_inbox_seq_mark"} & set(db.get_tables())
    db.close()


@pytest.mark.timeout(120)
def test_two_processes_upgrading_one_postgres_database_at_once_migrate_it_once(
        pg_url: str) -> None:
    import psycopg2

    from kinbox.persistence.schema import SCHEMA_LOCK_SQL

    holder = psycopg2.connect(pg_url)  # keeps both waiting, so they start together
    waiting = AdvisoryWaiters(pg_url)
    procs: list[subprocess.Popen[str]] = []
    try:
        with holder.cursor() as cur:
            cur.execute(SCHEMA_LOCK_SQL)
        procs = [db_upgrade_process(pg_url) for _ in range(2)]
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
        waiting.close()
    assert [p.returncode for p in procs] == [0, 0], outs
    applied = sorted((json.loads(out)["applied"] for out, _ in outs), key=len)
    assert applied[0] == []
    assert f"set schema version to {SCHEMA_VERSION} (from 0)" in applied[1]
    db = open_database(pg_url)
    assert db.execute_sql(f"SELECT version, compatible FROM {VERSION_TABLE}").fetchall() == [
        (SCHEMA_VERSION, COMPATIBLE_FROM)]
    db.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("newer", ["compatible", "incompatible"])
def test_an_upgrade_waiting_for_the_lock_looks_again_and_leaves_a_newer_database_alone(
        pg_url: str, newer: str) -> None:
    """An older kinbox's upgrade that found work to do waits for the schema lock while a
    newer kinbox upgrades: under the lock it judges the database again, and so neither
    builds an index the newer one dropped nor lowers its numbers (compatible: nothing to
    do, exit 0; not: refused, exit 1)."""
    import psycopg2

    from kinbox.persistence.schema import SCHEMA_LOCK_SQL

    db = open_database(pg_url)
    upgrade(bind_tables(db))
    db.execute_sql(f"DROP INDEX {DROPPED_INDEX}")  # work for the older upgrade to find
    db.close()
    holder = psycopg2.connect(pg_url)  # the newer kinbox, upgrading
    waiting = AdvisoryWaiters(pg_url)
    compatible = SCHEMA_VERSION if newer == "compatible" else SCHEMA_VERSION + 1
    proc: subprocess.Popen[str] | None = None
    try:
        with holder.cursor() as cur:
            cur.execute(SCHEMA_LOCK_SQL)
        proc = db_upgrade_process(pg_url)
        wait_for(lambda: waiting() == 1 or proc.poll() is not None, timeout=60,
                 what="the older upgrade to wait for the schema lock")
        with holder.cursor() as cur:
            cur.execute(f"UPDATE {VERSION_TABLE} SET version = %s, compatible = %s",
                        (SCHEMA_VERSION + 1, compatible))
        holder.commit()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        holder.close()
        waiting.close()
    if newer == "compatible":
        assert proc.returncode == 0, out + err
        assert json.loads(out)["applied"] == []
    else:
        assert proc.returncode == 1, out + err
        assert f"version {SCHEMA_VERSION + 1}" in err
    db = open_database(pg_url)
    assert read_stamp(db) == Stamp(SCHEMA_VERSION + 1, compatible)
    assert DROPPED_INDEX not in index_names(db)
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
    pinned, compatible = SCHEMA_FINGERPRINTS.get(SCHEMA_VERSION, ("", 0))
    assert pinned == fingerprint, (
        f"the schema differs from version {SCHEMA_VERSION}'s: raise SCHEMA_VERSION in "
        f"persistence/schema_version.py and pin {fingerprint} for it here, with the "
        "oldest version that may still work on it (COMPATIBLE_FROM)")
    assert compatible == COMPATIBLE_FROM, (
        f"version {SCHEMA_VERSION} is pinned as compatible from {compatible}, the code "
        f"says {COMPATIBLE_FROM}")


@pytest.fixture
def upgraded(any_db_url: str) -> Iterator[tuple[pw.Database, Tables]]:
    """A database of each backend, upgraded to this code's schema."""
    db = open_database(any_db_url)
    tables = bind_tables(db)
    upgrade(tables)
    yield db, tables
    db.close()


NEWER_TABLE = "kinbox_newer_feature"
"""A table a newer kinbox made, which this code knows nothing of."""

DROPPED_INDEX = "sessions_created_at_id"
"""An index of this code's models that a newer kinbox might have dropped or replaced."""


def _as_newer_compatible(db: pw.Database) -> None:
    """Make an up-to-date database what a newer kinbox that says this code may still work
    on it leaves: a table and a column of its own, one of this code's indexes gone."""
    # Not one of kinbox's tables, which a PostgreSQL test's reset drops: this one may be
    # left from an earlier test on the same database.
    db.execute_sql(f"DROP TABLE IF EXISTS {NEWER_TABLE}")
    db.execute_sql(f"CREATE TABLE {NEWER_TABLE} (id INTEGER PRIMARY KEY)")
    db.execute_sql("ALTER TABLE agent_inbox_messages ADD COLUMN newer_note TEXT")
    # Required, but filled by the table: a default, and on PostgreSQL an identity column.
    db.execute_sql("ALTER TABLE projects ADD COLUMN newer_count INTEGER NOT NULL DEFAULT 0")
    if not is_sqlite(db):
        db.execute_sql("ALTER TABLE projects ADD COLUMN newer_number bigint "
                       "GENERATED ALWAYS AS IDENTITY")
    db.execute_sql(f"DROP INDEX {DROPPED_INDEX}")
    _set_version(db, SCHEMA_VERSION + 1, compatible=SCHEMA_VERSION)


@pytest.mark.timeout(60)
def test_a_newer_database_that_says_this_code_may_work_on_it_is_used_as_it_is(
        any_db_url: str) -> None:
    """A rolling deploy: a newer kinbox upgraded the database with changes this one can
    live with. This one starts and delivers on it, and changes nothing: no index of its
    models built again, no number taken back."""
    db = open_database(any_db_url)
    tables = bind_tables(db)
    upgrade(tables)
    _as_newer_compatible(db)
    assert pending_changes(tables) == []
    require_current(tables)
    assert upgrade(tables) == []
    handled: list[str] = []
    rt = Runtime(db=any_db_url, brain=lambda turn: handled.append(turn.messages[0].content))
    rt.start()
    try:
        project = rt.create_project("p")
        session = rt.create_session(project.id, "s")
        rt.post(session.id, "hello from the older kinbox")
        wait_for(lambda: [r["status"] for r in rt.inbox()] == ["delivered"], timeout=30,
                 what="the message delivered on the newer database")
    finally:
        rt.stop()
    assert handled == ["hello from the older kinbox"]
    assert read_stamp(db) == Stamp(SCHEMA_VERSION + 1, SCHEMA_VERSION)
    assert DROPPED_INDEX not in index_names(db)
    assert NEWER_TABLE in db.get_tables()
    db.close()


def _add_required_column(db: pw.Database) -> None:
    """What a newer kinbox's upgrade does for a required field with a default in Python
    (peewee's migrator: added, filled, then NOT NULL, no default left in the table)."""
    migrator = (migrate.SqliteMigrator(db) if is_sqlite(db)
                else migrate.PostgresqlMigrator(db))
    migrate.migrate(migrator.add_column("projects", "newer_required",
                                        pw.IntegerField(default=0)))


LACKS = {
    "column": ("ALTER TABLE agent_inbox_messages DROP COLUMN last_error",
               "add column agent_inbox_messages.last_error"),
    "unique index": ("DROP INDEX projects_slug", "unique index projects_slug"),
    "required column": (_add_required_column,
                        "a value for projects.newer_required (required, unknown to this "
                        "kinbox)"),
}
"""What a newer database may lack for this code: how to take it away, and the line that
names it in the refusal."""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lacking", sorted(LACKS))
def test_a_newer_compatible_database_lacking_what_this_code_needs_is_refused(
        upgraded: tuple[pw.Database, Tables], lacking: str) -> None:
    """A newer kinbox's promise is checked, not trusted: a column this code reads and
    writes gone, a unique index its writes rely on gone, or a column its inserts would
    have to fill and cannot: refused at once (not insert by insert, mid-run), naming
    what is missing, nothing added back."""
    db, tables = upgraded
    _as_newer_compatible(db)
    take_away, named = LACKS[lacking]
    if callable(take_away):
        take_away(db)
    else:
        db.execute_sql(take_away)
    for call in (upgrade, require_current, pending_changes):
        with pytest.raises(SchemaIncomplete) as refused:
            call(tables)
        assert refused.value.missing == [named]
        assert (refused.value.found, refused.value.known, refused.value.compatible) == (
            SCHEMA_VERSION + 1, SCHEMA_VERSION, SCHEMA_VERSION)
        assert isinstance(refused.value, SchemaError)
    if lacking == "column":  # nothing added back
        assert "last_error" not in _columns(db, "agent_inbox_messages")
    if lacking == "unique index":
        assert "projects_slug" not in index_names(db)
    assert read_stamp(db) == Stamp(SCHEMA_VERSION + 1, SCHEMA_VERSION)


@pytest.mark.timeout(60)
def test_a_newer_compatible_postgres_database_without_the_inbox_sequence_is_refused(
        pg_url: str) -> None:
    db = open_database(pg_url)
    tables = bind_tables(db)
    upgrade(tables)
    _as_newer_compatible(db)
    db.execute_sql("DROP SEQUENCE agent_inbox_seq CASCADE")
    with pytest.raises(SchemaIncomplete) as refused:
        upgrade(tables)
    assert refused.value.missing == ["create sequence agent_inbox_seq"]
    db.close()


@pytest.mark.timeout(60)
def test_a_newer_version_that_recorded_no_compatible_number_is_refused(
        upgraded: tuple[pw.Database, Tables]) -> None:
    """A missing number promises nothing beyond its own version."""
    db, tables = upgraded
    db.execute_sql(f"UPDATE {VERSION_TABLE} SET version = {SCHEMA_VERSION + 1}, "
                   "compatible = NULL")
    assert read_stamp(db) == Stamp(SCHEMA_VERSION + 1, SCHEMA_VERSION + 1)
    with pytest.raises(SchemaTooNew):
        upgrade(tables)


@pytest.mark.timeout(60)
def test_a_version_1_database_gets_the_compatible_number_by_its_upgrade(
        upgraded: tuple[pw.Database, Tables]) -> None:
    db, tables = upgraded
    _as_version_1(db)
    assert read_stamp(db) == Stamp(1, 1)
    assert sorted(pending_changes(tables)) == sorted([
        f"add column {VERSION_TABLE}.compatible",
        f"set schema version to {SCHEMA_VERSION} (from 1)"])
    upgrade(tables)
    assert read_stamp(db) == Stamp(SCHEMA_VERSION, COMPATIBLE_FROM)
    assert pending_changes(tables) == []


@pytest.mark.timeout(60)
def test_db_status_shows_both_numbers_and_accepts_a_newer_compatible_database(
        db_url: str) -> None:
    db = open_database(db_url)
    upgrade(bind_tables(db))
    db.close()
    status = kinbox("db", "status", "--json", "--db", db_url)
    assert status.returncode == 0, status.stdout + status.stderr
    assert json.loads(status.stdout)["schema_version"] == {
        "database": SCHEMA_VERSION, "compatible_from": COMPATIBLE_FROM,
        "this_kinbox": SCHEMA_VERSION}
    plain = kinbox("db", "status", "--db", db_url)
    assert (f"schema version: {SCHEMA_VERSION} (this kinbox: {SCHEMA_VERSION}; kinbox of "
            f"schema version {COMPATIBLE_FROM} or later may work on it)") in plain.stdout
    db = open_database(db_url)
    _as_newer_compatible(db)
    db.close()
    status = kinbox("db", "status", "--json", "--db", db_url)
    assert status.returncode == 0, status.stdout + status.stderr
    shown = json.loads(status.stdout)
    assert shown["up_to_date"] is True
    assert shown["schema_version"] == {"database": SCHEMA_VERSION + 1,
                                       "compatible_from": SCHEMA_VERSION,
                                       "this_kinbox": SCHEMA_VERSION}
    plain = kinbox("db", "status", "--db", db_url)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert (f"schema version: {SCHEMA_VERSION + 1} (this kinbox: {SCHEMA_VERSION}; upgraded "
            f"by a newer kinbox; kinbox of schema version {SCHEMA_VERSION} or later may work "
            "on it)") in plain.stdout
    upgraded = kinbox("db", "upgrade", "--db", db_url)
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    db = open_database(db_url)
    assert read_stamp(db) == Stamp(SCHEMA_VERSION + 1, SCHEMA_VERSION)
    assert DROPPED_INDEX not in index_names(db)
    db.close()


@pytest.mark.timeout(60)
def test_the_numbers_are_never_written_over_a_newer_version(
        upgraded: tuple[pw.Database, Tables]) -> None:
    """Beyond the lock: an upgrade's stamp that finds a newer one (raised by a process that
    took no lock, or by hand) fails its upgrade instead of lowering it."""
    db, _ = upgraded
    _set_version(db, SCHEMA_VERSION + 1, compatible=SCHEMA_VERSION + 1)
    with pytest.raises(SchemaTooNew), db.atomic():
        write_version(db)
    assert read_stamp(db) == Stamp(SCHEMA_VERSION + 1, SCHEMA_VERSION + 1)
