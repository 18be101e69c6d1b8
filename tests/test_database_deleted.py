"""A SQLite file deleted under a running runtime: no connection made after it creates an
empty database in its place, and health says why it is unhealthy. Each test failed on
the code before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinbox.actors import Runtime

from .helpers import quiet_brain

pytestmark = pytest.mark.timeout(90)


def test_health_after_the_sqlite_file_was_deleted_is_unhealthy_and_creates_no_file(
    tmp_path: Path,
) -> None:
    """The read probe runs on a thread of its own, whose new connection made an empty
    SQLite file (mode 0644) where the deleted one was: health said "no such table", and
    the next runtime started on an empty database."""
    path = tmp_path / "kinbox.db"
    rt = Runtime(db=f"sqlite:///{path}", brain=quiet_brain, data_dir=tmp_path / "data").start()
    try:
        for name in (path.name, f"{path.name}-wal", f"{path.name}-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        report = rt.health(timeout=20.0)
        database = report["checks"]["database"]
        assert not report["healthy"] and not database["ok"]
        assert database["error_type"] == "OperationalError"
        assert "no database file" in database["error"] and str(path) in database["error"]
        assert not path.exists()
    finally:
        rt.stop()
    assert not path.exists()
