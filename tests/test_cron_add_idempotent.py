"""Adding a cron job with an idempotency key: a retry after a lost answer adds no second job.

``POST /cron/jobs`` had no way to say "the same request again": a client whose answer
was lost (a timeout, a dropped connection, a 504) and that retried added a second job,
and every run of the schedule then ran twice. A request with an ``Idempotency-Key``
header (``rt.cron.add(..., idempotency_key=)``) adds the job once: a repeat with the same
key and the same job answers that job (201, nothing written), one with the same key and
another job is refused (409, :class:`CronJobConflict`), and a key that is not 1 to 128
printable ASCII characters is a 422 naming ``idempotency_key``.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import KinboxError, Runtime
from kinbox.actors import cron_rules as rules
from kinbox.actors.serve import app_for

from .test_http import Served

MakeRuntime = Callable[..., Runtime]
STATE = {"X-Kinbox": "1", "Content-Type": "application/json"}
JOB = {"name": "digest", "cron": "0 9 * * 1-5", "prompt": "Summarize the night",
       "timezone": "Europe/Paris"}


def post(srv: Served, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{srv.port}/cron/jobs",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={**STATE, **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.timeout(60)
def test_a_repeat_with_the_same_key_answers_the_job_it_added(
        make_runtime: MakeRuntime, any_db_url: str) -> None:
    rt = make_runtime(db=any_db_url)
    first = rt.cron.add("digest", "0 9 * * 1-5", "Summarize", idempotency_key="k-1")
    again = rt.cron.add("digest", " 0 9 * * 1-5 ", "Summarize ", idempotency_key="k-1")
    assert again["job_id"] == first["job_id"]
    other = rt.cron.add("digest", "0 9 * * 1-5", "Summarize", idempotency_key="k" * 128)
    plain = rt.cron.add("digest", "0 9 * * 1-5", "Summarize")
    assert len({first["job_id"], other["job_id"], plain["job_id"]}) == 3
    assert len(rt.cron.jobs()) == 3
    with pytest.raises(rules.CronJobConflict) as refused:
        rt.cron.add("digest", "0 10 * * 1-5", "Summarize", idempotency_key="k-1")
    assert isinstance(refused.value, KinboxError)
    assert (refused.value.job_id, refused.value.fields) == (first["job_id"], ("cron",))
    assert len(rt.cron.jobs()) == 3


@pytest.mark.timeout(60)
def test_concurrent_adds_with_one_key_add_one_job(
        make_runtime: MakeRuntime, any_db_url: str) -> None:
    rt = make_runtime(db=any_db_url)
    start = threading.Barrier(4)
    ids: list[str] = []

    def add() -> None:
        start.wait(10)
        ids.append(rt.cron.add("digest", "0 9 * * *", "Summarize",
                               idempotency_key="once")["job_id"])
    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(ids) == 4 and len(set(ids)) == 1
    assert [j["job_id"] for j in rt.cron.jobs()] == ids[:1]


@pytest.mark.timeout(60)
def test_the_route_takes_an_idempotency_key_header(make_runtime: MakeRuntime,
                                                   tmp_path: Path) -> None:
    rt = make_runtime(data_dir=tmp_path / "data")
    srv = Served(app_for(rt))
    try:
        status, first = post(srv, JOB, {"Idempotency-Key": "req-7f3a"})
        assert status == 201
        status, again = post(srv, JOB, {"Idempotency-Key": "req-7f3a"})  # the lost answer
        assert (status, again["job_id"]) == (201, first["job_id"])
        status, got = post(srv, {**JOB, "prompt": "Something else"},
                           {"Idempotency-Key": "req-7f3a"})
        assert (status, got["error"]) == (409, "conflict"), got
        for bad in ("", "x" * 129, "caf\u00e9"):
            status, got = post(srv, JOB, {"Idempotency-Key": bad})
            assert (status, got.get("field")) == (422, "idempotency_key"), (bad, got)
        assert [j["job_id"] for j in rt.cron.jobs()] == [first["job_id"]]
    finally:
        srv.close()


def test_the_longest_key_the_rules_take_is_as_wide_as_its_column() -> None:
    from kinbox.persistence import IDEMPOTENCY_KEY_CHARS

    assert rules.IDEMPOTENCY_KEY_LIMIT == IDEMPOTENCY_KEY_CHARS
    assert rules.check_idempotency_key("k" * IDEMPOTENCY_KEY_CHARS) == "k" * 128
    for bad in ("", "k" * 129, "tab\there", "caf\u00e9", 7, b"bytes"):
        with pytest.raises(rules.InvalidCronJob) as refused:
            rules.check_idempotency_key(bad)
        assert refused.value.field == "idempotency_key"
