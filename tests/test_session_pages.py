"""A walk over the session listing's pages shows each session once while sessions turn.

``rt.sessions(limit, offset)`` and ``kinbox sessions list --offset`` ordered by recency,
which every turn changes: a session that turned between two page reads moved to the
front, so the next page showed one session again and skipped another. The listing now
walks in creation order from a cursor (``rt.sessions_page``, ``sessions list --after``;
``--offset`` counts in the same order), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kinbox.actors import ConfigError, ManualClock, Runtime, Turn
from kinbox.actors.cli import main
from kinbox.persistence import InvalidArgument, SessionPage, paging

from .conftest import Stores

pytestmark = pytest.mark.timeout(120)


def answer(turn: Turn) -> None:
    turn.reply("ok")


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'walk.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def walked(url: str, clock: ManualClock) -> Iterator[Runtime]:
    """A runtime with a brain and 23 sessions over two projects; a few created at one
    time (ties by id)."""
    rt = Runtime(db=url, brain=answer, clock=clock)
    rt.start()
    p, q = rt.create_project("p"), rt.create_project("q")
    for i in range(23):
        rt.create_session(p.id if i % 3 else q.id, f"s{i}", session_id=f"s{i:02d}")
        if i % 4 == 0:
            clock.advance(1)  # the others tie with a neighbour
    try:
        yield rt
    finally:
        rt.stop()


class Turns:
    """Another thread that has sessions turn (a message each, answered) between two
    page reads: each turn makes its session the most recently active."""

    def __init__(self, rt: Runtime, clock: ManualClock) -> None:
        self.rt, self.clock = rt, clock

    def run(self, targets: list[str]) -> None:
        def work() -> None:
            for target in targets:
                self.clock.advance(5)
                self.rt.post(target, "wake up")
            self.rt.run_until_idle(timeout=30)
        thread = threading.Thread(target=work)
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive()


def unseen(every: list[str], seen: list[str]) -> list[str]:
    """The sessions the walk has still to show (the ones a recency order moves)."""
    return [sid for sid in every if sid not in seen][-2:]


def test_rt_sessions_page_shows_each_session_once_while_sessions_turn(
        walked: Runtime, clock: ManualClock) -> None:
    rt, turns = walked, Turns(walked, clock)
    records = rt.sessions()
    every = [s.id for s in records]
    seen: list[str] = []
    page = rt.sessions_page(limit=4)
    while True:
        seen += [s.id for s in page.sessions]
        if page.after is None:
            break
        turns.run(unseen(every, seen) + seen[-1:])
        page = rt.sessions_page(limit=4, after=page.after)
    assert sorted(seen) == sorted(every)  # each once: none repeated, none skipped
    assert len(seen) == len(every) == 23
    # Newest created first, ties by id (descending), whatever turned meanwhile.
    assert seen == [s.id for s in sorted(records, key=lambda s: (s.created_at, s.id),
                                         reverse=True)]
    assert [s.id for s in rt.sessions()] != every  # the turns did reorder by recency


def test_a_projects_walk_shows_its_sessions_once_while_sessions_turn(
        walked: Runtime, clock: ManualClock) -> None:
    rt, turns = walked, Turns(walked, clock)
    project = rt.project("p")
    assert project is not None
    every = [s.id for s in rt.sessions(project.id)]
    seen: list[str] = []
    page = rt.sessions_page(project.id, limit=3)
    while page.after is not None:
        seen += [s.id for s in page.sessions]
        turns.run(unseen(every, seen))
        page = rt.sessions_page(project.id, limit=3, after=page.after)
    seen += [s.id for s in page.sessions]
    assert sorted(seen) == sorted(every) and len(seen) == len(set(seen)) == 15


def cli_page(url: str, *args: str) -> dict[str, Any]:
    out = io.StringIO()
    assert main(["sessions", "list", "--db", url, "--json", "--limit", "5", *args],
                out=out) == 0
    listed = json.loads(out.getvalue())
    assert isinstance(listed, dict)
    return listed


@pytest.mark.parametrize("by", ["next_offset", "next_after"])
def test_sessions_list_walks_each_session_once_while_sessions_turn(
        walked: Runtime, url: str, clock: ManualClock, by: str) -> None:
    """As a script pages: with ``--offset NEXT_OFFSET`` (the README's way) or with
    ``--after NEXT_AFTER``."""
    rt, turns = walked, Turns(walked, clock)
    every = [s.id for s in rt.sessions()]
    seen: list[str] = []
    page = cli_page(url)
    while True:
        seen += [item["id"] for item in page["items"]]
        if not page["more"]:
            break
        turns.run(unseen(every, seen))
        flag = "--offset" if by == "next_offset" else "--after"
        page = cli_page(url, flag, str(page[by]))
    assert sorted(seen) == sorted(every) and len(seen) == 23


def test_a_cursor_walk_shows_no_session_twice_while_sessions_are_created(
        walked: Runtime, clock: ManualClock) -> None:
    """New sessions come before the walk's start: none is shown, none pushes another
    one onto the next page (an offset would show one twice)."""
    rt = walked
    before = {s.id for s in rt.sessions()}
    seen: list[str] = []
    page = rt.sessions_page(limit=5)
    n = 0
    while True:
        seen += [s.id for s in page.sessions]
        if page.after is None:
            break
        clock.advance(1)
        rt.create_session(None, f"new {n}", session_id=f"new{n}")
        n += 1
        page = rt.sessions_page(limit=5, after=page.after)
    assert sorted(seen) == sorted(before)


def test_a_page_says_it_is_the_last_exactly(walked: Runtime) -> None:
    rt = walked
    assert rt.sessions_page(limit=23).after is None
    first = rt.sessions_page(limit=22)
    assert first.after is not None
    last = rt.sessions_page(limit=22, after=first.after)
    assert (len(last.sessions), last.after) == (1, None)
    assert rt.sessions_page(limit=None).sessions == rt.sessions_page(limit=1000).sessions
    assert rt.sessions_page("nope", limit=5) == SessionPage([], None)


@pytest.mark.parametrize("bad", ["", "x", "not base64!", "W10", "WzEsMiwzXQ",
                                 paging.Keyset(float("nan"), "s").token(), "a" * 2000,
                                 3, b"abc", ["1", "s"]])
def test_a_cursor_no_page_gave_is_refused(db_url: str, bad: Any) -> None:
    s = Stores(db_url)
    try:
        with pytest.raises(InvalidArgument) as info:
            s.store.sessions_page(limit=5, after=bad)
        assert info.value.field == "after"
    finally:
        s.close()


def test_the_runtime_refuses_a_bad_cursor_or_limit(make_runtime: Callable[..., Runtime]
                                                   ) -> None:
    rt = make_runtime()
    for field, value in (("after", "garbage!"), ("after", 7), ("limit", 0), ("limit", -1),
                         ("limit", True), ("limit", "3")):
        with pytest.raises(ConfigError) as info:
            rt.sessions_page(**{field: value})
        assert info.value.field == field, (field, value)


def test_sessions_list_takes_a_cursor_it_printed(db_url: str) -> None:
    s = Stores(db_url)
    s.store.create_many([(f"s{i:03d}", None, f"t{i}", "cron") for i in range(7)], 0)
    s.close()
    out = io.StringIO()
    assert main(["sessions", "list", "--db", db_url, "--limit", "3"], out=out) == 0
    more = out.getvalue().splitlines()[-1]
    assert more.startswith("... more: --after ") and more.endswith(" lists the next 3")
    cursor = more.split()[3]
    second = cli_page(db_url, "--after", cursor)
    assert [i["id"] for i in second["items"]] == ["s003", "s002", "s001", "s000"]
    assert (second["more"], second["next_after"], second["next_offset"]) == (False, None,
                                                                            None)
    with pytest.raises(SystemExit) as usage:
        main(["sessions", "list", "--db", db_url, "--after", "nonsense!"])
    assert usage.value.code == 2
    with pytest.raises(SystemExit) as both:
        main(["sessions", "list", "--db", db_url, "--after", cursor, "--offset", "3"])
    assert both.value.code == 2
