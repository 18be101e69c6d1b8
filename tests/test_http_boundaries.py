"""The HTTP API's answers at its edges, over a real uvicorn server on 127.0.0.1 and a real
SQLite file: odd input is a 422 naming what is wrong (never a 500), listings are bounded,
and a runtime that stopped answers 503 on every route, reads included."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from kinbox.actors import ConfigError, Runtime
from kinbox.actors.serve import app_for

from .helpers import quiet_brain
from .test_cron_social_http import STATE, post
from .test_http import Served

MakeRuntime = Callable[..., Runtime]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def served(make_runtime: MakeRuntime, tmp_path: Path) -> Iterator[tuple[Served, Runtime]]:
    rt = make_runtime(brain=quiet_brain, data_dir=tmp_path / "data")
    srv = Served(app_for(rt))
    yield srv, rt
    srv.close()


@pytest.mark.parametrize("cron", ["* * * * \u00b2", "0 9 * * 1-\u00b3", "* * * * \u0663",
                                  "* * * * mondo", "* * * * */" + "9" * 5000])
def test_a_weekday_field_crontab_does_not_know_is_a_422(served: tuple[Served, Runtime],
                                                        cron: str) -> None:
    """Other scripts' digits (``int`` reads an Arabic-Indic three and refuses a superscript
    two), a name that only starts like a day, a step of thousands of digits."""
    srv, rt = served
    body = json.dumps({"name": "digest", "cron": cron, "prompt": "sum up"}).encode()
    status, got = post(srv, "/cron/jobs", body, STATE)
    assert (status, got["error"]) == (422, "invalid_argument"), got
    with pytest.raises(ConfigError):
        rt.cron.add("digest", cron, "sum up")
    assert rt.cron.jobs() == []


@pytest.mark.parametrize("query", ["limit=" + "9" * 5000, "limit=0", "limit=501",
                                   "limit=%D9%A3", "limit=-1"])
def test_a_limit_that_is_not_1_to_500_is_a_422(served: tuple[Served, Runtime],
                                               query: str) -> None:
    srv, _ = served
    for path in ("/cron/runs", "/cron/jobs"):
        status, got = srv.request("GET", f"{path}?{query}")
        assert (status, got["error"]) == (422, "invalid_argument"), (path, got)


def test_the_job_listing_is_bounded_and_pages_with_an_offset(
        served: tuple[Served, Runtime]) -> None:
    srv, rt = served
    made = [rt.cron.add(f"job {i}", f"{i % 60} 9 * * *", "p")["job_id"] for i in range(510)]
    status, headers, first = srv.exchange("GET", "/cron/jobs")
    assert status == 200 and len(first) == 500  # the most one answer holds
    assert headers["x-kinbox-next-offset"] == "500"  # and it says it is not the last
    status, headers, page = srv.exchange("GET", "/cron/jobs?limit=10&offset=500")
    assert status == 200 and "x-kinbox-next-offset" not in headers
    assert [j["job_id"] for j in first + page] == [j["job_id"] for j in rt.cron.jobs()]
    assert sorted(j["job_id"] for j in first + page) == sorted(made)
    assert rt.cron.jobs(limit=3, offset=2) == rt.cron.jobs()[2:5]
    status, got = srv.request("GET", "/cron/jobs?offset=" + "9" * 20)
    assert (status, got["error"]) == (422, "invalid_argument")


def test_the_run_listings_say_when_older_runs_follow(served: tuple[Served, Runtime]) -> None:
    """``GET /cron/runs`` answered at most ``limit`` runs (50 by default) and never said
    that older ones were left out, nor how to read them."""
    srv, rt = served
    job = rt.cron.add("job", "0 9 * * *", "p")["job_id"]
    r = rt.cron.store.t.cron_run
    rt.cron.store.writer.call(lambda: r.insert_many([
        {"id": f"r{i:02d}", "job_id": job, "scheduled_for": i, "started_at": i,
         "finished_at": i, "status": "success", "result": "ok", "error": None,
         "owner": None, "lease_until": None, "attempts": 1} for i in range(5)]).execute())
    for path in ("/cron/runs", f"/cron/jobs/{job}/runs"):
        status, headers, newest = srv.exchange("GET", f"{path}?limit=3")
        assert status == 200 and [x["run_id"] for x in newest] == ["r04", "r03", "r02"]
        assert headers["x-kinbox-next-offset"] == "3"
        status, headers, older = srv.exchange("GET", f"{path}?limit=3&offset=3")
        assert status == 200 and [x["run_id"] for x in older] == ["r01", "r00"]
        assert "x-kinbox-next-offset" not in headers
        status, got = srv.request("GET", f"{path}?offset=-1")
        assert (status, got["error"]) == (422, "invalid_argument")


def test_every_route_of_a_stopped_runtime_answers_503(served: tuple[Served, Runtime]) -> None:
    """The README's promise to an app that mounts kinbox and keeps serving: reads from the
    database or from the runtime's memory included, and a write that would succeed on an
    in-memory count."""
    srv, rt = served
    rt.stop()
    for method, path in (("GET", "/cron/jobs"), ("GET", "/cron/runs"),
                         ("GET", "/cron/jobs/cj_x"), ("GET", "/focal/notifications"),
                         ("POST", "/focal/notifications/read"), ("DELETE", "/focal/wakeups/x"),
                         ("POST", "/cron/announcements/drain"), ("GET", "/focal")):
        status, got = srv.request(method, path, STATE)
        assert (method, path, status, got["error"]) == (method, path, 503, "unavailable"), got


LONG = "x" * 3000


@pytest.mark.parametrize(("method", "path", "body", "headers", "named"), [
    ("POST", "/cron/jobs", json.dumps({"name": "a", "cron": "0 9 * * *", "prompt": "p",
                                       "timezone": LONG}), STATE, "timezone"),
    ("POST", "/cron/jobs", json.dumps({"name": "a", "cron": [LONG], "prompt": "p"}), STATE,
     "cron"),
    ("POST", "/cron/jobs", json.dumps({"name": "a", "cron": "0 9 * * " + "x" * 500,
                                       "prompt": "p"}), STATE, "cron"),
    ("POST", "/cron/jobs", json.dumps({"name": "a", "cron": "0 9 * * *", "prompt": "p",
                                       LONG: 1}), STATE, "unknown fields"),
    ("GET", f"/cron/jobs/{LONG}", None, {}, "no cron job"),
    ("POST", f"/cron/jobs/{LONG}/pause", None, STATE, "no cron job"),
    ("DELETE", f"/focal/wakeups/{LONG}", None, STATE, "no Focal wake-up"),
    ("POST", f"/social/{LONG}/events", None, {}, "no webhook"),
    ("GET", f"/{LONG}", None, {}, "no route"),
    ("GET", "/", None, {"Host": LONG}, "Host"),
    ("X" * 3000, "/", None, {}, "is not allowed here"),
])
def test_an_error_quotes_a_runaway_value_cut_short(
        served: tuple[Served, Runtime], method: str, path: str, body: str | None,
        headers: dict[str, str], named: str) -> None:
    """The message names what is wrong and quotes at most 80 characters of it: a 3,000
    character time zone, job id, path or Host came back whole (a 200,000 character
    unknown field name too, up to the body's cap)."""
    srv, rt = served
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    conn.request(method, path, body=body.encode() if body else None, headers=headers)
    resp = conn.getresponse()
    got = json.loads(resp.read())
    conn.close()
    assert 400 <= resp.status < 500 and named in got["message"], got
    assert len(got["message"]) <= 400 and "x" * 100 not in got["message"], got["message"]
    assert rt.cron.jobs() == []


@pytest.mark.parametrize("path", ["/cron/jobs/", "/focal/", "/healthz/", "/cron/runs/",
                                  "/social/slack/events/", "/cron/jobs/cj_1/runs/"])
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_a_path_with_a_trailing_slash_is_a_json_404_not_a_redirect(
        served: tuple[Served, Runtime], path: str, method: str) -> None:
    """Starlette's router answered these with a bodiless 307 to the path without the
    slash, before any route's rule (a POST without ``X-Kinbox: 1`` was redirected, not
    refused): the one answer of the API that was not JSON."""
    srv, _ = served
    status, headers, got = srv.exchange(method, path, STATE)
    assert (status, got["error"]) == (404, "not_found"), (status, got)
    assert got["message"] == f"no route {path}" and "location" not in headers


@pytest.mark.parametrize("path", ["/nope", "/focal", "/cron/jobs", "/peers/linkx",
                                  "/peers/link/", "/" + "p" * 3000])
def test_an_upgrade_to_a_path_that_is_no_websocket_route_is_a_json_404(
        served: tuple[Served, Runtime], path: str) -> None:
    """Starlette's router closed it before accepting, which the server answered 403 with
    no body: a peer dialling a wrong address heard "forbidden", not "no such endpoint"."""
    srv, _ = served
    with pytest.raises(InvalidStatus) as info, connect(
            f"ws://127.0.0.1:{srv.port}{path}", proxy=None, open_timeout=5):
        pass
    response = info.value.response
    got = json.loads(response.body)
    assert (response.status_code, got["error"]) == (404, "not_found"), got
    assert got["message"].startswith("no websocket route /") and len(got["message"]) <= 400


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
@pytest.mark.parametrize("path", ["/peers/link", "/peers/pair"])
def test_a_plain_request_to_a_websocket_endpoint_is_told_to_upgrade(
        served: tuple[Served, Runtime], method: str, path: str) -> None:
    """It was a 404 "no route /peers/link": someone checking a peer's address with curl
    heard that the endpoint does not exist."""
    srv, _ = served
    status, headers, got = srv.exchange(method, path, STATE)
    assert (status, got["error"]) == (426, "upgrade_required"), (status, got)
    assert headers["upgrade"] == "websocket" and path in got["message"]


@pytest.mark.parametrize(("path", "query", "named"), [
    ("/cron/runs", "job=cj_1", "'job'"),  # the filter is the path: it read as filtered
    ("/cron/jobs", "limti=5", "'limti'"),
    ("/focal", "x=1", "'x'"),
    ("/", "a=1", "'a'"),
    ("/cron/runs", "limit=1&limit=500", "given more than once"),
])
def test_a_query_parameter_a_route_does_not_take_is_a_422_naming_it(
        served: tuple[Served, Runtime], path: str, query: str, named: str) -> None:
    """Starlette hands a route its whole query string, and a route read only the names it
    knows: ``/cron/runs?job=...`` answered every job's runs as if filtered."""
    srv, _ = served
    status, got = srv.request("GET", f"{path}?{query}")
    assert (status, got["error"]) == (422, "invalid_argument"), got
    assert named in got["message"]
    assert srv.request("GET", f"{path}?limit=1" if "cron" in path else path)[0] == 200


@pytest.mark.parametrize(("query", "field"), [
    ("limit=0", "limit"), ("limit=x", "limit"), ("limit=1&offset=-1", "offset"),
    ("offset=" + "9" * 20, "offset"), ("limit=1&limit=2", "limit"),
    ("offset=1&offset=1", "offset"),
])
def test_a_bad_page_parameter_is_a_422_whose_field_names_it(
        served: tuple[Served, Runtime], query: str, field: str) -> None:
    """A client decides on ``field``, never on the message: a bad ``limit`` or ``offset``
    (or one given twice) was a 422 with no ``field``, one message for either."""
    srv, rt = served
    job = rt.cron.add("digest", "0 9 * * 1", "sum up")["job_id"]
    for path in ("/cron/jobs", "/cron/runs", f"/cron/jobs/{job}/runs"):
        status, got = srv.request("GET", f"{path}?{query}")
        assert (status, got["error"], got.get("field")) == (422, "invalid_argument", field), (
            path, got)


@pytest.mark.parametrize("body", [b'{"at": 1900000000}', b"now", b"[]",
                                  b"x" * 100_000])
def test_a_body_sent_to_a_call_that_takes_none_is_a_422_and_nothing_is_done(
        served: tuple[Served, Runtime], body: bytes) -> None:
    """A trigger with a body (``{"at": ...}``, as if it scheduled one) ran the job now,
    the body dropped unread."""
    srv, rt = served
    job_id = str(rt.cron.add("digest", "0 9 * * 1", "sum up")["job_id"])
    before = rt.cron.job(job_id)
    for verb in ("trigger", "pause"):
        status, got = post(srv, f"/cron/jobs/{job_id}/{verb}", body, STATE)
        assert (status, got["error"]) == (422, "invalid_argument"), got
        assert "takes no body" in got["message"]
    assert rt.cron.job(job_id) == before
    # None, or an empty JSON object (some clients' default), is no body.
    assert post(srv, f"/cron/jobs/{job_id}/pause", b" {} ", STATE)[0] == 200
    assert post(srv, f"/cron/jobs/{job_id}/resume", b"", STATE)[0] == 200


def test_the_health_probe_answers_whatever_its_query_string(
        served: tuple[Served, Runtime]) -> None:
    """``/healthz`` is for probes (a load balancer's, Kubernetes', an uptime monitor's),
    which may add a query string of their own (``?probe=lb``, a cache-buster): refused
    with a 422, a fit runtime read as down, and an orchestrator restarted it."""
    srv, _ = served
    status, got = srv.request("GET", "/healthz?probe=lb&_=1765000000")
    assert (status, got.get("healthy")) == (200, True), got


def test_the_cron_routes_mounted_on_their_own_refuse_a_stray_parameter_or_body_with_a_422(
        ) -> None:
    """``kinbox.transport.cron_routes`` is mounted in a product's own Starlette app too (as
    the social routes are), and each route answers its refusals itself. The query and
    body checks raised theirs out of the route, to the handler only ``create_app``
    installs: in another app, ``?limti=5`` or a body on a trigger was a 500 and a
    traceback, not the 422 naming it."""
    from typing import Any

    from starlette.applications import Starlette

    from kinbox.transport import cron_routes

    acted: list[tuple[str, str]] = []

    class Backend:
        def jobs(self, limit: int, offset: int) -> tuple[list[dict[str, Any]], bool]:
            return [], False

        def act(self, action: str, job_id: str) -> dict[str, Any]:
            acted.append((action, job_id))
            return {"job_id": job_id}

    srv = Served(Starlette(routes=cron_routes(Backend(), lambda request: None)))  # type: ignore[arg-type]
    try:
        status, got = srv.request("GET", "/cron/jobs?limti=5")
        assert isinstance(got, dict) and (status, got["error"]) == (422, "invalid_argument"), (
            status, got)
        assert "'limti'" in got["message"]
        status, got = post(srv, "/cron/jobs/cj_1/trigger", b'{"at": 1900000000}', STATE)
        assert (status, got["error"]) == (422, "invalid_argument"), got
        assert acted == []
        assert srv.request("GET", "/cron/jobs?limit=5")[0] == 200
    finally:
        srv.close()
