"""``kinbox serve`` and ``kinbox worker`` as real subprocesses on real ports (issue 11: 1, 4, 8).

Each test starts the command the way an operator would, talks to it over
HTTP on 127.0.0.1 and reads the journal it left behind.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import Runtime

from .helpers import end_database_sessions, wait_for

PRODUCT_BRAIN = """
import pathlib
import threading


def brain(turn):
    turn.reply("pong")


def polite(turn):
    # A long turn that ends when the runtime asks it to stop, saying so (one that said
    # nothing would be handed back, to run again at the next start).
    pathlib.Path("turn-started").write_text(turn.session_id)
    turn.wait_stop_requested(60)
    turn.reply("stopped before the end")


def environ(turn):
    # What a tool or a subprocess the brain starts would inherit.
    import os
    turn.reply(repr(os.environ.get("KINBOX_OPERATOR_TOKEN")))


def slow(turn):
    # Announce the turn, then hold it far past the runtime's stop timeout.
    pathlib.Path("turn-started").write_text(turn.session_id)
    threading.Event().wait(60)
"""


class Command:
    """A ``kinbox`` subprocess whose output lines are collected as they come."""

    def __init__(self, cwd: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kinbox.actors", *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # faulthandler: a process that dies of a signal says where each thread was.
            env={**os.environ, "KINBOX_HOME": str(cwd), "PYTHONFAULTHANDLER": "1", **(env or {})},
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))

    def wait_line(self, needle: str, timeout: float = 30.0) -> str:
        """The first output line containing ``needle`` (fails after ``timeout``)."""
        deadline = time.monotonic() + timeout
        for line in self.lines:
            if needle in line:
                return line
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no line with {needle!r} within {timeout}s: {self.lines}")
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            self.lines.append(line)
            if needle in line:
                return line

    def finish(self, timeout: float = 30.0) -> int:
        """Wait for the exit status and collect the rest of the output."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with pytest.raises(AssertionError):
                self.wait_line("\0never", timeout=0.5)
            raise AssertionError(f"still running after {timeout}s; output: {self.lines}") from None
        with pytest.raises(AssertionError):
            self.wait_line("\0never", timeout=0.5)  # drain what the reader still holds
        if rc < 0:  # no test sends a signal it does not handle: show where it died
            raise AssertionError(f"killed by signal {-rc}; output: {self.lines[-80:]}")
        return rc

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def run_kinbox(tmp_path: Path) -> Iterator[Any]:
    (tmp_path / "product_brain.py").write_text(PRODUCT_BRAIN)
    started: list[Command] = []

    def run(*args: str, env: dict[str, str] | None = None) -> Command:
        cmd = Command(tmp_path, *args, env=env)
        started.append(cmd)
        return cmd

    yield run
    for cmd in started:
        cmd.kill()


def served_port(cmd: Command) -> int:
    line = cmd.wait_line("serving http://")
    return int(line.split("serving http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


def get(
    port: int, path: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def seed_pending(url: str) -> str:
    """One pending row for a fresh session; returns the session id."""
    with Runtime(db=url) as rt:
        project = rt.project("web") or rt.create_project("web")
        session = rt.create_session(project.id, "chat")
        rt.post(session.id, "ping", message_id="msg-ping")
        return session.id


def journal(url: str, session_id: str) -> tuple[dict[str, Any], list[str]]:
    """The seeded row and the session's transcript texts, read by a send-only runtime."""
    with Runtime(db=url) as rt:
        return rt.inbox()[0], [e.text for e in rt.transcript(session_id)]


def delivered(url: str) -> bool:
    with Runtime(db=url) as rt:
        return bool(rt.inbox(state="delivered"))


# -- item 1: a process without a brain consumes nothing --------------------------------------

THREAD_PROBE = """
import atexit, os, sys


def _last() -> None:  # registered first, so it runs last of every exit hook
    with open(os.environ["KINBOX_TEST_THREADS_AT_EXIT"], "w") as out:
        out.write(str(len(sys._current_frames()) - 1))


atexit.register(_last)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["send-only", "delivering"])
def test_serve_stopped_by_a_signal_leaves_no_thread_running_into_finalization(
    run_kinbox: Any, tmp_path: Path, mode: str
) -> None:
    """Threads still running Python (or closing a database connection) while the
    interpreter finalizes can crash it: a rare SIGSEGV at exit. The HTTP thread was never
    waited for (a signal raised inside ``Thread.join`` marks the thread stopped on Python
    3.11: the next join returns at once), and its workers were daemons. At the last exit
    hook, no thread but the main one may still have a thread state."""
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "sitecustomize.py").write_text(THREAD_PROBE)
    count = tmp_path / "threads-at-exit"
    url = f"sqlite:///{tmp_path / 'k.db'}"
    args = ["serve", "--port", "0", "--db", url]
    if mode == "delivering":
        args += ["--brain", "product_brain:brain"]
    cmd = run_kinbox(
        *args,
        env={
            "PYTHONPATH": os.pathsep.join(
                [str(tmp_path / "probe"), str(tmp_path), os.environ.get("PYTHONPATH", "")]
            ),
            "KINBOX_TEST_THREADS_AT_EXIT": str(count),
        },
    )
    port = served_port(cmd)
    assert get(port, "/healthz")[0] == 200
    cmd.proc.send_signal(signal.SIGTERM)
    assert cmd.finish() == 0
    assert count.read_text() == "0"


@pytest.mark.timeout(90)
def test_serve_without_a_brain_is_send_only_and_leaves_pending_rows_alone(
    run_kinbox: Any, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    session_id = seed_pending(url)
    cmd = run_kinbox("serve", "--port", "0", "--db", url)
    port = served_port(cmd)
    assert "send-only" in cmd.wait_line("send-only")
    status, health = get(port, "/healthz")
    assert status == 200 and health["checks"]["dispatcher"]["state"] == "send-only"
    # A delivering runtime beside it sees the row still pending: serve claimed nothing.
    row, _ = journal(url, session_id)
    assert (row["status"], row["attempts"]) == ("pending", 0)
    cmd.proc.send_signal(signal.SIGINT)
    assert cmd.finish() == 0
    row, transcript = journal(url, session_id)
    assert (row["status"], row["attempts"], transcript) == ("pending", 0, [])


def product_brain(turn: Any) -> None:
    for message in turn.messages:
        turn.reply(f"product answers {message.content}")


@pytest.mark.timeout(120)
def test_a_send_only_serve_beside_a_products_runtime_answers_none_of_its_messages(
    run_kinbox: Any, any_db_url: str
) -> None:
    with Runtime(db=any_db_url, brain=product_brain) as product:
        project = product.create_project("web")
        sessions = [product.create_session(project.id, f"chat {i}").id for i in range(5)]
        cmd = run_kinbox("serve", "--port", "0", "--db", any_db_url)
        port = served_port(cmd)
        assert get(port, "/healthz")[0] == 200
        for i in range(10):
            product.post(sessions[i % 5], f"q{i}", message_id=f"live-{i}")
        product.run_until_idle(timeout=60)
        answers = [e.text for s in sessions for e in product.transcript(s) if e.role == "assistant"]
        assert sorted(answers) == sorted(f"product answers q{i}" for i in range(10))
        assert {r["status"] for r in product.inbox()} == {"delivered"}
        assert set(product.marker_counts().values()) == {1}
        cmd.proc.send_signal(signal.SIGTERM)
        assert cmd.finish() == 0


@pytest.mark.timeout(90)
def test_serve_with_a_brain_delivers_with_that_brain(run_kinbox: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    session_id = seed_pending(url)
    cmd = run_kinbox("serve", "--port", "0", "--db", url, "--brain", "product_brain:brain")
    port = served_port(cmd)
    assert "product_brain:brain" in cmd.wait_line("delivering")
    wait_for(lambda: delivered(url), timeout=30, what="serve to deliver the pending row")
    assert journal(url, session_id)[1] == ["ping", "pong"]
    status, health = get(port, "/healthz")
    assert status == 200 and health["checks"]["dispatcher"]["ok"] is True
    cmd.proc.send_signal(signal.SIGTERM)
    assert cmd.finish() == 0


@pytest.mark.timeout(90)
def test_worker_delivers_with_its_brain_and_stops_gracefully_on_sigint(
    run_kinbox: Any, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    session_id = seed_pending(url)
    keys = tmp_path / "shared-key"  # the device key every process on this database uses
    cmd = run_kinbox(
        "worker", "--db", url, "--brain", "product_brain:brain", "--data-dir", str(keys)
    )
    cmd.wait_line("delivering")
    wait_for(lambda: delivered(url), timeout=30, what="the worker to deliver")
    assert journal(url, session_id)[1] == ["ping", "pong"]
    assert (keys / "device_key.pem").is_file()  # made by the worker: no one else uses it
    cmd.proc.send_signal(signal.SIGINT)
    assert cmd.finish() == 0
    assert "stopped" in cmd.output and "Traceback" not in cmd.output


@pytest.mark.timeout(90)
@pytest.mark.parametrize("command", [["worker"], ["serve", "--port", "0"]])
def test_a_delivering_process_whose_database_sessions_end_exits_with_one_line(
    run_kinbox: Any, pg_url: str, command: list[str]
) -> None:
    """A PostgreSQL restart ends every session: a worker logged a traceback five times a
    second and never delivered again. It exits 1 now, for its supervisor to restart it."""
    cmd = run_kinbox(*command, "--db", pg_url, "--brain", "product_brain:brain")
    cmd.wait_line("delivering")
    end_database_sessions(pg_url)
    assert cmd.finish() == 1
    assert "lost the database connection that holds its life lock" in cmd.output
    # Its last word is one line (the dispatcher may log the failed claims before the
    # tick's check of the life lock notices, as it logs any database error).
    assert (
        cmd.output.strip()
        .splitlines()[-1]
        .startswith(f"kinbox {command[0]}: the runtime is crashed; the journal cannot be read now")
    )


@pytest.mark.parametrize(
    "args",
    [
        ["worker"],
        ["worker", "--brain", "nope_module:brain"],
        ["worker", "--brain", "no-colon"],
        ["serve", "--brain", "product_brain:missing"],
    ],
)
def test_worker_and_serve_refuse_a_missing_or_wrong_brain_as_usage_errors(
    run_kinbox: Any, tmp_path: Path, args: list[str]
) -> None:
    cmd = run_kinbox(*args, "--db", f"sqlite:///{tmp_path / 'k.db'}")
    assert cmd.finish() == 2
    assert "--brain" in cmd.output and "Traceback" not in cmd.output
    assert not (tmp_path / "k.db").exists()


# -- item 4: the first signal stops gracefully, a second at once ------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("command", ["serve", "worker"])
def test_the_first_signal_stops_the_running_turn_and_says_what_was_done(
    run_kinbox: Any, tmp_path: Path, command: str
) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    seed_pending(url)
    extra = ["--port", "0"] if command == "serve" else []
    cmd = run_kinbox(command, *extra, "--db", url, "--brain", "product_brain:polite")
    cmd.wait_line("delivering")
    wait_for((tmp_path / "turn-started").exists, timeout=30, what="the turn to start")
    cmd.proc.send_signal(signal.SIGINT)
    assert cmd.finish(timeout=20) == 0
    assert "turns run: 1" in cmd.wait_line("stopped:")
    assert "Traceback" not in cmd.output


@pytest.mark.timeout(90)
def test_a_second_signal_stops_serve_at_once_and_the_journal_keeps_the_row(
    run_kinbox: Any, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    seed_pending(url)
    cmd = run_kinbox("serve", "--port", "0", "--db", url, "--brain", "product_brain:slow")
    served_port(cmd)
    wait_for((tmp_path / "turn-started").exists, timeout=30, what="the slow turn to start")
    cmd.proc.send_signal(signal.SIGINT)
    cmd.wait_line("stopping gracefully")
    cmd.proc.send_signal(signal.SIGINT)
    # 130 is the status of os._exit on the second signal; the graceful path, which waits
    # out the turn for the runtime's 10 s stop timeout, returns 0. (No wall-clock bound:
    # an exiting process waits for a commit's fsync in flight, slow on a busy disk.)
    assert cmd.finish(timeout=30) == 130
    assert "Traceback" not in cmd.output
    with Runtime(db=url) as rt:
        assert rt.inbox()[0]["status"] in ("pending", "processing")  # not lost, not delivered


# -- item 8: bind first, validate flags, non-loopback only by choice ---------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--port", "99999"],
        ["--port", "-1"],
        ["--port", "http"],
        ["--host", "0.0.0.0"],
        ["--host", "0.0.0.0", "--allow-host", "kinbox.test"],
        ["--allow-host", "bad host/x"],
        ["--allow-host", "kinbox.test"],
        ["--allow-host", "*"],
        ["--token-file", "/nonexistent/kinbox-token"],
    ],
)
def test_serve_rejects_bad_flags_with_a_usage_error(
    run_kinbox: Any, tmp_path: Path, args: list[str]
) -> None:
    cmd = run_kinbox(
        "serve", *args, "--db", f"sqlite:///{tmp_path / 'k.db'}", env={"KINBOX_OPERATOR_TOKEN": ""}
    )
    assert cmd.finish() == 2
    assert "usage:" in cmd.output and "Traceback" not in cmd.output
    assert "serving" not in cmd.output


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "token"),
    [
        # An empty bind address binds every interface, then failed as an allowed Host name
        # with a traceback, the runtime already started.
        (["--host", "", "--allow-host", "kinbox.test"], "op-secret-0123456789"),
        (["--host", "localhost:80", "--allow-host", "kinbox.test"], "op-secret-0123456789"),
        (["--host", "*.test", "--allow-host", "kinbox.test"], "op-secret-0123456789"),
        # A Host name with a port never matches (the port is not part of the name compared):
        # it was taken, and every request to that name was a 400.
        (["--host", "0.0.0.0", "--allow-host", "10.0.0.5:8765"], "op-secret-0123456789"),
        (["--host", "0.0.0.0", "--allow-host", "cafe:80"], "op-secret-0123456789"),
        # Every name under a top-level domain: any page on a .com domain passed the Host guard.
        (["--host", "0.0.0.0", "--allow-host", "*.com"], "op-secret-0123456789"),
        # An empty path served without a token, as if the flag were not given.
        (["--token-file", ""], ""),
        # A token a client cannot send as it is kept: servers read headers as Latin-1, so a
        # UTF-8 token was never matched (and a control character cannot be sent at all).
        (["--token-file", "TOKEN_FILE"], ""),
        ([], "p\u00e4ssw\u00f6rd-0123456789"),
        ([], "op\x7fsecret-0123456789"),
        # A token short enough to guess by trying was taken (any length was).
        ([], "op-secret"),
        (["--token-file", "SHORT_TOKEN_FILE"], ""),
    ],
    ids=[
        "empty-host",
        "host-with-port",
        "wildcard-host",
        "ipv4-with-port",
        "hex-with-port",
        "tld-pattern",
        "empty-token-file",
        "non-ascii-token-file",
        "non-ascii-token-env",
        "control-token",
        "short-token-env",
        "short-token-file",
    ],
)
def test_serve_refuses_an_address_host_or_token_it_could_not_use_as_a_usage_error(
    run_kinbox: Any, tmp_path: Path, args: list[str], token: str
) -> None:
    (tmp_path / "token").write_text("s\u00e9same-" + "x" * 16 + "\n", encoding="utf-8")
    (tmp_path / "short").write_text("sesame-short\n", encoding="utf-8")
    files = {"TOKEN_FILE": str(tmp_path / "token"), "SHORT_TOKEN_FILE": str(tmp_path / "short")}
    args = [files.get(a, a) for a in args]
    cmd = run_kinbox(
        "serve",
        "--port",
        "0",
        *args,
        "--db",
        f"sqlite:///{tmp_path / 'k.db'}",
        env={"KINBOX_OPERATOR_TOKEN": token},
    )
    assert cmd.finish(timeout=20) == 2
    assert "usage:" in cmd.output and "Traceback" not in cmd.output
    assert "serving" not in cmd.output
    assert not (tmp_path / "k.db").exists()  # refused before anything was opened
    for secret in ("s\u00e9same", "p\u00e4ssw", "op\x7fsecret", "op-secret", "sesame-short"):
        assert secret not in cmd.output  # the error names where the token came from only


def test_a_token_file_that_is_not_text_is_named_in_the_error(tmp_path: Path) -> None:
    from kinbox.actors.serve_flags import read_token

    path = tmp_path / "token"
    path.write_bytes(b"abc\xff\xfe")
    with pytest.raises(ValueError) as info:
        read_token(str(path))
    assert str(info.value) == f"--token-file {path}: not UTF-8 text"


def test_serve_binds_before_it_says_serving(run_kinbox: Any, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = run_kinbox("serve", "--port", str(port), "--db", f"sqlite:///{tmp_path / 'k.db'}")
        assert cmd.finish() == 1
    assert f"127.0.0.1:{port}" in cmd.output and "Traceback" not in cmd.output
    assert "serving" not in cmd.output
    assert not (tmp_path / "k.db").exists()  # nothing opened before the bind


@pytest.mark.timeout(90)
def test_a_non_loopback_bind_names_its_hosts_and_needs_the_operator_token(
    run_kinbox: Any, tmp_path: Path
) -> None:
    secret = "op-" + os.urandom(8).hex()
    (tmp_path / "token").write_text(secret + "\n")
    (tmp_path / "token").chmod(0o600)  # as an operator keeps it (else a warning of its own)
    cmd = run_kinbox(
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--allow-host",
        "kinbox.test",
        "--token-file",
        str(tmp_path / "token"),
        "--db",
        f"sqlite:///{tmp_path / 'k.db'}",
    )
    port = served_port(cmd)
    warning = cmd.wait_line("WARNING")
    assert "0.0.0.0" in warning and "kinbox.test" in warning
    named = {"Host": "kinbox.test"}
    assert get(port, "/focal", headers=named)[0] == 401  # reads hold message bodies
    assert get(port, "/focal", headers={**named, "Authorization": f"Bearer {secret}"})[0] == 200
    assert get(port, "/healthz", headers=named)[0] == 200
    status, body = get(port, "/focal", headers={"Host": "evil.example"})
    assert (status, body["error"]) == (400, "invalid_host")
    read = "/focal/notifications/read"
    assert get(port, read, "POST", {**named, "X-Kinbox": "1"})[0] == 401
    assert get(port, read, "POST", {**named, "Authorization": "Bearer wrong"})[0] == 401
    assert get(port, read, "POST", {**named, "Authorization": f"Bearer {secret}"})[0] == 200
    cmd.proc.send_signal(signal.SIGINT)
    assert cmd.finish() == 0
    assert secret not in cmd.output


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o600, 0o400], ids=oct)
def test_a_token_file_other_users_may_read_or_write_is_warned_of(
    run_kinbox: Any, tmp_path: Path, mode: int
) -> None:
    """``echo secret > token`` makes a file every local user can read (umask 022): they
    could then call every route. Serve says so at start, naming the file, never the
    token; a file of its user alone is taken in silence."""
    secret = "op-" + os.urandom(8).hex()
    token = tmp_path / "token"
    token.write_text(secret + "\n")
    token.chmod(mode)
    cmd = run_kinbox(
        "serve", "--port", "0", "--token-file", str(token), "--db", f"sqlite:///{tmp_path / 'k.db'}"
    )
    port = served_port(cmd)
    assert get(port, "/focal", headers={"Authorization": f"Bearer {secret}"})[0] == 200
    cmd.proc.send_signal(signal.SIGINT)
    assert cmd.finish() == 0
    warned = [line for line in cmd.lines if "WARNING" in line and str(token) in line]
    if mode & 0o077:
        assert len(warned) == 1, cmd.output
        assert f"{mode:o}" in warned[0] and "chmod 600" in warned[0]
    else:
        assert warned == [], cmd.output
    assert secret not in cmd.output


@pytest.mark.timeout(60)
def test_the_operator_token_may_come_from_the_environment(run_kinbox: Any, tmp_path: Path) -> None:
    cmd = run_kinbox(
        "serve",
        "--port",
        "0",
        "--db",
        f"sqlite:///{tmp_path / 'k.db'}",
        env={"KINBOX_OPERATOR_TOKEN": "env-secret-0123456789"},
    )
    port = served_port(cmd)
    read = "/focal/notifications/read"
    assert get(port, read, "POST", {"X-Kinbox": "1"})[0] == 401
    assert get(port, read, "POST", {"Authorization": "Bearer env-secret-0123456789"})[0] == 200
    cmd.proc.send_signal(signal.SIGTERM)
    assert cmd.finish() == 0
    assert "env-secret-0123456789" not in cmd.output


@pytest.mark.timeout(90)
def test_a_brain_and_what_it_starts_do_not_inherit_the_operator_token(
    run_kinbox: Any, tmp_path: Path
) -> None:
    """A token taken from ``$KINBOX_OPERATOR_TOKEN`` stayed in the environment of serve's
    process: every subprocess a brain or its tools started (a shell tool, a code runner
    the model drives) inherited the key to the whole HTTP API."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    session_id = seed_pending(url)
    secret = "op-" + os.urandom(8).hex()
    cmd = run_kinbox("serve", "--port", "0", "--db", url, "--brain", "product_brain:environ",
                     env={"KINBOX_OPERATOR_TOKEN": secret})
    port = served_port(cmd)
    wait_for(lambda: delivered(url), timeout=30, what="serve to deliver the pending row")
    assert journal(url, session_id)[1] == ["ping", "None"]
    assert get(port, "/focal", headers={"Authorization": f"Bearer {secret}"})[0] == 200
    cmd.proc.send_signal(signal.SIGTERM)
    assert cmd.finish() == 0


@pytest.mark.timeout(90)
def test_a_forwarded_for_header_does_not_give_a_token_guesser_a_fresh_address(
    run_kinbox: Any, tmp_path: Path
) -> None:
    """uvicorn took ``X-Forwarded-For`` from any connection on loopback (its default): a
    client reaching serve through a proxy on this machine that passes headers on as they
    came (a TCP forward, an SSH tunnel) named a new address with each wrong token and was
    never locked out. Serve keys the tries on the peer it hears, as the README says."""
    from kinbox.transport.token_tries import MAX_FAILURES

    secret = "op-" + os.urandom(8).hex()
    cmd = run_kinbox(
        "serve", "--port", "0", "--db", f"sqlite:///{tmp_path / 'k.db'}",
        env={"KINBOX_OPERATOR_TOKEN": secret},
    )
    port = served_port(cmd)
    for i in range(MAX_FAILURES):
        forged = {"Authorization": "Bearer wrong-guess-0123456789",
                  "X-Forwarded-For": f"10.9.0.{i}"}
        assert get(port, "/focal", headers=forged)[0] == 401
    right = {"Authorization": f"Bearer {secret}", "X-Forwarded-For": "10.9.1.1"}
    status, body = get(port, "/focal", headers=right)
    assert (status, body.get("error")) == (429, "too_many_tries"), body
    cmd.proc.send_signal(signal.SIGTERM)
    assert cmd.finish() == 0
    assert secret not in cmd.output


CRASH_WATCH = """
import pathlib
import threading

from kinbox.actors import exit_stop


def _watch():
    # Writes the file once a runtime of this process has crashed (its state is set
    # first thing in Runtime.crash): what the process itself looks at once a second.
    while not any(rt.state == "crashed" for rt in list(exit_stop._live)):
        threading.Event().wait(0.01)
    pathlib.Path("crashed").write_text("crashed")


threading.Thread(target=_watch, daemon=True).start()


def brain(turn):
    turn.reply("pong")
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("command", [["worker"], ["serve", "--port", "0"]])
def test_a_stop_signal_after_the_runtime_crashed_still_exits_1(
    run_kinbox: Any, pg_url: str, tmp_path: Path, command: list[str]
) -> None:
    """The process looks at its runtime once a second. A stop signal that came after the
    runtime had crashed (its database restarted) but before that look (a supervisor's
    stop, a deploy at the same moment) was taken for a graceful stop: "stopped", status
    0, and a supervisor that restarts on failure did not. The crash is the outcome."""
    (tmp_path / "watched_brain.py").write_text(CRASH_WATCH)
    cmd = run_kinbox(*command, "--db", pg_url, "--brain", "watched_brain:brain")
    cmd.wait_line("delivering")
    end_database_sessions(pg_url)
    wait_for(lambda: (tmp_path / "crashed").exists(), 60, "the runtime to crash")
    cmd.proc.send_signal(signal.SIGTERM)
    assert cmd.finish() == 1, cmd.output
    assert f"kinbox {command[0]}: the runtime is crashed" in cmd.output


@pytest.mark.timeout(120)
def test_a_send_only_serve_reads_on_a_bounded_number_of_database_connections(
        run_kinbox: Any, pg_url: str) -> None:
    """Each thread that runs an HTTP request's read keeps a database connection of its own,
    and the requests ran on anyio's default pool of 40 threads: a burst of requests that
    waited on the database (a lock, a slow server) left a send-only ``kinbox serve``
    holding some 40 PostgreSQL connections, for good, where the README counts about three;
    two or three such servers beside the workers took PostgreSQL's default 100, and every
    process then failed to connect. Now the requests' blocking calls share
    :data:`HTTP_THREADS` threads."""
    import psycopg2

    from kinbox.actors.serve import HTTP_THREADS

    cmd = run_kinbox("serve", "--port", "0", "--db", pg_url)
    port = served_port(cmd)
    admin = psycopg2.connect(pg_url)
    admin.autocommit = True
    locker = psycopg2.connect(pg_url)

    def count(where: str = "") -> int:
        with admin.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        f"current_database() AND pid <> pg_backend_pid() {where}")
            return int(cur.fetchone()[0])

    try:
        assert get(port, "/cron/runs")[0] == 200
        before = count()  # the server's, and the locker's
        with locker.cursor() as cur:  # every read of the runs waits for this lock
            cur.execute("LOCK TABLE cron_runs IN ACCESS EXCLUSIVE MODE")
        answers: list[int] = []
        requests = [threading.Thread(target=lambda: answers.append(get(port, "/cron/runs")[0]))
                    for _ in range(3 * HTTP_THREADS)]
        for r in requests:
            r.start()
        waiting = f"AND wait_event_type = 'Lock' AND pid <> {locker.get_backend_pid()}"
        wait_for(lambda: count(waiting) >= HTTP_THREADS, timeout=30,
                 what="the first requests to wait on the lock")
        # The others wait for a thread, not on the database (a bounded look: nothing more
        # should come, and without the bound all of them came at once).
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert count(waiting) <= HTTP_THREADS
            time.sleep(0.05)
        locker.rollback()
        for r in requests:
            r.join(30)
        assert answers == [200] * len(requests)
        assert count() <= before + HTTP_THREADS
    finally:
        locker.close()
        admin.close()
    cmd.proc.send_signal(signal.SIGINT)
    assert cmd.finish() == 0
