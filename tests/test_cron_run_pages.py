"""Walking a job's runs page by page while its runs go on: each run listed once.

``GET /cron/jobs/{id}/runs`` (``rt.cron.runs_page``, ``kinbox cron runs``) paged by
``offset``, counted from the newest run: each run recorded between two pages pushed
every older one down a place, and the next page began with the last run of the page
before (a run that finished meanwhile, pruned, moved the rest up and one was never
shown). A page that is not the last names a cursor now (``X-Kinbox-Next-Before``, the
JSON's ``next_before``, ``--before`` of ``kinbox cron runs``): the runs older than its
last one, however many were recorded since. ``offset`` still works (its pages shift), and
the two together are a 422 naming ``before``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors import cron_rules as rules
from kinbox.actors.cli import main
from kinbox.actors.serve import app_for

from .test_http import Served

MakeRuntime = Callable[..., Runtime]
MINUTE = 60.0
NEXT_BEFORE = "X-Kinbox-Next-Before"


def brain(turn: Turn) -> str:
    return "ok"


def get(srv: Served, path: str) -> tuple[int, Any, Any]:
    """The status, the JSON body and the headers (read in any case)."""
    req = urllib.request.Request(f"http://127.0.0.1:{srv.port}{path}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read()), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), exc.headers


def one_more_run(rt: Runtime, clock: ManualClock) -> None:
    clock.advance(MINUTE)
    rt.run_until_idle()
    assert rt.cron.wait_idle(30)


@pytest.mark.timeout(120)
def test_a_walk_by_the_cursor_lists_each_run_once_while_runs_are_added(
        make_runtime: MakeRuntime, clock: ManualClock, tmp_path: Path) -> None:
    rt = make_runtime(brain=brain, data_dir=tmp_path / "data")
    job_id = str(rt.cron.add("tick", "* * * * *", "tick")["job_id"])
    for _ in range(5):
        one_more_run(rt, clock)
    before_walk = [r["run_id"] for r in rt.cron.runs(job_id, limit=500)]
    assert len(before_walk) == 5
    srv = Served(app_for(rt))
    try:
        seen: list[str] = []
        path = f"/cron/jobs/{job_id}/runs?limit=2"
        while True:
            status, page, headers = get(srv, path)
            assert status == 200, page
            seen += [r["run_id"] for r in page]
            one_more_run(rt, clock)  # a run recorded between two pages
            cursor = headers.get(NEXT_BEFORE)
            if cursor is None:
                assert "X-Kinbox-Next-Offset" not in headers
                break
            path = f"/cron/jobs/{job_id}/runs?limit=2&before={cursor}"
        assert seen == before_walk  # each run once, newest first, none of the later ones
        status, got, _ = get(srv, f"/cron/jobs/{job_id}/runs?offset=2&before={cursor or 'x'}")
        assert (status, got.get("field")) == (422, "before"), got
        status, got, _ = get(srv, "/cron/runs?before=not-a-cursor")
        assert (status, got.get("field")) == (422, "before"), got
    finally:
        srv.close()


@pytest.mark.timeout(120)
def test_runs_page_takes_the_cursor_of_the_page_before(
        make_runtime: MakeRuntime, clock: ManualClock, any_db_url: str) -> None:
    rt = make_runtime(brain=brain, db=any_db_url)
    job_id = str(rt.cron.add("tick", "* * * * *", "tick")["job_id"])
    for _ in range(3):
        one_more_run(rt, clock)
    everything = [r["run_id"] for r in rt.cron.runs(job_id)]
    first, more = rt.cron.runs_page(job_id, 2)
    assert more and first.before is not None
    one_more_run(rt, clock)
    rest, more = rt.cron.runs_page(job_id, 2, before=first.before)
    assert not more and rest.before is None
    assert [r["run_id"] for r in [*first, *rest]] == everything
    all_jobs, _ = rt.cron.runs_page(None, 2, before=first.before)  # every job's runs too
    assert [r["run_id"] for r in all_jobs] == everything[2:]
    with pytest.raises(rules.InvalidCronJob) as refused:
        rt.cron.runs_page(job_id, 2, offset=1, before=first.before)
    assert refused.value.field == "before"


@pytest.mark.timeout(120)
def test_cron_runs_names_its_cursor(make_runtime: MakeRuntime, clock: ManualClock,
                                    db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rt = make_runtime(brain=brain)
    job_id = str(rt.cron.add("tick", "* * * * *", "tick")["job_id"])
    for _ in range(3):
        one_more_run(rt, clock)
    everything = [r["run_id"] for r in rt.cron.runs(job_id)]
    assert main(["cron", "runs", job_id, "--db", db_url, "--limit", "2", "--json"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert page["more"] and page["next_before"]
    one_more_run(rt, clock)
    assert main(["cron", "runs", job_id, "--db", db_url, "--limit", "2", "--json",
                 "--before", page["next_before"]]) == 0
    rest = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in [*page["items"], *rest["items"]]] == everything
    assert (rest["more"], rest["next_before"], rest["next_offset"]) == (False, None, None)
    assert main(["cron", "runs", job_id, "--db", db_url, "--limit", "2"]) == 0
    assert "... more: --before " in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_a_forged_cursor_is_refused_naming_before(make_runtime: MakeRuntime, any_db_url: str,
                                                  db_url: str) -> None:
    import base64

    def token(text: str) -> str:
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    rt = make_runtime(db=any_db_url)
    for forged in (token("[" + "9" * 400 + ',"r"]'), token('[1.0,"r\\u0000x"]'), "x" * 2000,
                   token('[1.0,"' + "r" * 129 + '"]')):
        with pytest.raises(rules.InvalidCronJob) as refused:
            rt.cron.runs_page(None, 5, before=forged)
        assert refused.value.field == "before"
        with pytest.raises(SystemExit) as usage:
            main(["cron", "runs", "--db", db_url, "--before", forged])
        assert usage.value.code == 2
