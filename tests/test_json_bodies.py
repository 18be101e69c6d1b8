"""JSON bodies at the HTTP boundary, on a real uvicorn server on 127.0.0.1: one reading
for every parser. Each test failed on the code before its fix."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime
from kinbox.actors.serve import app_for
from kinbox.transport import webhook_signature as sig

from .fuzz_harness import ServerErrors
from .helpers import wait_for
from .test_cron_social_http import SECRET, post, signed
from .test_http import Served

MakeRuntime = Callable[..., Runtime]
STATE = {"X-Kinbox": "1", "Content-Type": "application/json"}
JOB = '"cron": "0 9 * * *", "prompt": "p"'


@pytest.fixture
def served(make_runtime: MakeRuntime, tmp_path: Path) -> Iterator[tuple[Served, Runtime]]:
    rt = make_runtime(brain=lambda turn: "ok", data_dir=tmp_path / "data")
    rt.social.register_channel("slack", send=lambda route, text: None, secret=SECRET)
    rt.social.allow("slack", ["U1"])
    srv = Served(app_for(rt))
    yield srv, rt
    srv.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("body", [
    # Two parsers read a repeated key differently (the first, the last, an error): the
    # one that checked a body and the one that acts on it must not disagree.
    ('{"name": "a", "name": "b", ' + JOB + "}").encode(),
    ('{"name": "a", ' + JOB + ', "timezone": "UTC", "timezone": "Asia/Tokyo"}').encode(),
    # NaN and Infinity are Python's extensions, not JSON.
    ('{"name": NaN, ' + JOB + "}").encode(),
    ('{"name": "a", ' + JOB + ', "delivery": -Infinity}').encode(),
    # JSON between systems is UTF-8; Python's parser also guesses UTF-16 and UTF-32.
    ('{"name": "a", ' + JOB + "}").encode("utf-16"),
    ('{"name": "a", ' + JOB + "}").encode("utf-32-le"),
], ids=["duplicate-name", "duplicate-timezone", "nan", "infinity", "utf-16", "utf-32"])
def test_a_cron_body_that_is_not_strict_json_is_a_400_and_adds_nothing(
        served: tuple[Served, Runtime], body: bytes) -> None:
    srv, rt = served
    status, answer = post(srv, "/cron/jobs", body, STATE)
    assert (status, answer["error"]) == (400, "bad_json"), answer
    assert rt.cron.jobs() == []


@pytest.mark.timeout(60)
def test_a_signed_webhook_with_a_repeated_sender_is_a_400_and_queues_nothing(
        served: tuple[Served, Runtime], clock: ManualClock) -> None:
    srv, rt = served
    # A platform's parser that keeps the first key sees U2 (not allowed); one that keeps
    # the last sees U1 (allowed).
    body = json.dumps({"thread_id": "T1", "text": "hi"})[:-1].encode() + \
        b', "sender_id": "U2", "sender_id": "U1"}'
    status, answer = post(srv, "/social/slack/events", body, signed(body, clock.now()))
    assert (status, answer["error"]) == (400, "bad_json"), answer
    assert rt.social.wait_idle(10)
    assert not any(s.id.startswith("social-") for s in rt.sessions())


@pytest.mark.timeout(60)
def test_strict_json_still_takes_every_json_value(served: tuple[Served, Runtime]) -> None:
    srv, _ = served
    body: dict[str, Any] = {"name": "caf\u00e9 \U0001f600", "cron": "0 9 * * *",
                            "prompt": "p", "timezone": "UTC"}
    status, job = post(srv, "/cron/jobs", json.dumps(body, ensure_ascii=False).encode(), STATE)
    assert status == 201 and job["name"] == body["name"]
    status, job = post(srv, "/cron/jobs", json.dumps(body).encode(), STATE)  # \u escapes
    assert status == 201 and job["name"] == body["name"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["/cron/jobs", "/social/slack/events"])
def test_a_client_gone_before_its_body_ended_is_no_server_error(
        served: tuple[Served, Runtime], clock: ManualClock, path: str) -> None:
    """Starlette's ``ClientDisconnect`` escaped the body's reading: uvicorn logged
    "Exception in ASGI application" with a traceback at ERROR for a client that merely
    went away (a dropped connection, a killed ``curl``)."""
    srv, rt = served
    stamp = str(int(clock.now()))
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Kinbox: 1\r\n"
            f"Content-Type: application/json\r\nContent-Length: 1000\r\n"
            f"{sig.TIMESTAMP_HEADER}: {stamp}\r\n{sig.SIGNATURE_HEADER}: v1={'0' * 64}\r\n\r\n")
    with ServerErrors() as errors:
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        sock.sendall(head.encode() + b'{"name": "a", ')
        wait_for(lambda: bool(srv.server.server_state.tasks), 10, "the request to be read")
        sock.close()
        wait_for(lambda: not srv.server.server_state.tasks, 10, "the request to end")
        assert errors.lines == []
    assert rt.cron.jobs() == [] and rt.social.statistics()["accepted"] == 0
