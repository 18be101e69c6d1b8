"""Operator reads at their edges: what ``db status`` tells a deploy script, what ``inbox
show`` reads of a row changing under it. Each test failed on the code before its fix."""

from __future__ import annotations

import json

import pytest

from kinbox.persistence import bind_tables, open_database, upgrade

from .test_cli import kinbox


@pytest.mark.timeout(120)
def test_db_status_exits_non_zero_while_an_upgrade_is_pending(db_url: str) -> None:
    """``kinbox db status`` printed "needs upgrade" and exited 0: a deploy script checking
    the exit status went on to start a runtime against an old schema. It now exits 3 (no
    error, a state to act on), and 0 once the schema is current."""
    db = open_database(db_url)
    upgrade(bind_tables(db))
    db.execute_sql("DROP TABLE agent_inbox_seq_mark")
    db.close()
    pending = kinbox("db", "status", "--db", db_url)
    assert pending.returncode == 3, (pending.stdout, pending.stderr)
    assert "needs upgrade" in pending.stdout and "Traceback" not in pending.stderr
    as_json = kinbox("db", "status", "--json", "--db", db_url)
    assert as_json.returncode == 3
    assert json.loads(as_json.stdout)["up_to_date"] is False
    assert kinbox("db", "upgrade", "--db", db_url).returncode == 0
    current = kinbox("db", "status", "--db", db_url)
    assert current.returncode == 0, current.stderr
    assert "up to date" in current.stdout
