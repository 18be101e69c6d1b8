"""The schema check reads the catalog once: a runtime's start, a worker's and every
command's on an up-to-date database cost a handful of statements, not one or two per
table (58 on PostgreSQL, 0.1-0.3 s of every start, before :mod:`.schema_catalog`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import peewee as pw
import pytest

from kinbox.persistence import bind_tables, open_database, pending_changes, upgrade
from kinbox.persistence.database import is_postgres
from kinbox.persistence.schema_catalog import read_catalog

CHECK_STATEMENTS = 8
"""The most statements the check of an up-to-date PostgreSQL database may run: the
tables, the version, the columns, the indexes, the inbox sequence's two reads."""


def _recorded(url: str) -> tuple[pw.Database, list[str]]:
    """An up-to-date database at ``url`` whose statements from here on are recorded."""
    db = open_database(url)
    upgrade(bind_tables(db))
    seen: list[str] = []
    real = db.execute_sql

    def recording(sql: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(sql)
        return real(sql, *args, **kwargs)
    db.execute_sql = recording  # type: ignore[method-assign]
    return db, seen


@pytest.fixture
def counted(any_db_url: str) -> Iterator[tuple[pw.Database, list[str]]]:
    """An up-to-date database of each backend whose statements are recorded."""
    db, seen = _recorded(any_db_url)
    yield db, seen
    db.close()


@pytest.mark.timeout(60)
def test_the_check_of_an_up_to_date_postgres_schema_reads_the_catalog_once(
        pg_url: str) -> None:
    """(SQLite reads one PRAGMA per table in process, as before: nothing to bound.)"""
    db, seen = _recorded(pg_url)
    try:
        assert pending_changes(bind_tables(db)) == []
        assert len(seen) <= CHECK_STATEMENTS, seen
        assert sum("pg_attribute" in sql for sql in seen) == 1, seen
    finally:
        db.close()


@pytest.mark.timeout(60)
def test_the_catalog_says_what_each_column_takes(
        counted: tuple[pw.Database, list[str]]) -> None:
    """What the check decides by: NULL or not, a default in the table or not (peewee's
    defaults live in Python), and on PostgreSQL a text column's width."""
    db, _ = counted
    catalog = read_catalog(db, ["projects", "agent_inbox_messages", "no_such_table"])
    assert set(catalog.columns) == {"projects", "agent_inbox_messages"}
    assert "projects" in catalog.tables and "no_such_table" not in catalog.tables
    assert "projects_slug" in catalog.indexes
    slug = catalog.columns["projects"]["slug"]
    assert (slug.null, slug.has_default) == (False, False)
    assert slug.width == (128 if is_postgres(db) else None)
    assert catalog.columns["agent_inbox_messages"]["last_error"].null is True
    db.execute_sql("ALTER TABLE projects ADD COLUMN later INTEGER DEFAULT 7")
    later = read_catalog(db, ["projects"]).columns["projects"]["later"]
    assert (later.null, later.has_default) == (True, True)


@pytest.mark.timeout(60)
def test_a_column_the_table_fills_itself_counts_as_filled(pg_url: str) -> None:
    """An identity or a generated column needs no value from an insert, as a default
    does; a required column with neither does."""
    db = open_database(pg_url)
    upgrade(bind_tables(db))
    db.execute_sql("ALTER TABLE projects ADD COLUMN numbered bigint GENERATED ALWAYS AS "
                   "IDENTITY, ADD COLUMN doubled bigint GENERATED ALWAYS AS "
                   "(length(slug) * 2) STORED, ADD COLUMN required_later bigint")
    db.execute_sql("UPDATE projects SET required_later = 0")
    db.execute_sql("ALTER TABLE projects ALTER COLUMN required_later SET NOT NULL")
    columns = read_catalog(db, ["projects"]).columns["projects"]
    assert columns["numbered"].has_default and not columns["numbered"].null
    assert columns["doubled"].has_default
    assert not columns["required_later"].has_default and not columns["required_later"].null
    db.close()
