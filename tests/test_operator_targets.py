"""The operator's commands act on the database and rows they name, or refuse: a URL as
libpq and SQLite paths read it, filters that are never ignored, a first start beside
another process. Each test failed on the code before its fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kinbox.persistence import NewMessage

from .conftest import Stores
from .test_cli import kinbox

pytestmark = pytest.mark.timeout(120)


def kinbox_in(cwd: Path, *args: str, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    """The CLI run from ``cwd`` (a user's own directory), as a shell runs it."""
    return subprocess.run([sys.executable, "-m", "kinbox.actors", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})}, cwd=cwd)


def test_a_sqlite_url_under_the_home_folder_opens_that_file_and_no_other(
        tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    (work / "~").mkdir(parents=True)  # a folder literally named '~' where the user stands
    env = {"HOME": str(home)}
    made = kinbox_in(work, "db", "upgrade", "--db", "sqlite:///~/kinbox.db", env=env)
    assert made.returncode == 0, made.stderr
    assert (home / "kinbox.db").is_file()
    assert not (work / "~" / "kinbox.db").exists()
    status = kinbox_in(work, "db", "status", "--db", "sqlite:///~/kinbox.db", env=env)
    assert status.returncode == 0, status.stderr
    assert "schema: up to date" in status.stdout


def test_requeue_of_one_id_refuses_filters_it_would_ignore(db_url: str) -> None:
    s = Stores(db_url)
    s.store.create_session("s1", None, "Worker", "interactive", 0)
    s.journal.enqueue(NewMessage("stuck", "s1", "body"), 0)
    s.journal.claim("w", 0)
    s.journal.retry("w", "stuck", "boom", 0, permanent=True)
    s.close()
    for flags in (("--target", "someone-else"), ("--kind", "subagent_result")):
        done = kinbox("inbox", "requeue", "stuck", *flags, "--db", db_url)
        assert done.returncode == 1, done.stdout
        assert "Traceback" not in done.stderr
        assert "--all-failed" in done.stderr
    shown = kinbox("inbox", "show", "stuck", "--db", db_url)
    assert "status: failed" in shown.stdout  # nothing was requeued
