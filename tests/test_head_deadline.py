"""A request's head must come whole in time, on a real uvicorn server on 127.0.0.1 running
``kinbox serve``'s protocol: a client that connects and says nothing, or sends half a
head, is answered 408 and closed; whole requests and websocket links are untouched."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvicorn
from websockets.sync.client import connect

from kinbox.actors import Runtime
from kinbox.actors.serve import app_for
from kinbox.transport import frames as f
from kinbox.transport.head_deadline import head_deadline

from .helpers import wait_for

MakeRuntime = Callable[..., Runtime]


@pytest.fixture
def port(make_runtime: MakeRuntime, tmp_path: Path) -> Iterator[int]:
    rt = make_runtime(data_dir=tmp_path / "data")
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(
        app_for(rt), log_level="warning", lifespan="off", http=head_deadline(0.5)
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, args=([sock],), daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30, "uvicorn to start")
    yield int(sock.getsockname()[1])
    server.should_exit = True
    thread.join(10)


def answer_to(port: int, sent: bytes) -> bytes:
    """Everything the server sends after ``sent``, until it closes (20 s at most)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(sent)
        got = b""
        while chunk := s.recv(4096):
            got += chunk
        return got


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sent", [b"", b"GET /healthz HTTP/1.1\r\nHost: 127.0"])
def test_a_head_that_never_ends_is_answered_408_and_closed(port: int, sent: bytes) -> None:
    """A connection that sent nothing, or half a request head, was held open for ever
    (uvicorn waits for a head as long as the client takes). Past the head deadline the
    server answers 408 ``request_timeout`` and closes it."""
    head, _, body = answer_to(port, sent).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), head
    assert json.loads(body)["error"] == "request_timeout"


@pytest.mark.timeout(60)
def test_whole_requests_and_websocket_handshakes_are_not_cut_by_the_head_deadline(
    port: int,
) -> None:
    answer = answer_to(
        port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    with connect(f"ws://127.0.0.1:{port}/peers/pair", open_timeout=10, proxy=None) as ws:
        assert isinstance(f.parse(ws.recv(10)), f.Challenge)
        with pytest.raises(TimeoutError):  # open past the head deadline: the handshake's own
            ws.recv(2)


@pytest.mark.timeout(60)
def test_the_rest_of_a_body_answered_early_has_the_deadline_too(port: int) -> None:
    """A route that answered before reading the body (here 413, from a ``Content-Length``
    over the cap) left the connection reading the rest, and each byte a client dripped
    kept it open past the head deadline and the keep-alive timeout, for ever. The client
    still gets its answer; the rest of the body then has the deadline, and the connection
    is closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(
            b"POST /cron/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Kinbox: 1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 10000000\r\n\r\n{"
        )
        got = b""
        while b"\r\n\r\n" not in got or not got.endswith(b"}"):
            chunk = s.recv(4096)
            assert chunk, got
            got += chunk
        assert got.startswith(b"HTTP/1.1 413"), got
        s.settimeout(0.1)  # the drip's pace: a byte each time the server says nothing
        closed = threading.Event()
        deadline = threading.Timer(20, lambda: None)
        deadline.start()
        try:
            while deadline.is_alive() and not closed.is_set():
                try:
                    s.sendall(b" ")
                    if s.recv(4096) == b"":
                        closed.set()
                except TimeoutError:
                    continue
                except OSError:  # reset or broken pipe: closed under the drip
                    closed.set()
        finally:
            deadline.cancel()
        assert closed.is_set(), "the connection stayed open under a dripped body"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "sent",
    [
        b"POST /cron/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: ten\r\n\r\n",
        b"POST /cron/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
        + b"9" * 5000 + b"\r\n\r\n",
        "GET /focal/é HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode(),
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX Kinbox: 1\r\n\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
        b"POST /cron/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Kinbox: 1\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["length-not-a-number", "length-of-5000-digits", "raw-utf8-path", "header-name-space",
         "no-request-line", "chunk-size-not-hex"],
)
def test_a_request_that_is_not_http_is_answered_400_in_json(port: int, sent: bytes) -> None:
    """uvicorn answers what h11 cannot parse (a Content-Length that is no number, a path
    in raw UTF-8 as some clients send it, a header name with a space) with a plain-text
    ``Invalid HTTP request received.``: the one answer of the API that a client reading
    ``error`` from the JSON could not read. It is a JSON 400 ``bad_request``, and the
    connection is closed."""
    head, _, body = answer_to(port, sent).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    assert b"content-type: application/json" in head.lower(), head
    assert json.loads(body)["error"] == "bad_request", body


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("sent", "has_body"),
    [
        (b"HEAD /focal HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
         False),
        (b"POST /focal/notifications/read HTTP/1.1\r\nHost: 127.0.0.1\r\n"
         b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", True),
    ],
    ids=["head", "route-answering-before-the-body"],
)
def test_a_body_that_is_not_http_logs_no_error_whatever_its_route_does(
    port: int, sent: bytes, has_body: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A body whose chunk framing h11 refuses, under a route that answers before reading it
    (a 403 here) or of a HEAD request (whose answer has no body): the server's 400 met the
    route's own answer, or a body it may not have, and uvicorn logged an ERROR traceback
    ("Exception in ASGI application", "Fatal error on transport") for each such request,
    any client's at will. The client gets the 400 (no body for a HEAD); nothing is
    logged above WARNING."""
    head, _, body = answer_to(port, sent).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    assert b"content-type: application/json" in head.lower(), head
    assert (json.loads(body)["error"] == "bad_request") if has_body else body == b"", body
    # A later request's answer: the server's loop has run what the first one left to run.
    answer = answer_to(
        port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    errors = [r.getMessage() for r in caplog.records if r.levelno > logging.WARNING]
    assert errors == []
