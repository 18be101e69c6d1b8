"""The HTTP API on a real uvicorn server on 127.0.0.1 with an ephemeral port (FO8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from kinbox.actors import ConfigError, ManualClock, Runtime
from kinbox.actors.focal import FOCAL_ID
from kinbox.actors.serve import app_for
from kinbox.persistence import TurnEntry
from kinbox.transport import (
    LOOPBACK_HOSTS,
    ExposedWithoutToken,
    HostGuard,
    OperatorToken,
    allowed_name,
    create_app,
)
from kinbox.transport.host_names import host_of
from kinbox.transport.operator_token import MIN_LENGTH
from kinbox.transport.token_tries import LOCKOUT, MAX_FAILURES

from .helpers import quiet_brain, wait_for

MakeRuntime = Callable[..., Runtime]


class Served:
    """A uvicorn server running an ASGI app in a thread."""

    def __init__(self, app: Any) -> None:
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, what="uvicorn to start")
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def request(
        self, method: str, path: str, headers: dict[str, str] | None = None, timeout: float = 10
    ) -> tuple[int, Any]:
        status, _, body = self.exchange(method, path, headers, timeout)
        return status, body

    def exchange(
        self, method: str, path: str, headers: dict[str, str] | None = None, timeout: float = 10
    ) -> tuple[int, Any, Any]:
        """Status, response headers and the decoded body (text when it is not JSON)."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", method=method, headers=headers or {}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.headers, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = exc.read()
            try:
                return exc.code, exc.headers, json.loads(body)
            except ValueError:
                return exc.code, exc.headers, body.decode()

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def served(make_runtime: MakeRuntime, tmp_path: Path) -> Iterator[tuple[Served, Runtime]]:
    rt = make_runtime(data_dir=tmp_path / "data")
    srv = Served(app_for(rt))
    yield srv, rt
    srv.close()


def test_get_focal_creates_the_chat_and_reports_counts(
    served: tuple[Served, Runtime], clock: ManualClock
) -> None:
    srv, rt = served
    web = rt.create_project("web")
    s = rt.create_session(web.id, "Docs")
    tools = rt.tools_for(s.id)
    task = tools.task_create("write docs", status="in_progress")["task_id"]
    tools.task_update(task, status="blocked", blocked_on="user", reason="tone?")
    rt.create_session(web.id, "Idle worker")
    status, body = srv.request("GET", "/focal")
    assert status == 200
    assert rt.focal.exists()
    assert body["chat_id"] == FOCAL_ID and body["title"] == "SUZENT"
    assert (body["waiting"], body["waiting_by_project"], body["waiting_by_chat"]) == (
        1,
        {"web": 1},
        {s.id: 1},
    )
    assert {"stalled", "auto_running", "unread", "last_message"} <= set(body)


def test_panel_lists_the_fixed_tools_and_wakeups(
    served: tuple[Served, Runtime], clock: ManualClock
) -> None:
    srv, rt = served
    rt.get_or_create_focal_chat()
    rt.tools_for(FOCAL_ID).schedule_wakeup("reminder", at=clock.now() + 600, note="tea")
    status, body = srv.request("GET", "/focal/panel")
    assert status == 200
    assert "schedule_wakeup" in body["tools"] and "agent_send" in body["tools"]
    assert [w["note"] for w in body["wakeups"]] == ["tea"]


def test_delete_cancels_only_focals_own_wakeups(
    served: tuple[Served, Runtime], clock: ManualClock
) -> None:
    srv, rt = served
    rt.get_or_create_focal_chat()
    job = rt.tools_for(FOCAL_ID).schedule_wakeup("check", at=clock.now() + 60)["job_id"]
    status, body = srv.request("DELETE", f"/focal/wakeups/{job}")
    assert status == 403 and body["error"] == "forbidden"
    ok = {"X-Kinbox": "1"}
    assert srv.request("DELETE", "/focal/wakeups/focal-heartbeat", ok)[0] == 404
    status, body = srv.request("DELETE", "/focal/wakeups/nope", ok)
    assert status == 404 and body["error"] == "not_found"
    assert srv.request("DELETE", f"/focal/wakeups/{job}", ok) == (200, {"cancelled": job})
    assert srv.request("GET", "/focal/panel")[1]["wakeups"] == []


def test_requests_for_another_host_are_refused_in_json(served: tuple[Served, Runtime]) -> None:
    srv, _ = served
    status, headers, body = srv.exchange("GET", "/focal", {"Host": "evil.example"})
    assert (status, headers["content-type"]) == (400, "application/json")
    assert body["error"] == "invalid_host" and "evil.example" in body["message"]
    assert srv.request("GET", "/focal", {"Host": f"localhost:{srv.port}"})[0] == 200


def test_unknown_routes_and_methods_answer_json(served: tuple[Served, Runtime]) -> None:
    srv, _ = served
    assert srv.request("GET", "/nope")[1]["error"] == "not_found"
    status, headers, body = srv.exchange("POST", "/focal")
    assert (status, body["error"]) == (405, "method_not_allowed")
    assert headers["Allow"] == "GET, HEAD"
    status, headers, _ = srv.exchange("GET", "/focal/wakeups/x")
    assert (status, headers["Allow"]) == (405, "DELETE")


def test_the_root_lists_the_routes(served: tuple[Served, Runtime]) -> None:
    srv, _ = served
    status, body = srv.request("GET", "/")
    assert status == 200 and body["service"] == "kinbox"
    routes = {r["path"]: r["methods"] for r in body["routes"]}
    assert routes["/healthz"] == ["GET"]
    assert routes["/focal/wakeups/{job_id}"] == ["DELETE"]
    assert routes["/focal/notifications/read"] == ["POST"]


def test_the_root_says_what_every_cron_and_peer_route_is(served: tuple[Served, Runtime]) -> None:
    """A reader of GET / saw the cron routes with an empty "about", and the peer
    endpoints not at all (a plain request to them is a 426, not a 404)."""
    srv, _ = served
    _, body = srv.request("GET", "/")
    routes = {r["path"]: r for r in body["routes"]}
    cron = [path for path in routes if path.startswith("/cron/")]
    assert len(cron) == 8
    for path in [*cron, "/peers/link", "/peers/pair"]:
        assert routes[path]["about"], routes.get(path, path)
    assert routes["/peers/link"]["methods"] == ["GET"]  # a websocket upgrade


def test_the_root_says_what_every_route_is(served: tuple[Served, Runtime]) -> None:
    """The README says ``GET /`` lists each route with what it does; the social webhook
    route was listed with an empty "about"."""
    srv, _ = served
    _, body = srv.request("GET", "/")
    routes = {r["path"]: r["about"] for r in body["routes"]}
    assert "/social/{platform}/events" in routes
    assert [path for path, about in routes.items() if not about] == []


def test_healthz_reports_each_check(
    make_runtime: MakeRuntime, tmp_path: Path, any_db_url: str
) -> None:
    delivering = make_runtime(db=any_db_url, data_dir=tmp_path / "data", brain=quiet_brain)
    srv = Served(app_for(delivering))
    try:
        status, body = srv.request("GET", "/healthz")
    finally:
        srv.close()
    assert (status, body["healthy"]) == (200, True)
    assert {name: check["ok"] for name, check in body["checks"].items()} == {
        "runtime": True,
        "database": True,
        "writer": True,
        "dispatcher": True,
    }
    assert body["checks"]["dispatcher"]["state"] == "running"


def test_healthz_says_send_only_and_503_once_the_runtime_stopped(
    served: tuple[Served, Runtime],
) -> None:
    srv, rt = served
    status, body = srv.request("GET", "/healthz")
    assert status == 200 and body["checks"]["dispatcher"] == {"ok": True, "state": "send-only"}
    rt.stop()
    status, body = srv.request("GET", "/healthz")
    assert (status, body["healthy"]) == (503, False)
    assert body["checks"]["runtime"] == {"ok": False, "state": "stopped"}
    assert body["checks"]["writer"]["ok"] is False


@pytest.mark.timeout(60)
def test_a_held_up_writer_does_not_freeze_the_server(served: tuple[Served, Runtime]) -> None:
    srv, rt = served
    gate = threading.Event()
    assert rt._writer is not None
    held = rt._writer.submit(lambda: gate.wait(30))  # the writer thread sits in this op
    answers: list[tuple[int, Any]] = []
    # GET /focal creates the Focal chat: a write, queued behind the held one.
    slow = threading.Thread(target=lambda: answers.append(srv.request("GET", "/focal", timeout=40)))
    slow.start()
    try:
        wait_for(
            lambda: rt._writer is not None and rt._writer.queued() >= 1,
            what="GET /focal to wait on the writer",
        )
        began = time.monotonic()
        status, body = srv.request("GET", "/healthz", timeout=15)
        assert time.monotonic() - began < 10
        assert (status, body["checks"]["writer"]["ok"]) == (503, False)
        assert body["checks"]["database"]["ok"] is True  # reads go on meanwhile
        assert srv.request("GET", "/", timeout=5)[0] == 200
        assert not answers
    finally:
        gate.set()
    held.result(10)
    slow.join(30)
    assert answers and answers[0][0] == 200
    assert srv.request("GET", "/healthz")[0] == 200


@pytest.mark.timeout(90)
def test_healthz_answers_when_every_worker_thread_waits_on_the_writer(
    served: tuple[Served, Runtime],
) -> None:
    srv, rt = served
    writer = rt._writer
    assert writer is not None
    gate = threading.Event()
    held = writer.submit(lambda: gate.wait(60))
    pool = 40  # anyio's default thread limit, which every other route shares
    waiting = [
        threading.Thread(target=srv.request, args=("GET", "/focal"), kwargs={"timeout": 60})
        for _ in range(pool + 5)
    ]
    for t in waiting:
        t.start()
    try:
        # The first waits on the writer, the others on Focal's lock behind it; anyio
        # starts a thread per concurrent call, and none of these can return.
        wait_for(
            lambda: sum(t.name == "AnyIO worker thread" for t in threading.enumerate()) >= pool,
            timeout=30,
            what="every worker thread to be taken",
        )
        began = time.monotonic()
        status, body = srv.request("GET", "/healthz", timeout=15)
        assert time.monotonic() - began < 10
        assert (status, body["checks"]["writer"]["ok"]) == (503, False)
    finally:
        gate.set()
    held.result(10)
    for t in waiting:
        t.join(60)
    assert srv.request("GET", "/healthz")[0] == 200


def test_focal_status_reads_only_the_last_visible_entry(served: tuple[Served, Runtime]) -> None:
    srv, rt = served
    chat = rt.get_or_create_focal_chat()
    store = rt.context.store
    store.append(chat.id, [TurnEntry("user", f"note {i}") for i in range(300)], 1.0)
    store.append(chat.id, [TurnEntry("assistant", "hidden thought", visible=False)], 2.0)
    assert [e.text for e in store.transcript(chat.id, last=2)] == ["note 299", "hidden thought"]
    assert [e.text for e in store.transcript(chat.id, last=1, visible_only=True)] == ["note 299"]
    assert srv.request("GET", "/focal")[1]["last_message"]["text"] == "note 299"


def test_state_changes_need_the_operator_token_when_one_is_set(
    make_runtime: MakeRuntime, tmp_path: Path
) -> None:
    rt = make_runtime(data_dir=tmp_path / "data")
    srv = Served(app_for(rt, operator=OperatorToken.from_secret("s3cret-operator-token")))
    try:
        read = "/focal/notifications/read"
        status, headers, body = srv.exchange("POST", read, {"X-Kinbox": "1"})
        assert (status, body["error"], headers["WWW-Authenticate"]) == (
            401,
            "unauthorized",
            "Bearer",
        )
        assert srv.request("POST", read, {"Authorization": "Bearer s3cre"})[0] == 401
        assert srv.request("POST", read, {"Authorization": "Basic s3cret-operator-token"})[0] == 401
        assert (
            srv.request("POST", read, {"Authorization": "Bearer s3cret-operator-token"})[0] == 200
        )
    finally:
        srv.close()


def test_with_a_token_set_reads_need_it_too_but_the_index_and_healthz(
    make_runtime: MakeRuntime, tmp_path: Path
) -> None:
    """A token is set because others can reach the server (it is required off loopback):
    the reads answered anyone, and they hold message bodies (Focal's last message, the
    notifications, cron prompts and results)."""
    rt = make_runtime(brain=quiet_brain, data_dir=tmp_path / "data")
    job = rt.cron.add("digest", "0 9 * * *", "the private prompt")["job_id"]
    srv = Served(app_for(rt, operator=OperatorToken.from_secret("s3cret-operator-token")))
    try:
        reads = [
            "/focal",
            "/focal/panel",
            "/focal/notifications",
            "/cron/jobs",
            f"/cron/jobs/{job}",
            f"/cron/jobs/{job}/runs",
            "/cron/runs",
        ]
        for path in reads:
            status, headers, body = srv.exchange("GET", path)
            assert (status, body["error"], headers["WWW-Authenticate"]) == (
                401,
                "unauthorized",
                "Bearer",
            ), path
            assert "private" not in json.dumps(body)
            assert srv.request("GET", path, {"Authorization": "Bearer wrong"})[0] == 401
            assert (
                srv.request("GET", path, {"Authorization": "Bearer s3cret-operator-token"})[0]
                == 200
            )
        for path in ["/", "/healthz"]:  # what it serves and whether it is up: no secrets
            assert srv.request("GET", path)[0] == 200
        assert srv.request("GET", "/nope")[0] == 404
    finally:
        srv.close()


def test_the_bearer_token_may_follow_more_than_one_space() -> None:
    """HTTP puts one or more spaces between scheme and credentials (RFC 9110, 11.4); a
    token after two was refused, though no token starts with a space."""
    token = OperatorToken.from_secret("s3cret-operator-token")
    assert token.allows("Bearer  s3cret-operator-token") and token.allows(
        "bearer \ts3cret-operator-token "
    )
    assert not token.allows("Bearer s3cre") and not token.allows("Bearer  ")
    assert not token.allows("Bearers3cret-operator-token") and not token.allows(
        "Basic s3cret-operator-token"
    )


def test_the_operator_token_keeps_only_a_hash() -> None:
    token = OperatorToken.from_secret("s3cret-operator-token")
    assert "s3cret-operator-token" not in repr(token) and not hasattr(token, "__dict__")
    assert (
        token.matches("s3cret-operator-token")
        and not token.matches("s3cret-operator-token ")
        and not token.matches("")
    )
    with pytest.raises(ValueError):
        OperatorToken.from_secret("  ")


@pytest.mark.timeout(90)
def test_a_client_that_keeps_presenting_wrong_tokens_must_wait(
    make_runtime: MakeRuntime, tmp_path: Path, clock: ManualClock
) -> None:
    """Wrong tokens were answered 401 as fast as they came: the token could be guessed by
    trying. After MAX_FAILURES of them a client gets 429 with Retry-After, even with the
    right token (else the lock would say which guess was right), until the lock ends."""
    rt = make_runtime(data_dir=tmp_path / "data")
    token = "s3cret-operator-token"
    srv = Served(app_for(rt, operator=OperatorToken.from_secret(token), clock=clock.now))
    right, read = {"Authorization": f"Bearer {token}"}, "/focal/notifications/read"
    try:
        for _ in range(3):  # no header at all is no guess: it never locks a client out
            assert srv.request("GET", "/focal")[0] == 401
        for n in range(MAX_FAILURES):
            assert srv.request("GET", "/focal", {"Authorization": f"Bearer guess-{n}"})[0] == 401
        for method, path in [("GET", "/focal"), ("POST", read), ("GET", "/cron/jobs")]:
            status, headers, body = srv.exchange(method, path, right)
            assert status == 429, (path, status)
            assert body["error"] == "too_many_tries"
            assert 1 <= int(headers["Retry-After"]) <= LOCKOUT
            assert token not in json.dumps(body)
        assert srv.request("GET", "/healthz")[0] == 200  # open routes stay open
        clock.advance(LOCKOUT)
        assert srv.request("GET", "/focal", right)[0] == 200
        # The right token forgot the failures: one wrong try more is a 401, not a lock.
        assert srv.request("GET", "/focal", {"Authorization": "Bearer guess"})[0] == 401
        assert srv.request("GET", "/focal", right)[0] == 200
    finally:
        srv.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "secret", ["abc", "op-secret", "x" * (MIN_LENGTH - 1), " " + "x" * (MIN_LENGTH - 1) + " "]
)
def test_an_operator_token_too_short_to_resist_guessing_is_refused(secret: str) -> None:
    """A 3-letter token was taken: anyone reaching the API could guess it. The error
    says why and never quotes the token."""
    with pytest.raises(ValueError) as info:
        OperatorToken.from_secret(secret)
    assert str(MIN_LENGTH) in str(info.value) and secret.strip() not in str(info.value)
    assert OperatorToken.from_secret("x" * MIN_LENGTH).matches("x" * MIN_LENGTH)


def test_notifications_feed_and_mark_read(served: tuple[Served, Runtime]) -> None:
    srv, rt = served
    rt.focal.notify("deploy finished", "focal_wakeup")
    status, body = srv.request("GET", "/focal/notifications")
    assert status == 200 and body["unread"] == 1
    assert [n["text"] for n in body["notifications"]] == ["deploy finished"]
    assert srv.request("POST", "/focal/notifications/read")[0] == 403
    assert srv.request("POST", "/focal/notifications/read", {"X-Kinbox": "1"})[1]["unread"] == 0


def test_the_app_mounts_into_a_hosts_own_asgi_app(
    make_runtime: MakeRuntime, tmp_path: Path
) -> None:
    rt = make_runtime(data_dir=tmp_path / "data")
    host = Starlette(routes=[Mount("/kinbox", app=app_for(rt))])
    srv = Served(host)
    try:
        status, body = srv.request("GET", "/kinbox/focal")
        assert status == 200 and body["chat_id"] == FOCAL_ID
    finally:
        srv.close()


@pytest.mark.timeout(60)
def test_kinbox_serve_binds_loopback_and_answers(tmp_path: Path) -> None:
    env = {**os.environ, "KINBOX_HOME": str(tmp_path)}
    # Port 0, and the port it says: one chosen free here could be taken before it binds.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kinbox.actors",
            "serve",
            "--port",
            "0",
            "--db",
            f"sqlite:///{tmp_path / 'serve.db'}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = ""
        while "kinbox serving" not in line:
            line = proc.stdout.readline()
            assert line, "kinbox serve exited before it said where it serves"
        assert "kinbox serving http://127.0.0.1:" in line, line  # loopback
        port = int(line.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/focal", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(answers, timeout=30, what="kinbox serve to answer")
    finally:
        proc.terminate()
        proc.wait(10)


class BrokenBackend:
    """A backend whose every call fails, as a runtime whose database went away would."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: object) -> Any:
            raise RuntimeError("database is gone")

        return fail


def test_a_failing_backend_answers_json_500_and_the_server_keeps_serving() -> None:
    srv = Served(create_app(BrokenBackend()))  # type: ignore[arg-type]
    try:
        status, body = srv.request("GET", "/focal")
        assert (status, body["error"]) == (500, "execution_failed")
        assert "database is gone" not in body["message"]  # internals stay in the log
        assert srv.request("GET", "/")[0] == 200
    finally:
        srv.close()


@pytest.mark.parametrize(
    ("header", "host"),
    [
        ("127.0.0.1:8765", "127.0.0.1"),
        ("Kinbox.Test", "kinbox.test"),
        ("[::1]:80", "[::1]"),
        ("[::1]", "[::1]"),
        ("kinbox.test:", "kinbox.test:"),
        ("", ""),
    ],
)
def test_host_of_strips_the_port_only(header: str, host: str) -> None:
    assert host_of(header) == host


def test_the_host_guard_matches_exact_names_and_subdomain_patterns() -> None:
    guard = HostGuard(Starlette(), ["Kinbox.Test", "*.example.com", "::1"])
    assert guard.allows("kinbox.test") and guard.allows("[::1]")
    assert guard.allows("api.example.com") and guard.allows("a.b.example.com")
    assert not guard.allows("example.com") and not guard.allows("evilexample.com")
    assert not guard.allows("kinbox.test.evil") and not guard.allows("")
    for bad in ("bad host/x", "", "a_b c", "http://x"):
        with pytest.raises(ValueError):
            allowed_name(bad)


@pytest.mark.parametrize("name", ["kinbox.example.com:8765", "localhost:8765",
                                  "10.0.0.5:8765", "*.example.com:443"])
def test_an_allowed_host_given_with_its_port_is_told_to_leave_the_port_out(name: str) -> None:
    """``--allow-host kinbox.example.com:8765`` was refused as "not a host name ...
    (expected a name such as kinbox.example, *.example.com or an IP)", which the name is:
    only a name whose letters are hex digits was told to give it without its port."""
    with pytest.raises(ValueError, match="without a port"):
        allowed_name(name)
    assert allowed_name("::1") == "[::1]" and allowed_name("[::1]") == "[::1]"


@pytest.mark.parametrize("pattern", ["*.com", "*.Test", "*.co"])
def test_a_subdomain_pattern_of_a_whole_top_level_domain_is_refused(pattern: str) -> None:
    """``*.com`` was taken as any subdomain pattern: every name under .com passed the Host
    guard, so a page on any .com domain an attacker registers could reach the server by DNS
    rebinding, the attack the guard is there to stop."""
    with pytest.raises(ValueError, match="top-level"):
        allowed_name(pattern)
    assert allowed_name("*.localhost") == "*.localhost"  # names only this machine resolves
    assert allowed_name("*.Example.com") == "*.example.com"


def test_healthz_without_the_token_names_what_failed_but_not_the_drivers_text(
    make_runtime: MakeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a token set, /healthz still answers anyone (a load balancer has no token), and
    its failed checks carried the driver's text (a host, a user, a table) to them."""
    from kinbox.actors import health
    from kinbox.persistence.driver_errors import OperationalError

    rt = make_runtime(data_dir=tmp_path / "data")

    def failing_read(self: Any, ctx: Any, timeout: float) -> None:
        raise OperationalError('connection to server at "10.0.0.5" failed for user "kinbox"')

    monkeypatch.setattr(health.HealthChecks, "_read", failing_read)
    srv = Served(app_for(rt, operator=OperatorToken.from_secret("s3cret-operator-token")))
    try:
        status, body = srv.request("GET", "/healthz")
        assert (status, body["checks"]["database"]["ok"]) == (503, False)
        assert "10.0.0.5" not in json.dumps(body)
        assert body["checks"]["database"]["error"] == "OperationalError"
        assert body["checks"]["database"]["error_type"] == "OperationalError"
        status, body = srv.request(
            "GET", "/healthz", {"Authorization": "Bearer s3cret-operator-token"}
        )
        assert "10.0.0.5" in body["checks"]["database"]["error"]  # the operator sees why
        assert body["checks"]["database"]["error_type"] == "OperationalError"
    finally:
        srv.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("hosts", [["kinbox.example.com"], ["127.0.0.1", "10.0.0.5"],
                                   ["*.example.com"], ["[2001:db8::1]"]])
def test_an_app_answering_other_machines_needs_a_token_or_an_explicit_opt_in(
        hosts: list[str]) -> None:
    """Reads hold message bodies and a POST needs only ``X-Kinbox: 1``: an app answering a
    name others reach, with no token, served them to anyone who could reach it."""
    with pytest.raises(ExposedWithoutToken) as info:
        create_app(BrokenBackend(), hosts)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert set(info.value.hosts) == {h for h in hosts if h not in LOOPBACK_HOSTS}
    token = OperatorToken.from_secret("s3cret-operator-token")
    create_app(BrokenBackend(), hosts, token)  # type: ignore[arg-type]
    create_app(BrokenBackend(), hosts, allow_unauthenticated=True)  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_app_for_refuses_a_name_others_reach_without_a_token(
        make_runtime: MakeRuntime) -> None:
    """A bind to every interface (``host="0.0.0.0"``) too: the Host check stops a browser,
    not a client elsewhere that sends ``Host: localhost`` itself."""
    rt = make_runtime(brain=quiet_brain)
    for options in ({"allowed_hosts": ["kinbox.example.com"]}, {"host": "192.168.1.5"},
                    {"host": "0.0.0.0"}, {"host": "::"}):
        with pytest.raises(ConfigError) as info:
            app_for(rt, **options)  # type: ignore[arg-type]
        assert info.value.field == "operator"
        app_for(rt, **options, operator=OperatorToken.from_secret("s3cret-operator-token"))
        app_for(rt, **options, allow_unauthenticated=True)  # type: ignore[arg-type]
    for host in ("127.0.0.1", "localhost", "::1", "[::1]"):
        app_for(rt, host=host)
    app_for(rt, allowed_hosts=["localhost", "127.0.0.2"])
