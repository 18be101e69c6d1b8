"""Every paged read refuses a bound outside its contract (:mod:`kinbox.persistence.paging`)
at its public entry point, on both backends, before any SQL runs.

A store used to read ``limit=0`` as "no limit" and pass a negative one to SQLite, which
took it as no limit too; a number past 64 bits failed in the driver. Each entry point is
called with each bad value; the store answers :class:`InvalidArgument` naming the
argument, the runtime a :class:`ConfigError` naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kinbox.actors import ConfigError, ManualClock, Runtime
from kinbox.persistence import (
    CronJobRecord,
    CronStore,
    InvalidArgument,
    NewMessage,
    TaskStore,
    TurnEntry,
    paging,
)

from .conftest import Stores

HUGE = 10**30
"""Past any integer a database column holds (the driver used to fail on it)."""
PAST_MAX = paging.PAGE_NUMBER_MAX + 1
BAD_COUNTS = [0, -1, True, False, "3", 2.0, HUGE, PAST_MAX, -HUGE]
"""What a ``limit`` or a position (``before_seq``, ``last``) may not be."""
BAD_OFFSETS = [-1, True, "3", 2.0, HUGE, PAST_MAX, -HUGE]
"""What an ``offset`` may not be (0 is the first row)."""


@pytest.fixture
def world(stores: Stores, clock: ManualClock) -> Iterator[dict[str, Any]]:
    """Three sessions with a transcript, inbox rows, tasks and cron runs to page over."""
    store, journal = stores.store, stores.journal
    tasks, cron = TaskStore(stores.tables, stores.writer), CronStore(stores.tables,
                                                                      stores.writer)
    project = store.create_project("p1", "one", "One", clock.now())
    for i in range(3):
        store.create_session(f"s{i}", project.id, f"s {i}", "interactive", clock.now())
        store.append("s0", [TurnEntry("user", f"hi {i}", message_id=f"t{i}", kind="note")],
                     clock.now())
        journal.enqueue(NewMessage(f"m{i}", f"s{i}", "hello"), clock.now())
        tasks.create(f"task{i}", project.id, f"s{i}", "do", "pending", clock.now())
        cron.create(CronJobRecord(f"cj{i}", f"job {i}", "* * * * *", "UTC", "go", True,
                                  "announce", 0, clock.now() + i, None, None, None,
                                  clock.now(), clock.now()))
        run = {"id": f"run{i}", "job_id": f"cj{i}", "scheduled_for": clock.now(),
               "started_at": clock.now() + i, "status": "success", "owner": "o",
               "lease_until": clock.now(), "attempts": 1}
        stores.writer.call(lambda run=run: stores.tables.cron_run.insert(**run).execute())
    yield {"stores": stores, "tasks": tasks, "cron": cron}


READS: dict[str, tuple[Callable[[dict[str, Any], dict[str, Any]], Any], list[Any]]] = {
    "sessions.limit": (lambda w, kw: w["stores"].store.sessions(**kw), BAD_COUNTS),
    "sessions.offset": (lambda w, kw: w["stores"].store.sessions(**kw), BAD_OFFSETS),
    "transcript.last": (lambda w, kw: w["stores"].store.transcript("s0", **kw), BAD_COUNTS),
    "recent_message_ids.limit": (
        lambda w, kw: w["stores"].store.recent_message_ids("note", **{"limit": None, **kw}),
        BAD_COUNTS),
    "rows.limit": (lambda w, kw: w["stores"].journal.rows(**kw), BAD_COUNTS),
    "rows.offset": (lambda w, kw: w["stores"].journal.rows(**kw), BAD_OFFSETS),
    "rows.before_seq": (lambda w, kw: w["stores"].journal.rows(**kw), BAD_COUNTS),
    "for_project.limit": (lambda w, kw: w["tasks"].for_project("p1", **kw), BAD_COUNTS),
    "for_project.offset": (lambda w, kw: w["tasks"].for_project("p1", **kw), BAD_OFFSETS),
    "jobs.limit": (lambda w, kw: w["cron"].jobs(**kw), BAD_COUNTS),
    "jobs.offset": (lambda w, kw: w["cron"].jobs(**kw), BAD_OFFSETS),
    "runs.limit": (lambda w, kw: w["cron"].runs(**kw), BAD_COUNTS),
    "runs.offset": (lambda w, kw: w["cron"].runs(**kw), BAD_OFFSETS),
}
"""Each store read that pages, by ``method.argument``: how to call it, what it refuses."""


@pytest.mark.parametrize("name", list(READS))
def test_a_store_refuses_a_bound_outside_its_contract(world: dict[str, Any],
                                                     name: str) -> None:
    call, values = READS[name]
    field = name.split(".")[1]
    for bad in values:  # one database for the table: each call reads nothing
        with pytest.raises(InvalidArgument) as info:
            call(world, {field: bad})
        assert (info.value.field, info.value.value) == (field, bad)
        assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", list(READS))
def test_a_store_takes_every_bound_inside_its_contract(world: dict[str, Any],
                                                       name: str) -> None:
    """The edges pass, and mean what they say: 1 row, none past the largest offset, every
    row under the largest limit (the database takes the number)."""
    call, _ = READS[name]
    field = name.split(".")[1]
    every = call(world, {})
    assert len(every) == 3
    if field in ("offset",):
        assert call(world, {field: 0}) == every
        assert call(world, {field: paging.PAGE_NUMBER_MAX}) == []
        return
    if field == "before_seq":
        assert call(world, {field: paging.PAGE_NUMBER_MAX}) == every
        assert call(world, {field: 1}) == []
        return
    assert call(world, {field: paging.PAGE_NUMBER_MAX}) == every
    assert len(call(world, {field: 1})) == min(1, len(every))


@pytest.fixture
def rt(make_runtime: Callable[..., Runtime]) -> Runtime:
    runtime = make_runtime()
    s = runtime.create_session(None, "one")
    runtime.post(s.id, "hello")
    return runtime


RUNTIME_READS: dict[str, tuple[Callable[[Runtime, dict[str, Any]], Any], list[Any]]] = {
    "sessions.limit": (lambda rt, kw: rt.sessions(**kw), BAD_COUNTS),
    "sessions.offset": (lambda rt, kw: rt.sessions(**kw), BAD_OFFSETS),
    "inbox.limit": (lambda rt, kw: rt.inbox(**kw), BAD_COUNTS),
    "inbox.before_seq": (lambda rt, kw: rt.inbox(**kw), BAD_COUNTS),
    "cron.jobs.offset": (lambda rt, kw: rt.cron.jobs(**kw), BAD_OFFSETS),
    "cron.jobs_page.offset": (lambda rt, kw: rt.cron.jobs_page(1, **kw), BAD_OFFSETS),
    "cron.runs_page.offset": (lambda rt, kw: rt.cron.runs_page(**kw), BAD_OFFSETS),
}
"""The runtime's paged reads: the same rule, answered as a ConfigError."""


@pytest.mark.parametrize("name", list(RUNTIME_READS))
def test_the_runtime_refuses_a_bound_outside_the_stores_contract(rt: Runtime,
                                                                 name: str) -> None:
    call, values = RUNTIME_READS[name]
    field = name.rsplit(".", 1)[1]
    for bad in values:
        with pytest.raises(ConfigError) as info:
            call(rt, {field: bad})
        assert info.value.field == field, bad


def test_the_runtime_takes_the_largest_bounds(rt: Runtime) -> None:
    assert len(rt.sessions(limit=paging.PAGE_NUMBER_MAX)) == 1
    assert rt.sessions(limit=1, offset=paging.PAGE_NUMBER_MAX) == []
    assert len(rt.inbox(limit=paging.PAGE_NUMBER_MAX,
                        before_seq=paging.PAGE_NUMBER_MAX)) == 1
    assert rt.cron.jobs(offset=paging.PAGE_NUMBER_MAX) == []
