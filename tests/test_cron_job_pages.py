"""Walking the cron jobs page by page while they fire: each job listed once.

``GET /cron/jobs`` (``rt.cron.jobs_page``, ``kinbox cron list``) pages by ``offset`` in
due order, soonest first: a job that fires between two pages moves to its next due time,
later in that order, and every job behind it moves up a place, so the next page skipped
one job and a later one showed the fired job again. A walk by the cursor, ``after`` (a
job id; the empty one starts the walk), goes in id order, which firing, pausing or
triggering never changes: a page that is not the last names the next page's cursor
(``X-Kinbox-Next-After``, the JSON's ``next_after``, ``--after`` of ``kinbox cron list``).
``offset`` still works (its pages shift), and the two together are a 422 naming ``after``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors import cron_rules as rules
from kinbox.actors.cli import main
from kinbox.actors.serve import app_for

from .test_cron_run_pages import get
from .test_http import Served

MakeRuntime = Callable[..., Runtime]
MINUTE = 60.0
NEXT_AFTER = "X-Kinbox-Next-After"


def brain(turn: Turn) -> str:
    return "ok"


def hourly_jobs(rt: Runtime, clock: ManualClock, count: int) -> list[str]:
    """``count`` hourly jobs due one a minute from the next minute on (the first fires at
    the first minute the clock moves on, and goes last in due order)."""
    minute = int(clock.now() // MINUTE % 60)
    return [str(rt.cron.add(f"job {i}", f"{(minute + 1 + i) % 60} * * * *", "tick")["job_id"])
            for i in range(count)]


def one_fires(rt: Runtime, clock: ManualClock) -> None:
    clock.advance(MINUTE)
    rt.run_until_idle()
    assert rt.cron.wait_idle(30)


def due_order(rt: Runtime) -> list[str]:
    return [str(j["job_id"]) for j in rt.cron.jobs()]


@pytest.mark.timeout(120)
def test_a_walk_by_the_cursor_lists_each_job_once_while_jobs_fire(
        make_runtime: MakeRuntime, clock: ManualClock, tmp_path: Path) -> None:
    rt = make_runtime(brain=brain, data_dir=tmp_path / "data")
    ids = hourly_jobs(rt, clock, 5)
    before = due_order(rt)
    srv = Served(app_for(rt))
    try:
        seen: list[str] = []
        path = "/cron/jobs?limit=2&after="
        while True:
            status, page, headers = get(srv, path)
            assert status == 200, page
            seen += [j["job_id"] for j in page]
            one_fires(rt, clock)  # a job fires between two pages, and moves
            cursor = headers.get(NEXT_AFTER)
            if cursor is None:
                assert "X-Kinbox-Next-Offset" not in headers
                break
            path = f"/cron/jobs?limit=2&after={cursor}"
        assert due_order(rt) != before  # the jobs did move in the listing's order
        assert seen == sorted(ids)  # each job once, in id order
        status, got, headers = get(srv, "/cron/jobs?limit=2")  # offset pages as before
        assert (status, headers.get("X-Kinbox-Next-Offset")) == (200, "2")
        assert NEXT_AFTER not in headers  # a cursor of id order names no due-order page
        assert [j["job_id"] for j in got] == due_order(rt)[:2]
        status, got, _ = get(srv, "/cron/jobs?offset=2&after=")
        assert (status, got.get("field")) == (422, "after"), got
        status, got, _ = get(srv, "/cron/jobs?after=" + "x" * 200)
        assert (status, got.get("field")) == (422, "after"), got
    finally:
        srv.close()


@pytest.mark.timeout(120)
def test_jobs_page_takes_the_cursor_of_the_page_before(
        make_runtime: MakeRuntime, clock: ManualClock, any_db_url: str) -> None:
    rt = make_runtime(brain=brain, db=any_db_url)
    ids = sorted(hourly_jobs(rt, clock, 3))
    first, more = rt.cron.jobs_page(2, after="")
    assert more and first.after == ids[1]
    assert [j["job_id"] for j in first] == ids[:2]
    one_fires(rt, clock)
    rest, more = rt.cron.jobs_page(2, after=first.after)
    assert not more and rest.after is None
    assert [j["job_id"] for j in rest] == ids[2:]
    by_offset, more = rt.cron.jobs_page(2)
    assert more and by_offset.after is None  # due order: no cursor
    with pytest.raises(rules.InvalidCronJob) as refused:
        rt.cron.jobs_page(2, offset=1, after=first.after)
    assert refused.value.field == "after"
    for forged in ("x" * 200, "cj\x00", "\ud800"):
        with pytest.raises(rules.InvalidCronJob) as refused:
            rt.cron.jobs_page(2, after=forged)
        assert refused.value.field == "after"


@pytest.mark.timeout(120)
def test_cron_list_names_its_cursor(make_runtime: MakeRuntime, clock: ManualClock,
                                    db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rt = make_runtime(brain=brain)
    ids = sorted(hourly_jobs(rt, clock, 3))
    assert main(["cron", "list", "--db", db_url, "--limit", "2", "--json", "--after", ""]) == 0
    page = json.loads(capsys.readouterr().out)
    assert (page["more"], page["next_after"], page["next_offset"]) == (True, ids[1], None)
    one_fires(rt, clock)
    assert main(["cron", "list", "--db", db_url, "--limit", "2", "--json",
                 "--after", page["next_after"]]) == 0
    rest = json.loads(capsys.readouterr().out)
    assert [j["job_id"] for j in [*page["items"], *rest["items"]]] == ids
    assert (rest["more"], rest["next_after"], rest["next_offset"]) == (False, None, None)
    assert main(["cron", "list", "--db", db_url, "--limit", "2", "--after", ""]) == 0
    assert f"... more: --after {ids[1]} " in capsys.readouterr().out
    with pytest.raises(SystemExit) as usage:
        main(["cron", "list", "--db", db_url, "--after", "x" * 200])
    assert usage.value.code == 2
