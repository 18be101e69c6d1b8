"""Operator commands at their edges: a filter given empty, a bulk change racing another
process, an upgrade another process made first. Each test failed on the code before its
fix."""

from __future__ import annotations

import json

import pytest

from .conftest import Stores
from .test_cli import kinbox

pytestmark = pytest.mark.timeout(120)


def test_an_empty_project_filter_is_a_usage_error_not_every_project(db_url: str) -> None:
    """``sessions list --project "$UNSET"`` listed the sessions of every project, with
    status 0, as if the filter had matched them all (an empty ``--target`` or ``--kind``
    is refused the same way)."""
    s = Stores(db_url)
    s.store.create_project("p_books", "books", "Books", 0)
    s.store.create_session("mine", "p_books", "Mine", "interactive", 0)
    s.store.create_session("other", None, "Other", "interactive", 0)
    s.close()
    for empty in ("", " "):
        done = kinbox("sessions", "list", "--project", empty, "--json", "--db", db_url)
        assert done.returncode == 2, done.stdout
        assert "Traceback" not in done.stderr
        assert "argument --project: expected a project slug, got an empty one" in done.stderr
    done = kinbox("sessions", "list", "--project", "books", "--json", "--db", db_url)
    assert done.returncode == 0, done.stderr
    assert [s["id"] for s in json.loads(done.stdout)["items"]] == ["mine"]
