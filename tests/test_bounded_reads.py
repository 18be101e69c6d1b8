"""Bounded reads in the Python API: inbox rows, sessions and a project's tasks come in
pages, in a stable order with a unique tie-breaker, so pages neither repeat nor skip;
bad paging arguments are a ConfigError naming the field. On each backend."""

from __future__ import annotations

from typing import Any

import pytest

from kinbox.actors import ConfigError, ManualClock, Runtime
from kinbox.persistence import TurnEntry
from kinbox.persistence.tasks import TaskStore

from .conftest import Stores

pytestmark = pytest.mark.timeout(120)


def _inbox_pages(rt: Runtime, size: int, **filters: Any) -> list[list[dict[str, Any]]]:
    """Every page of ``rt.inbox``, newest page first, each page in journal order."""
    pages, before = [], None
    while True:
        page = rt.inbox(**filters, limit=size, before_seq=before)
        if not page:
            return pages
        pages.append(page)
        before = page[0]["seq"]


def test_inbox_pages_back_in_time_by_seq_neither_repeating_nor_skipping(
        any_db_url: str) -> None:
    with Runtime(db=any_db_url, clock=ManualClock(1000.0)) as rt:  # send-only: rows stay
        p = rt.create_project("p")
        a, b = rt.create_session(p.id, "a").id, rt.create_session(p.id, "b").id
        for i in range(23):
            rt.post(a if i % 3 else b, f"m{i}", message_id=f"m{i:02d}")
        every = rt.inbox()
        pages = _inbox_pages(rt, 5)
        assert [len(x) for x in pages] == [5, 5, 5, 5, 3]
        assert [r["message_id"] for page in reversed(pages) for r in page] == \
            [r["message_id"] for r in every]
        assert rt.inbox(limit=2) == every[-2:]  # the newest, in journal order
        of_a = [r["message_id"] for r in rt.inbox(target=a)]
        paged = [r["message_id"] for page in reversed(_inbox_pages(rt, 4, target=a))
                 for r in page]
        assert paged == of_a and len(of_a) == 15
        pending = _inbox_pages(rt, 6, state="pending", target=b)
        assert sum(len(x) for x in pending) == 8
        assert rt.inbox(before_seq=every[3]["seq"]) == every[:3]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"limit": 0}, "limit"), ({"limit": -1}, "limit"), ({"limit": True}, "limit"),
    ({"limit": "5"}, "limit"), ({"limit": 2.5}, "limit"), ({"before_seq": 0}, "before_seq"),
    ({"before_seq": "9"}, "before_seq"), ({"before_seq": False}, "before_seq")])
def test_bad_inbox_paging_arguments_name_their_field(tmp_path: Any, kwargs: dict[str, Any],
                                                     field: str) -> None:
    with Runtime(db=f"sqlite:///{tmp_path / 'k.db'}") as rt:
        with pytest.raises(ConfigError) as err:
            rt.inbox(**kwargs)
        assert err.value.field == field


def test_transcript_pages_back_in_time_by_entry_id_neither_repeating_nor_skipping(
        any_db_url: str) -> None:
    """``rt.transcript`` read a session's whole transcript into memory, however long: a
    session of years read as one list. With ``limit`` it reads the newest entries (still
    oldest first), and ``before_id`` keeps those older than that entry's id: the page
    before, through the transcript's index. Another session's entries are not paged in."""
    with Runtime(db=any_db_url, clock=ManualClock(1000.0)) as rt:
        p = rt.create_project("p")
        a, b = rt.create_session(p.id, "a").id, rt.create_session(p.id, "b").id
        store = rt.context.store
        for i in range(23):
            store.append(a if i % 3 else b, [TurnEntry("user", f"e{i}")], 1000.0)
        every = rt.transcript(a)
        assert len(every) == 15
        pages, before = [], None
        while page := rt.transcript(a, limit=4, before_id=before):
            pages.append(page)
            before = page[0].id
        assert [len(x) for x in pages] == [4, 4, 4, 3]
        assert [e for page in reversed(pages) for e in page] == every
        assert rt.transcript(a, limit=2) == every[-2:]
        assert rt.transcript(a, before_id=every[3].id) == every[:3]
        assert rt.transcript("no-such-session", limit=3) == []


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"limit": 0}, "limit"), ({"limit": -1}, "limit"), ({"limit": True}, "limit"),
    ({"limit": "5"}, "limit"), ({"before_id": 0}, "before_id"),
    ({"before_id": "9"}, "before_id"), ({"before_id": 2**63}, "before_id")])
def test_bad_transcript_paging_arguments_name_their_field(
        tmp_path: Any, kwargs: dict[str, Any], field: str) -> None:
    with Runtime(db=f"sqlite:///{tmp_path / 'k.db'}") as rt:
        sid = rt.create_session(rt.create_project("p").id, "s").id
        with pytest.raises(ConfigError) as err:
            rt.transcript(sid, **kwargs)
        assert err.value.field == field


def test_sessions_page_by_offset_with_ties_broken_by_id(any_db_url: str) -> None:
    with Runtime(db=any_db_url, clock=ManualClock(1000.0)) as rt:  # one time: all tie
        p, q = rt.create_project("p"), rt.create_project("q")
        for i in range(11):
            rt.create_session(p.id if i % 4 else q.id, f"s{i}")
        every = [s.id for s in rt.sessions()]
        pages = [[s.id for s in rt.sessions(limit=4, offset=k)] for k in range(0, 16, 4)]
        assert [len(x) for x in pages] == [4, 4, 3, 0]
        assert [sid for page in pages for sid in page] == every
        assert every == sorted(every)  # the tie-breaker
        assert [s.id for s in rt.sessions(p.id, limit=3, offset=6)] == \
            [s.id for s in rt.sessions(p.id)][6:9]
        for bad in ({"limit": 0}, {"limit": "3"}, {"offset": -1}, {"offset": True}):
            with pytest.raises(ConfigError) as err:
                rt.sessions(**bad)
            assert err.value.field == next(iter(bad))


def test_a_projects_tasks_come_in_pages_and_by_status(stores: Stores) -> None:
    tasks = TaskStore(stores.tables, stores.writer)
    for i in range(9):  # the same time for all: ties broken by id
        tasks.create(f"t{i}", "p1", f"chat-{i % 2}", f"task {i}",
                     "done" if i % 3 == 0 else "pending", 5.0)
    tasks.create("other", "p2", "chat-x", "elsewhere", "pending", 5.0)
    every = [t.id for t in tasks.for_project("p1")]
    assert every == [f"t{i}" for i in range(9)]
    pages = [[t.id for t in tasks.for_project("p1", limit=4, offset=k)] for k in (0, 4, 8)]
    assert pages == [every[:4], every[4:8], every[8:]]
    open_ = [t.id for t in tasks.for_project("p1", statuses=("pending",))]
    assert open_ == ["t1", "t2", "t4", "t5", "t7", "t8"]
