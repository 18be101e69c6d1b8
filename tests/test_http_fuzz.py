"""Every HTTP route under generated requests (Hypothesis), over a real uvicorn server on
127.0.0.1 and a real SQLite file (:mod:`.fuzz_harness`); what reaches a row (cron jobs,
webhook events) on PostgreSQL too.

Whatever a client sends (a wrong method, a path or query parameter of any bytes, a
missing, wrong or forged credential, any content type, a body that is not UTF-8, not JSON,
not an object, nested past any parser, over the cap, or an object with fields missing,
extra or of the wrong type), the answer is never a 5xx; a refusal is a JSON object with an
error code, and a message that names the offending field where there is one, quotes at
most a little of what was sent and no secret; and a refused request changes no row of any
table and writes no file.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote_from_bytes, urlencode

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kinbox.actors import cron_rules
from kinbox.transport import LOOPBACK_HOSTS
from kinbox.transport import webhook_signature as sig
from kinbox.transport.host_names import AllowedHosts, host_of
from kinbox.transport.token_tries import LOCKOUT

from .fuzz_harness import SECRET, TOKEN, Fuzzed, call, check_answer, serving

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

ROUTES: list[tuple[str, frozenset[str], str]] = [
    ("/", frozenset({"GET"}), "open"),
    ("/healthz", frozenset({"GET"}), "open"),
    ("/focal", frozenset({"GET"}), "guarded"),
    ("/focal/panel", frozenset({"GET"}), "guarded"),
    ("/focal/wakeups/{p}", frozenset({"DELETE"}), "guarded"),
    ("/focal/notifications", frozenset({"GET"}), "guarded"),
    ("/focal/notifications/read", frozenset({"POST"}), "guarded"),
    ("/cron/jobs", frozenset({"GET", "POST"}), "guarded"),
    ("/cron/jobs/{p}", frozenset({"GET", "DELETE"}), "guarded"),
    ("/cron/jobs/{p}/trigger", frozenset({"POST"}), "guarded"),
    ("/cron/jobs/{p}/pause", frozenset({"POST"}), "guarded"),
    ("/cron/jobs/{p}/resume", frozenset({"POST"}), "guarded"),
    ("/cron/jobs/{p}/runs", frozenset({"GET"}), "guarded"),
    ("/cron/runs", frozenset({"GET"}), "guarded"),
    ("/cron/announcements/drain", frozenset({"POST"}), "guarded"),
    ("/social/{p}/events", frozenset({"POST"}), "signed"),
    ("/peers/link", frozenset(), "websocket"),
    ("/peers/pair", frozenset(), "websocket"),
]
"""Every route, the methods it takes, and its credential: none, the app's rule
(``X-Kinbox: 1``, or the operator token when one is set), a webhook signature, or a
websocket upgrade (:mod:`.test_peer_ws_fuzz`; a plain request is told to upgrade)."""
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
STATE_CHANGING = ("POST", "DELETE", "PUT", "PATCH")
CONTENT_TYPES = (
    "application/json",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json; charset=latin-1",
    "",
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | st.sampled_from(["\ud800", "a\x00b", "", " ", "x" * 5000]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
bodies = st.one_of(
    st.none(), st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode())
)
params = st.binary(min_size=1, max_size=300).filter(lambda b: b"/" not in b)
hosts = st.one_of(
    st.sampled_from(
        [
            None,
            None,
            None,
            "127.0.0.1",
            "localhost:8765",
            "[::1]:1",
            "LocalHost",
            "evil.example",
            "127.0.0.1.evil.example",
            "[::2]",
            "localhost:x",
        ]
    ),
    st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20),
)
LOOPBACK = AllowedHosts(LOOPBACK_HOSTS)
queries = st.lists(
    st.tuples(st.sampled_from(["limit", "offset", "x", "limit"]), st.binary(max_size=30)),
    max_size=3,
)


@pytest.fixture
def fuzzed(make_runtime: Any, tmp_path: Path, db_url: str) -> Iterator[Fuzzed]:
    with serving(make_runtime, tmp_path, db_url) as served:
        yield served


@pytest.fixture
def fuzzed_any(make_runtime: Any, tmp_path: Path, any_db_url: str) -> Iterator[Fuzzed]:
    """Served on each backend: PostgreSQL refuses what SQLite keeps (a NUL, a value over
    a column's length), so what reaches a row is fuzzed on both."""
    with serving(make_runtime, tmp_path, any_db_url) as served:
        yield served


def pathed(template: str, param: bytes) -> str:
    return template.replace("{p}", quote_from_bytes(param, safe=""))


def test_the_fuzzed_routes_are_every_route_the_api_lists(fuzzed: Fuzzed) -> None:
    listed = call(fuzzed.open.port, "GET", "/").json()["routes"]
    # A websocket endpoint is listed with GET, the upgrade's method: fuzzed with none.
    assert {
        (
            r["path"].replace("{job_id}", "{p}").replace("{platform}", "{p}"),
            frozenset(m for m in r["methods"] if m != "HEAD"),
        )
        for r in listed
    } == {
        (path, frozenset({"GET"}) if credential == "websocket" else methods)
        for path, methods, credential in ROUTES
    }


@FUZZ
@given(
    route=st.sampled_from(ROUTES),
    method=st.sampled_from(METHODS),
    param=params,
    query=queries,
    state=st.sampled_from([None, "1", "0", "true", "01", "1,1"]),
    content_type=st.sampled_from(CONTENT_TYPES),
    body=bodies,
    host=hosts,
    slash=st.sampled_from(["", "", "", "/", "//"]),
)
@example(
    route=ROUTES[7],
    method="POST",
    param=b"x",
    query=[],
    state="1",
    content_type="application/json",
    body=json.dumps({"x" * 3000: 1, "y" * 3000: 2}).encode(),
    host=None,
    slash="",
)
@example(
    route=ROUTES[8],
    method="GET",
    param=b"x" * 3000,
    query=[],
    state=None,
    content_type="",
    body=None,
    host=None,
    slash="",
)
@example(
    route=ROUTES[4],
    method="DELETE",
    param=b"x" * 3000,
    query=[],
    state="1",
    content_type="",
    body=None,
    host=None,
    slash="",
)
@example(
    route=ROUTES[15],
    method="POST",
    param=b"p" * 3000,
    query=[],
    state=None,
    content_type="",
    body=None,
    host=None,
    slash="",
)
def test_any_request_to_any_route_is_answered_in_json_and_a_refusal_changes_nothing(
    fuzzed: Fuzzed,
    route: tuple[str, frozenset[str], str],
    method: str,
    param: bytes,
    query: list[tuple[str, bytes]],
    state: str | None,
    content_type: str,
    body: bytes | None,
    host: str | None,
    slash: str,
) -> None:
    template, methods, credential = route
    path = pathed(template, param) + slash + (("?" + urlencode(query)) if query else "")
    headers = {"Content-Type": content_type} if content_type else {}
    if state is not None:
        headers["X-Kinbox"] = state
    if host is not None:
        headers["Host"] = host
    before = fuzzed.changes.snapshot()
    answer = call(fuzzed.open.port, method, path, body, headers)
    error = check_answer(method, answer)
    allowed = methods | ({"HEAD"} if "GET" in methods else set())
    if host is not None and not LOOPBACK.allows(host_of(host)):
        assert answer.status == 400 and (error is None or error["error"] == "invalid_host")
    elif slash:  # no such route, and no redirect to one
        assert answer.status == 404 and (error is None or error["error"] == "not_found")
    elif credential == "websocket":
        assert answer.status == 426 and (error is None or error["error"] == "upgrade_required")
    elif method not in allowed:
        assert answer.status == 405 and set(answer.headers["allow"].split(", ")) == allowed
    elif credential == "guarded" and method in STATE_CHANGING and state != "1":
        assert (answer.status, error and error["error"]) == (403, "forbidden")
    if answer.status >= 400:
        assert fuzzed.changes.snapshot() == before, (method, path, answer.raw[:200])
    else:
        fuzzed.settle()


@FUZZ
@given(
    route=st.sampled_from([r for r in ROUTES if r[2] == "guarded"]),
    authorization=st.one_of(
        st.none(),
        st.just(f"Bearer {TOKEN}x"),
        st.just(f"Basic {TOKEN}"),
        st.just(f"bearer{TOKEN}"),
        st.just(TOKEN),
        st.just(f"Bearer {TOKEN[:-1]}"),
        st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=60).map(
            lambda t: "Bearer " + t
        ),
    ),
    state=st.booleans(),
)
def test_a_guarded_route_refuses_a_missing_or_wrong_operator_token_and_keeps_it_secret(
    fuzzed: Fuzzed, route: tuple[str, frozenset[str], str], authorization: str | None, state: bool
) -> None:
    template, methods, _ = route
    headers = {"X-Kinbox": "1"} if state else {}  # no stand-in for the token
    if authorization is not None:
        headers["Authorization"] = authorization
    # Each example a client no wrong token of an earlier one locked out (token_tries).
    fuzzed.token_clock.advance(LOCKOUT)
    before = fuzzed.changes.snapshot()
    for method in sorted(methods):
        answer = call(fuzzed.tokened.port, method, pathed(template, b"cj_1"), b"{}", headers)
        error = check_answer(method, answer)
        assert (answer.status, error and error["error"]) == (401, "unauthorized")
        assert answer.headers["www-authenticate"] == "Bearer"
        # One message whatever was presented: nothing of it comes back.
        assert error["message"] == ("reads" if method == "GET" else "state-changing calls") + (
            " need the operator token: Authorization: Bearer <token>"
        ), error
    assert fuzzed.changes.snapshot() == before
    for path in ("/", "/healthz"):  # what is served, and whether it is up: open to all
        assert call(fuzzed.tokened.port, "GET", path, None, headers).status == 200


JOB: dict[str, Any] = {
    "name": "digest",
    "cron": "0 9 * * *",
    "prompt": "sum up the day BODY-7c1e",
    "delivery": "announce",
    "timezone": "Europe/Paris",
}


@FUZZ
@given(
    field=st.sampled_from([*JOB, "extra"]),
    value=json_values,
    drop=st.sets(st.sampled_from(list(JOB)), max_size=2),
)
@example(field="timezone", value="T" * 3000, drop=set())
@example(field="cron", value=["x" * 3000], drop=set())
@example(field="extra" * 600, value=1, drop=set())
def test_a_cron_job_body_is_added_whole_or_refused_naming_its_field(
    fuzzed_any: Fuzzed, field: str, value: Any, drop: set[str]
) -> None:
    job = {k: v for k, v in JOB.items() if k not in drop} | {field: value}
    before = fuzzed_any.changes.snapshot()
    answer = call(
        fuzzed_any.open.port,
        "POST",
        "/cron/jobs",
        json.dumps(job).encode(),
        {"X-Kinbox": "1", "Content-Type": "application/json"},
    )
    error = check_answer("POST", answer)
    if error is None:
        assert answer.status == 201
        assert fuzzed_any.rt.cron.remove(answer.json()["job_id"])
        assert not fuzzed_any.logs.holds("BODY-")  # a prompt is logged at DEBUG at most
        return
    assert (answer.status, error["error"]) == (422, "invalid_argument"), error
    named = [k for k in (*drop, field) if k in error["message"]]
    assert named or (field not in JOB and "unknown fields" in error["message"]), error
    if field in JOB:  # a bad or missing field of the job (not an unknown one): named
        assert error.get("field") in (*drop, field), error
    assert fuzzed_any.changes.snapshot() == before


EVENT: dict[str, Any] = {
    "sender_id": "U1",
    "sender_name": "Ann",
    "thread_id": "T1",
    "text": "hello BODY-9b2f",
    "reply_route": {"channel": "C1"},
}
EVENT_FIELDS = (*EVENT, "attachments", "event_id")


@FUZZ
@given(
    field=st.sampled_from(EVENT_FIELDS),
    value=json_values,
    signing=st.sampled_from(
        ["good", "good", "good", "wrong secret", "stale", "none", "malformed", "replayed"]
    ),
)
def test_a_webhook_event_is_queued_or_refused_naming_its_field_or_its_signature(
    fuzzed_any: Fuzzed, field: str, value: Any, signing: str
) -> None:
    body = json.dumps(EVENT | {field: value}).encode()
    now = fuzzed_any.rt.clock.now()
    fuzzed_any.rt.clock.advance(1)  # a new timestamp: a repeated body is not a replay
    stamp = str(int(now - 400 if signing == "stale" else now))
    headers = {
        sig.TIMESTAMP_HEADER: stamp,
        "Content-Type": "application/json",
        sig.SIGNATURE_HEADER: sig.sign(
            b"other" if signing == "wrong secret" else SECRET, stamp, body
        ),
    }
    if signing == "none":
        headers = {"Content-Type": "application/json"}
    elif signing == "malformed":
        headers[sig.SIGNATURE_HEADER] = headers[sig.SIGNATURE_HEADER][:-1] + "g"
    before = fuzzed_any.changes.snapshot()
    answer = call(fuzzed_any.open.port, "POST", "/social/slack/events", body, headers)
    if signing == "replayed" and answer.status == 202:
        fuzzed_any.settle()
        before = fuzzed_any.changes.snapshot()
        answer = call(fuzzed_any.open.port, "POST", "/social/slack/events", body, headers)
        assert answer.status == 409
    error = check_answer("POST", answer)
    if error is None:
        assert signing in ("good", "replayed") and answer.status == 202
        fuzzed_any.settle()
        assert not fuzzed_any.logs.holds("BODY-")  # a message is logged at DEBUG at most
        return
    expected = {
        "good": "invalid_argument",
        "replayed": "invalid_argument",
        "wrong secret": "bad_signature",
        "stale": "stale",
        "none": "unsigned",
        "malformed": "malformed_signature",
    }[signing]
    if answer.status == 409:
        expected = "replayed"
    assert error["error"] == expected, (signing, error)
    if expected == "invalid_argument":
        assert answer.status == 422 and field in error["message"], error
    elif expected != "replayed":  # the watch hears kinbox: a refused signature is logged
        assert fuzzed_any.logs.holds(f"refused: {expected}"), fuzzed_any.logs.lines[-3:]
    assert fuzzed_any.changes.snapshot() == before


NESTED = b"[" * 100_000 + b"]" * 100_000
BODY_SHAPES: list[tuple[bytes, bool, int, str]] = [
    (b"\xff\xfe{}", False, 400, "bad_json"),
    (b'{"name": "\xc3\x28"}', False, 400, "bad_json"),
    (b"", False, 400, "bad_json"),
    (b"{", False, 400, "bad_json"),
    (NESTED, False, 400, "bad_json"),
    (b'{"a": ' * 20_000 + b"1" + b"}" * 20_000, False, 400, "bad_json"),
    (b"[1, 2]", False, 422, "invalid_argument"),
    (b'"a job"', False, 422, "invalid_argument"),
    (b"null", False, 422, "invalid_argument"),
    (b'{"name": "a", "name": "b"}', False, 400, "bad_json"),
    (b'{"name": NaN}', False, 400, "bad_json"),
    (b"{" + b" " * (300 * 1024) + b"}", False, 413, "too_large"),
    (b"{" + b" " * (300 * 1024) + b"}", True, 413, "too_large"),
    (b"x" * (2 * 1024 * 1024), True, 413, "too_large"),
]
"""Bodies no JSON route takes, sent with a length (False) or chunked (True); what each gets."""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["/cron/jobs", "/social/slack/events"])
def test_a_body_that_is_not_a_json_object_within_the_cap_is_refused_and_changes_nothing(
    fuzzed_any: Fuzzed, path: str
) -> None:
    for body, chunked, status, code in BODY_SHAPES:
        for content_type in ("application/json", "text/plain"):
            stamp = str(int(fuzzed_any.rt.clock.now()))
            headers = {
                "X-Kinbox": "1",
                "Content-Type": content_type,
                sig.TIMESTAMP_HEADER: stamp,
                sig.SIGNATURE_HEADER: sig.sign(SECRET, stamp, body),
            }
            fuzzed_any.rt.clock.advance(1)
            before = fuzzed_any.changes.snapshot()
            answer = call(fuzzed_any.open.port, "POST", path, body, headers, chunked=chunked)
            error = check_answer("POST", answer)
            assert error is not None and (answer.status, error["error"]) == (status, code), (
                body[:40],
                chunked,
                error,
            )
            assert fuzzed_any.changes.snapshot() == before


ACTS = [
    ("POST", "/trigger"),
    ("POST", "/pause"),
    ("POST", "/resume"),
    ("DELETE", ""),
    ("GET", ""),
    ("GET", "/runs"),
]


@settings(FUZZ, max_examples=40)
@given(steps=st.lists(st.tuples(st.sampled_from(ACTS), st.integers(0, 3)), min_size=1, max_size=8))
def test_acting_on_jobs_that_exist_were_paused_or_removed_refuses_without_a_trace(
    fuzzed: Fuzzed, steps: list[tuple[tuple[str, str], int]]
) -> None:
    """Ids that name a job, a paused one, a removed one or none: a 404 or a 409 leaves
    every row as it was; what is done is done whole (its run ended before the next step)."""
    made = [fuzzed.rt.cron.add(f"job {i}", "0 9 * * *", "p")["job_id"] for i in range(3)]
    ids = [*made, "cj_0123456789"]
    for (method, suffix), which in steps:
        before = fuzzed.changes.snapshot()
        answer = call(
            fuzzed.open.port, method, f"/cron/jobs/{ids[which]}{suffix}", None, {"X-Kinbox": "1"}
        )
        error = check_answer(method, answer)
        if error is None:
            fuzzed.settle()
            continue
        assert (answer.status, error["error"]) in ((404, "not_found"), (409, "conflict"))
        assert fuzzed.changes.snapshot() == before, (method, suffix, error)
    for job_id in made:
        with contextlib.suppress(cron_rules.CronJobNotFound):
            fuzzed.rt.cron.remove(job_id)
    fuzzed.settle()
