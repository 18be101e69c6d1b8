"""The cron routes and the signed social webhook on a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors import social_rules as rules
from kinbox.actors.serve import app_for
from kinbox.persistence.driver_errors import OperationalError
from kinbox.transport import BackendRefused, SignatureProblem, SignatureRejected, json_body
from kinbox.transport import webhook_signature as sig

from .helpers import failing_once
from .test_http import Served

MakeRuntime = Callable[..., Runtime]
SECRET = b"s3cret-for-slack"
STATE = {"X-Kinbox": "1", "Content-Type": "application/json"}


def brain(turn: Turn) -> str:
    return "ok: " + turn.messages[0].content.splitlines()[-1]


@pytest.fixture
def served(make_runtime: MakeRuntime, tmp_path: Path
           ) -> Iterator[tuple[Served, Runtime, list[tuple[Any, str]]]]:
    rt = make_runtime(brain=brain, data_dir=tmp_path / "data")
    sent: list[tuple[Any, str]] = []
    rt.social.register_channel("slack", send=lambda route, text: sent.append((route, text)),
                               secret=SECRET)
    rt.social.allow("slack", ["U1"])
    srv = Served(app_for(rt))
    yield srv, rt, sent
    srv.close()


def post(srv: Served, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{srv.port}{path}", data=body,
                                 method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def signed(body: bytes, ts: float, secret: bytes = SECRET) -> dict[str, str]:
    stamp = str(int(ts))
    return {sig.TIMESTAMP_HEADER: stamp, sig.SIGNATURE_HEADER: sig.sign(secret, stamp, body),
            "Content-Type": "application/json"}


EVENT = json.dumps({"sender_id": "U1", "sender_name": "Ann", "thread_id": "T1",
                    "text": "hello from slack", "reply_route": {"channel": "C1"}}).encode()


# -- the signature, pure ---------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_channels_repr_never_shows_its_webhook_secret(
    served: tuple[Served, Runtime, list[tuple[Any, str]]], clock: ManualClock
) -> None:
    """What error trackers and tracebacks with locals record of a channel held in a local:
    the secret alone signs deliveries anyone could then forge."""
    srv, rt, _ = served
    channel = rt.social.channels.get("slack")
    assert channel is not None and channel.secret == SECRET
    assert SECRET.decode() not in repr(channel) and str(SECRET) not in repr(channel)
    assert post(srv, "/social/slack/events", EVENT, signed(EVENT, clock.now()))[0] == 202


def test_signatures_are_checked_for_presence_form_age_and_value() -> None:
    body = b'{"a": 1}'
    good = sig.sign(SECRET, "1000", body)
    assert sig.verify(SECRET, "1000", good, body, now=1100) == 1000
    for ts, signature, data, now, problem in (
            (None, good, body, 1000, SignatureProblem.MISSING),
            ("1000", "sha1=abc", body, 1000, SignatureProblem.MALFORMED),
            ("1000", good, body, 1301, SignatureProblem.STALE),
            ("1000", good, body, 699, SignatureProblem.STALE),
            ("1000", good, b'{"a": 2}', 1000, SignatureProblem.MISMATCH),
            ("1000", sig.sign(b"other", "1000", body), body, 1000, SignatureProblem.MISMATCH)):
        with pytest.raises(SignatureRejected) as info:
            sig.verify(SECRET, ts, signature, data, now)
        assert info.value.reason is problem
    guard = sig.ReplayGuard()
    assert guard.check(good, 1000) is None
    guard.remember(good, 1000, 1000)
    with pytest.raises(SignatureRejected):  # being handled: it may yet fail
        guard.check(good, 1100)
    guard.accepted(good, {"accepted": True, "event_id": "e1"})
    assert guard.check(good, 1200) == {"accepted": True, "event_id": "e1"}
    assert guard.check(good, 1400) is None  # forgotten once its window passed (stale by then)
    guard.remember(good, 1400, 1400)
    guard.withdraw(good)  # refused (a full queue): it may come again
    assert guard.check(good, 1400) is None


@pytest.mark.parametrize("digits", ["g" * 64, "0" * 63 + "z", " " * 64, "é" * 64,
                                    "0" * 62 + "\n0", "+" + "0" * 63])
def test_a_signature_that_is_not_64_hex_digits_is_malformed_not_a_mismatch(digits: str) -> None:
    """Only its prefix and length were checked: the platform (or whoever sent it) heard
    \"the signature does not match\" for a value that is no signature at all."""
    with pytest.raises(SignatureRejected) as info:
        sig.verify(SECRET, "1000", "v1=" + digits, b"{}", now=1000)
    assert info.value.reason is SignatureProblem.MALFORMED


# -- the webhook ------------------------------------------------------------------------------

def test_a_signed_delivery_is_queued_and_answered_through_the_channel(
        served: tuple[Served, Runtime, list[tuple[Any, str]]], clock: ManualClock) -> None:
    srv, rt, sent = served
    status, body = post(srv, "/social/slack/events", EVENT, signed(EVENT, clock.now()))
    assert status == 202 and body["session_id"] == "social-slack-T1"
    assert rt.social.wait_idle(10)
    assert sent == [({"channel": "C1"}, "ok: hello from slack")]


def test_unsigned_stale_forged_repeated_and_oversized_deliveries_queue_nothing(
        served: tuple[Served, Runtime, list[tuple[Any, str]]], clock: ManualClock) -> None:
    srv, rt, sent = served
    now = clock.now()
    cases = [
        ({"Content-Type": "application/json"}, EVENT, 401, "unsigned"),
        (signed(EVENT, now - 301), EVENT, 401, "stale"),
        (signed(EVENT, now, b"wrong secret"), EVENT, 401, "bad_signature"),
        ({**signed(EVENT, now), sig.SIGNATURE_HEADER: "v1=zz"}, EVENT, 401,
         "malformed_signature"),
    ]
    for headers, body, status, code in cases:
        got_status, got = post(srv, "/social/slack/events", body, headers)
        assert (got_status, got["error"]) == (status, code)
    big = b"{" + b" " * (300 * 1024) + b"}"
    assert post(srv, "/social/slack/events", big, signed(big, now))[0] == 413
    headers = signed(EVENT, now)
    status, first = post(srv, "/social/slack/events", EVENT, headers)
    assert status == 202
    # The platform missed the answer and sends it again: the same receipt, nothing queued
    # (a 409 had it retry until it gave up, counting a failed delivery each time).
    status, again = post(srv, "/social/slack/events", EVENT, headers)
    assert (status, again) == (202, {**first, "duplicate": True})
    assert rt.social.wait_idle(10)
    assert rt.social.statistics()["accepted"] == 1 and len(sent) == 1


def test_a_signature_in_upper_case_hex_is_the_same_signature(
        served: tuple[Served, Runtime, list[tuple[Any, str]]], clock: ManualClock) -> None:
    """The signature's form takes hex digits in either case (``v1=`` then 64 of them), but
    its value was compared as written: a sender whose hex encoder writes upper case (.NET's
    ``Convert.ToHexString``) heard "the signature does not match" for a right signature,
    every time. Its replay, in either case, is a replay."""
    srv, rt, sent = served
    headers = signed(EVENT, clock.now())
    upper = {**headers, sig.SIGNATURE_HEADER: "v1=" + headers[sig.SIGNATURE_HEADER][3:].upper()}
    status, got = post(srv, "/social/slack/events", EVENT, upper)
    assert status == 202, got
    for again in (headers, upper):
        status, repeat = post(srv, "/social/slack/events", EVENT, again)
        assert (status, repeat) == (202, {**got, "duplicate": True})
    assert rt.social.wait_idle(10)
    assert rt.social.statistics()["accepted"] == 1 and len(sent) == 1


def test_bad_payloads_get_a_precise_4xx(served: tuple[Served, Runtime, list[tuple[Any, str]]],
                                        clock: ManualClock) -> None:
    srv, rt, _ = served
    now = clock.now()
    for body, status, code, fragment in (
            (b"not json", 400, "bad_json", "not JSON"),
            (b"[1, 2]", 422, "invalid_argument", "JSON object"),
            (b'{"sender_id": "U1", "text": "x"}', 422, "invalid_argument", "thread_id"),
            (b'{"sender_id": "U1", "thread_id": "T", "text": "x", "attachments": 3}', 422,
             "invalid_argument", "attachments")):
        got_status, got = post(srv, "/social/slack/events", body, signed(body, now))
        assert (got_status, got["error"]) == (status, code) and fragment in got["message"]
    status, got = post(srv, "/social/discord/events", EVENT, signed(EVENT, now))
    assert (status, got["error"]) == (404, "not_found")
    assert rt.social.statistics()["accepted"] == 0


def test_an_invalid_webhook_event_is_a_422_whose_field_names_the_bad_one(
        served: tuple[Served, Runtime, list[tuple[Any, str]]], clock: ManualClock) -> None:
    """As a cron job's 422 does: the relay that maps a platform's payload decides on the
    field it got wrong, never on the message's text. The webhook's 422 named it only in
    its message."""
    srv, rt, _ = served
    now = clock.now()
    good = {"sender_id": "U1", "thread_id": "T", "text": "x"}
    for change, field in (({"thread_id": ""}, "thread_id"), ({"attachments": 3}, "attachments"),
                          ({"sender_name": "a\nb"}, "sender_name"),
                          ({"event_id": 7}, "event_id"), ({"reply_route": []}, "reply_route"),
                          ({"attachments": [{"url": "ftp://x"}]}, "attachments[0]")):
        body = json.dumps({**good, **change}).encode()
        status, got = post(srv, "/social/slack/events", body, signed(body, now))
        assert (status, got["error"], got.get("field")) == (422, "invalid_argument", field), got
    body = b"[1, 2]"  # not an object: no field of it to name
    status, got = post(srv, "/social/slack/events", body, signed(body, now))
    assert (status, got["error"], got.get("field")) == (422, "invalid_argument", None), got
    assert rt.social.statistics()["accepted"] == 0


def test_a_webhook_event_with_a_field_kinbox_does_not_know_is_a_422_naming_it(
        served: tuple[Served, Runtime, list[tuple[Any, str]]], clock: ManualClock) -> None:
    """A relay's misspelt field was dropped unread and the event queued: ``eventId`` for
    ``event_id`` took the platform's retry of it for a new event (its turn ran twice),
    ``attachment`` for ``attachments`` lost the files. So was a ``platform`` other than
    the route's (a body signed for Slack that says Discord). As ``POST /cron/jobs``
    refuses a field it does not take."""
    srv, rt, _ = served
    now = clock.now()
    good = {"sender_id": "U1", "thread_id": "T", "text": "x"}
    for change, field in (({"eventId": "Ev1"}, "eventId"),
                          ({"attachment": [{"url": "https://x.example/a"}]}, "attachment"),
                          ({"attachments": [{"url": "https://x.example/a", "mimeType": "a/b"}]},
                           "attachments[0]"),
                          ({"platform": "discord"}, "platform")):
        body = json.dumps({**good, **change}).encode()
        status, got = post(srv, "/social/slack/events", body, signed(body, now))
        assert (status, got["error"], got.get("field")) == (422, "invalid_argument", field), got
    assert rt.social.statistics()["accepted"] == 0
    body = json.dumps({**good, "platform": "slack"}).encode()  # the route's own: no news
    assert post(srv, "/social/slack/events", body, signed(body, now))[0] == 202
    with pytest.raises(rules.InvalidSocialEvent) as refused:
        rt.social.ingest({"platform": "slack", **good, "evnet_id": "Ev2"})
    assert refused.value.field == "evnet_id"


# -- cron routes -----------------------------------------------------------------------------

def test_an_invalid_cron_job_is_a_422_whose_field_names_the_bad_one(
        served: tuple[Served, Runtime, list[tuple[Any, str]]]) -> None:
    """The README: decide on types and attributes, never on message text. A client's form
    can mark the field a 422 names; it had only the message to read it from."""
    srv, rt, _ = served
    good = {"name": "digest", "cron": "0 9 * * 1-5", "prompt": "sum up"}
    for change, field in (({"cron": "0 9 30 2 *"}, "cron"), ({"cron": "nope"}, "cron"),
                          ({"timezone": "Mars/Base"}, "timezone"), ({"name": " "}, "name"),
                          ({"prompt": 3}, "prompt"), ({"delivery": "shout"}, "delivery")):
        status, got = post(srv, "/cron/jobs", json.dumps({**good, **change}).encode(), STATE)
        assert (status, got["error"], got.get("field")) == (422, "invalid_argument", field), got
    assert rt.cron.jobs() == []


def test_the_cron_routes_add_list_act_and_drain(
        served: tuple[Served, Runtime, list[tuple[Any, str]]], clock: ManualClock) -> None:
    srv, rt, _ = served
    job = json.dumps({"name": "digest", "cron": "*/5 * * * *", "prompt": "sum up"}).encode()
    assert post(srv, "/cron/jobs", job, {"Content-Type": "application/json"})[0] == 403
    status, created = post(srv, "/cron/jobs", job, STATE)
    assert status == 201 and created["cron"] == "*/5 * * * *"
    job_id = created["job_id"]
    status, listed = srv.request("GET", "/cron/jobs")
    assert status == 200 and [j["job_id"] for j in listed] == [job_id]
    status, bad = post(srv, "/cron/jobs", json.dumps({"name": "x", "cron": "nope",
                                                      "prompt": "p"}).encode(), STATE)
    assert status == 422 and "crontab" in bad["message"]
    status, bad = post(srv, "/cron/jobs", json.dumps({"name": "x", "cron": "* * * * *",
                                                      "prompt": "p", "when": 1}).encode(), STATE)
    assert status == 422 and "unknown fields ['when']" in bad["message"]
    assert post(srv, f"/cron/jobs/{job_id}/trigger", b"", STATE)[0] == 200
    rt.run_until_idle()
    status, runs = srv.request("GET", f"/cron/jobs/{job_id}/runs")
    assert status == 200 and [r["status"] for r in runs] == ["success"]
    assert srv.request("GET", "/cron/runs?limit=0")[0] == 422
    assert post(srv, f"/cron/jobs/{job_id}/pause", b"", STATE)[1]["active"] is False
    status, got = post(srv, f"/cron/jobs/{job_id}/trigger", b"", STATE)
    assert (status, got["error"]) == (409, "conflict")
    assert post(srv, f"/cron/jobs/{job_id}/resume", b"", STATE)[1]["active"] is True
    status, drained = post(srv, "/cron/announcements/drain", b"", STATE)
    assert status == 200 and [a["job_id"] for a in drained["announcements"]] == [job_id]
    assert srv.request("DELETE", f"/cron/jobs/{job_id}", STATE)[0] == 200
    status, got = srv.request("GET", f"/cron/jobs/{job_id}")
    assert (status, got["error"]) == (404, "not_found")
    head = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    head.request("HEAD", "/cron/jobs")
    assert head.getresponse().status == 200  # answered by the GET handler, as Starlette does
    head.close()


@pytest.mark.timeout(60)
def test_the_drain_route_says_how_many_announcements_were_dropped(
        served: tuple[Served, Runtime, list[tuple[Any, str]]]) -> None:
    srv, rt, _ = served
    queue = rt.cron.announcements
    for i in range(queue.bound + 3):
        queue.add({"n": i})
    status, drained = post(srv, "/cron/announcements/drain", b"", STATE)
    assert status == 200 and drained.get("dropped") == 3
    assert [a["n"] for a in drained["announcements"]] == list(range(3, queue.bound + 3))
    status, drained = post(srv, "/cron/announcements/drain", b"", STATE)
    assert (status, drained) == (200, {"announcements": [], "dropped": 0})


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("PUT", "/cron/jobs", "GET, HEAD, POST"),
    ("POST", "/cron/jobs/cj_1", "DELETE, GET, HEAD"),
])
def test_a_wrong_method_names_every_method_the_path_takes(
        served: tuple[Served, Runtime, list[tuple[Any, str]]], method: str, path: str,
        allowed: str) -> None:
    srv, _, _ = served
    status, headers, body = srv.exchange(method, path, STATE)
    assert (status, headers["Allow"]) == (405, allowed)
    assert body["message"] == f"{method} is not allowed here; allowed: {allowed}"


def test_a_full_queue_is_503_and_a_chunked_body_over_the_cap_is_413(
        served: tuple[Served, Runtime, list[tuple[Any, str]]], clock: ManualClock) -> None:
    import http.client

    srv, rt, _ = served
    rt.social.bound = 0  # nothing more may be accepted
    status, got = post(srv, "/social/slack/events", EVENT, signed(EVENT, clock.now()))
    assert (status, got["error"]) == (503, "queue_full")
    assert post(srv, "/social/slack/events", EVENT, signed(EVENT, clock.now()))[0] == 503
    big = b"x" * (300 * 1024)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    conn.putrequest("POST", "/social/slack/events")
    for name, value in signed(big, clock.now()).items():
        conn.putheader(name, value)
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for start in range(0, len(big), 64 * 1024):
        part = big[start:start + 64 * 1024]
        conn.send(f"{len(part):x}\r\n".encode() + part + b"\r\n")
    conn.send(b"0\r\n\r\n")
    response = conn.getresponse()
    assert response.status == 413 and json.loads(response.read())["error"] == "too_large"
    conn.close()


def test_input_no_backend_can_store_is_a_4xx_that_writes_nothing(
        served: tuple[Served, Runtime, list[tuple[Any, str]]], clock: ManualClock) -> None:
    """Lone surrogates (valid JSON escapes, not Unicode a database holds), NUL (which
    PostgreSQL's text refuses), JSON nested past the parser and digits that are not
    ASCII were 500s; a cron job whose write failed left its session behind."""
    srv, rt, _ = served
    now = clock.now()
    sessions_before = {s.id for s in rt.sessions()}
    deep = b"[" * 100_000
    for body, field in ((b'{"sender_id": "U1", "thread_id": "T\\ud800", "text": "x"}', "thread_id"),
                        (b'{"sender_id": "U1", "thread_id": "T", "text": "a\\u0000b"}', "text"),
                        (b'{"sender_id": "U1", "thread_id": "T", "text": "x", '
                         b'"event_id": "E\\ud800"}', "event_id"),
                        (b'{"sender_id": "U1", "thread_id": "T", "text": "x", '
                         b'"reply_route": {"c": "\\udc00"}}', "reply_route")):
        status, got = post(srv, "/social/slack/events", body, signed(body, now))
        assert (status, got["error"]) == (422, "invalid_argument") and field in got["message"]
    status, got = post(srv, "/social/slack/events", deep, signed(deep, now))
    assert (status, got["error"]) == (400, "bad_json")
    headers = {**signed(EVENT, now), sig.TIMESTAMP_HEADER: "\u00b2"}
    status, got = post(srv, "/social/slack/events", EVENT,
                       {k: v.encode().decode("latin-1") for k, v in headers.items()})
    assert (status, got["error"]) == (401, "malformed_signature")
    assert rt.social.statistics()["accepted"] == 0

    for fields, field in (({"name": "x\ud800", "cron": "* * * * *", "prompt": "p"}, "name"),
                          ({"name": "x", "cron": "* * * * *", "prompt": "p\x00"}, "prompt"),
                          ({"name": "x", "cron": "* * * * *", "prompt": "p",
                            "timezone": "UTC\x00"}, "timezone")):
        body = json.dumps(fields).encode()
        status, got = post(srv, "/cron/jobs", body, STATE)
        assert status == 422 and field in got["message"], got
    status, got = post(srv, "/cron/jobs", deep, STATE)
    assert (status, got["error"]) == (400, "bad_json")
    big = json.dumps({"name": "x", "cron": "* * * * *", "prompt": "p" * 300_000}).encode()
    status, got = post(srv, "/cron/jobs", big, STATE)
    assert (status, got["error"]) == (413, "too_large")
    never = json.dumps({"name": "x", "cron": "0 9 30 2 *", "prompt": "p"}).encode()
    status, got = post(srv, "/cron/jobs", never, STATE)
    assert status == 422 and "never fire" in got["message"]
    status, got = srv.request("GET", "/cron/runs?limit=%C2%B2")
    assert (status, got["error"]) == (422, "invalid_argument")
    assert rt.cron.jobs() == []
    assert {s.id for s in rt.sessions()} == sessions_before


@pytest.mark.timeout(60)
def test_an_id_no_database_can_hold_is_a_404_on_postgres(make_runtime: MakeRuntime,
                                                         pg_url: str, tmp_path: Path) -> None:
    """PostgreSQL refuses a NUL in a text parameter: the lookup failed with a 500 where
    SQLite (and the answer's meaning) say there is no such job."""
    rt = make_runtime(db=pg_url, brain=brain, data_dir=tmp_path / "data")
    srv = Served(app_for(rt))
    try:
        for method, path in (("GET", "/cron/jobs/a%00b"), ("DELETE", "/cron/jobs/a%00b"),
                             ("POST", "/cron/jobs/a%00b/trigger"),
                             ("GET", "/cron/jobs/a%00b/runs"),
                             ("DELETE", "/focal/wakeups/a%00b")):
            status, got = srv.request(method, path, STATE)
            assert (method, path, status, got["error"]) == (method, path, 404, "not_found")
    finally:
        srv.close()


def test_a_stopped_runtime_answers_503_not_500(
        served: tuple[Served, Runtime, list[tuple[Any, str]]], clock: ManualClock) -> None:
    srv, rt, _ = served
    rt.stop()
    status, got = post(srv, "/social/slack/events", EVENT, signed(EVENT, clock.now()))
    assert (status, got["error"]) == (503, "unavailable")
    job = json.dumps({"name": "digest", "cron": "*/5 * * * *", "prompt": "sum up"}).encode()
    status, got = post(srv, "/cron/jobs", job, STATE)
    assert (status, got["error"]) == (503, "unavailable")


@pytest.mark.parametrize(("declared", "status"), [("-1", 400), ("1e3", 400), ("999999", 413),
                                                ("9" * 5000, 413), ("0" * 5000 + "2", 200)])
def test_a_declared_length_is_a_number_within_the_cap(declared: str, status: int) -> None:
    """uvicorn refuses a malformed Content-Length itself; another ASGI server may not. A
    length of more digits than Python reads (4,300) was a ValueError, a 500."""
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    request = Request({"type": "http", "method": "POST", "path": "/", "query_string": b"",
                       "headers": [(b"content-length", declared.encode())]}, receive)
    if status == 200:
        assert asyncio.run(json_body.read_capped(request, 1024)) == b"{}"
        return
    with pytest.raises(BackendRefused) as info:
        asyncio.run(json_body.read_capped(request, 1024))
    assert info.value.status == status


def test_a_database_failure_is_a_503_that_the_platform_retry_gets_through(
        served: tuple[Served, Runtime, list[tuple[Any, str]]], clock: ManualClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The duplicate check of an event reads the journal; a database error there was a
    500 carrying the driver's text. It is a 503 (the platform retries) that says only
    that the database is unavailable, and the retry, with the same signature, runs."""
    srv, rt, sent = served
    failures: list[str] = []
    journal = rt.context.journal
    monkeypatch.setattr(journal, "committed_of", failing_once(
        journal.committed_of, OperationalError("disk I/O error at /secret/path"), failures,
        "committed_of"))
    event = json.dumps({**json.loads(EVENT), "event_id": "Ev1"}).encode()
    headers = signed(event, clock.now())
    status, got = post(srv, "/social/slack/events", event, headers)
    assert failures == ["committed_of"]
    assert (status, got["error"]) == (503, "unavailable")
    assert "/secret/path" not in json.dumps(got)
    status, got = post(srv, "/social/slack/events", event, headers)
    assert status == 202 and not got.get("duplicate"), got
    assert rt.social.wait_idle(10)
    assert len(sent) == 1


def test_a_write_that_may_yet_commit_is_a_504_that_does_not_invite_a_retry(
        served: tuple[Served, Runtime, list[tuple[Any, str]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cron job's write taken by a batch that outran its wait may land after: answered
    503 "try again", a client's retry made a second job. Withdrawn (never run), it is a
    503 still."""
    from kinbox.persistence import WriteTimeout

    srv, rt, _ = served
    job = json.dumps({"name": "digest", "cron": "*/5 * * * *", "prompt": "sum up"}).encode()
    for withdrawn, answer in ((False, (504, "outcome_unknown")), (True, (503, "unavailable"))):
        failures: list[str] = []
        monkeypatch.setattr(rt.cron, "add", failing_once(
            rt.cron.add, WriteTimeout(30.0, withdrawn=withdrawn), failures, "add"))
        status, got = post(srv, "/cron/jobs", job, STATE)
        assert failures == ["add"]
        assert (status, got["error"]) == answer
