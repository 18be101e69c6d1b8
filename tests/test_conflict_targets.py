"""Inserts that leave a row already there pass over its key's conflict alone, on both
backends: a row the table refuses for another reason (a NOT NULL value missing) is the
error it is, and nothing is written.

Each of these inserted with peewee's ``on_conflict_ignore()``, on SQLite ``INSERT OR
IGNORE``, which passes over every constraint the row breaks: the refused row was answered
as a duplicate id, as a missing row, or not at all (a stop never asked, a reply never
kept). PostgreSQL's ``ON CONFLICT DO NOTHING`` only ever passed over unique conflicts.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from kinbox.persistence import (
    DatabaseFailed,
    DuplicateError,
    JobRecord,
    JobStore,
    KeptReply,
    RateBuckets,
    SocialOutbox,
    StopRequests,
)

from .conftest import Stores

PERSISTENCE = Path(__file__).resolve().parent.parent / "persistence"


def refused(call: Callable[[], object]) -> DatabaseFailed:
    """The error ``call`` raised: the table's refusal, not a duplicate."""
    with pytest.raises(DatabaseFailed) as caught:
        call()
    assert not isinstance(caught.value, DuplicateError)
    assert caught.value.kind == "IntegrityError"
    return caught.value


@pytest.mark.timeout(60)
def test_a_project_the_table_refuses_is_an_error_and_its_twin_is_kept(stores: Stores) -> None:
    store = stores.store
    refused(lambda: store.ensure_project("p-1", "team", None, 1.0))  # type: ignore[arg-type]
    assert store.project_by_slug("team") is None
    first = store.ensure_project("p-1", "team", "Team", 1.0)
    assert store.ensure_project("p-1", "team", "Other", 2.0) == first
    with pytest.raises(DuplicateError) as taken:
        store.ensure_project("p-1", "crew", "Crew", 2.0)
    assert (taken.value.field, taken.value.value) == ("id", "p-1")
    assert [p.slug for p in store.projects()] == ["team"]


@pytest.mark.timeout(60)
def test_a_session_the_table_refuses_is_an_error_not_a_taken_id(stores: Stores) -> None:
    store = stores.store
    refused(lambda: store.create_session("s-1", None, None, "direct", 1.0))  # type: ignore[arg-type]
    assert store.session("s-1") is None
    store.create_session("s-1", None, "Chat", "direct", 1.0)
    with pytest.raises(DuplicateError) as taken:
        store.create_session("s-1", None, "Chat", "direct", 2.0)
    assert (taken.value.field, taken.value.value) == ("id", "s-1")


def schedule(chat_id: str | None, note: str = "beat") -> JobRecord:
    return JobRecord("heartbeat", chat_id, "heartbeat", note, None, 60.0, None,  # type: ignore[arg-type]
                     100.0, None, True, 1.0)


@pytest.mark.timeout(60)
def test_an_ensured_job_the_table_refuses_is_an_error(stores: Stores) -> None:
    jobs = JobStore(stores.tables, stores.writer)
    refused(lambda: jobs.ensure(schedule(None)))
    assert jobs.get("heartbeat") is None
    first = jobs.ensure(schedule("focal"))
    assert jobs.ensure(schedule("focal", note="another process's")) == first


def reply(platform: str | None, text: str = "hello") -> KeptReply:
    return KeptReply("m-1", "s-1", platform, {"chat": 1}, text, "rt-1")  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_a_reply_the_table_refuses_is_an_error_not_kept_silently(stores: Stores) -> None:
    outbox = SocialOutbox(stores.tables, stores.writer)
    refused(lambda: stores.writer.call(lambda: outbox.keep_now(reply(None), 1.0)))
    stores.writer.call(lambda: outbox.keep_now(reply("telegram"), 1.0))
    stores.writer.call(lambda: outbox.keep_now(reply("telegram", "again"), 2.0))
    r = stores.tables.social_reply
    assert [(x.reply_id, x.text) for x in r.select()] == [("m-1", "hello")]


@pytest.mark.timeout(60)
def test_a_stop_the_table_refuses_is_an_error_not_dropped(stores: Stores) -> None:
    stops = StopRequests(stores.tables, stores.writer)
    refused(lambda: stops.ask("m-1", None, "operator", 1.0))  # type: ignore[arg-type]
    assert stops.pending() == []
    stops.ask("m-1", "s-1", "operator", 1.0)
    stops.ask("m-1", "s-1", "peer", 2.0)
    assert [(s.message_id, s.asked_by) for s in stops.pending()] == [("m-1", "operator")]


@pytest.mark.timeout(60)
def test_a_bucket_the_table_refuses_is_an_error_and_a_pair_has_one_row(stores: Stores) -> None:
    buckets = RateBuckets(stores.tables, stores.writer)
    refused(lambda: buckets.change(None, "t", lambda s: (None, s)))  # type: ignore[arg-type]
    assert buckets.change("a", "b", lambda s: ((5.0, 1.0), s)) is None
    assert buckets.change("a", "b", lambda s: (None, s)) == (5.0, 1.0)
    assert stores.tables.bucket.select().count() == 1


def _ignores_every_conflict(tree: ast.AST) -> list[int]:
    """Lines of ``tree`` that insert ignoring every constraint: ``on_conflict_ignore()``,
    ``on_conflict(action="IGNORE")``, or SQL text saying ``OR IGNORE`` (docstrings aside)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return [node.lineno for node in ast.walk(tree)
            if _ignore_call(node) or (id(node) not in docstrings and _ignore_sql(node))]


def _ignore_call(node: ast.AST, ignoring: tuple[str, ...] = ("ignore",)) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "on_conflict_ignore"
    return isinstance(node, ast.Call) and any(
        k.arg == "action" and isinstance(k.value, ast.Constant)
        and str(k.value.value).lower() in ignoring for k in node.keywords)


def _ignore_sql(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and re.search(r"\bOR\s+IGNORE\b", node.value, re.IGNORECASE) is not None)


@pytest.mark.timeout(60)
def test_no_persistence_insert_ignores_every_conflict() -> None:
    found = {path.name: lines for path in sorted(PERSISTENCE.glob("*.py"))
             if (lines := _ignores_every_conflict(ast.parse(path.read_text())))}
    assert found == {}
    assert _ignores_every_conflict(ast.parse("t.insert(x=1).on_conflict_ignore()"))
    assert _ignores_every_conflict(ast.parse('db.execute_sql("INSERT OR IGNORE INTO t")'))


@pytest.mark.timeout(60)
def test_a_conflict_is_passed_over_by_the_one_rule_only() -> None:
    """Every insert that keeps a row already there says so through ``unless_present``: a
    DO NOTHING written beside it is the rule restated, and drifts from it."""
    found = {path.name: [n.lineno for n in ast.walk(ast.parse(path.read_text()))
                         if _ignore_call(n, ("ignore", "nothing"))]
             for path in sorted(PERSISTENCE.glob("*.py")) if path.name != "conflicts.py"}
    assert {name: lines for name, lines in found.items() if lines} == {}
