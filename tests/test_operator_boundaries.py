"""The operator's boundaries: the HTTP API on bad input or a stopped runtime, the CLI on
arguments it cannot use, and secrets and untrusted text in what either prints. Each
test failed on the code before its fix."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors.serve import app_for
from kinbox.persistence import NewMessage

from .conftest import Stores
from .helpers import lock_waits, wait_for
from .test_cli import ROOT
from .test_cron_social_http import SECRET, post, signed
from .test_http import Served

MakeRuntime = Callable[..., Runtime]
STATE = {"X-Kinbox": "1", "Content-Type": "application/json"}


def kinbox_bytes(*args: str | bytes) -> subprocess.CompletedProcess[bytes]:
    """The CLI as a shell runs it, with arguments that may be any bytes (as argv can)."""
    return subprocess.run([sys.executable, "-m", "kinbox.actors", *args], capture_output=True,
                          timeout=60, env=dict(os.environ), cwd=ROOT)


def one_line_error(done: subprocess.CompletedProcess[bytes]) -> str:
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 1, err
    assert "Traceback" not in err, err
    [line] = err.strip().splitlines()
    assert line.startswith("kinbox: ")
    return line


@pytest.fixture
def served(make_runtime: MakeRuntime, tmp_path: Path) -> Iterator[tuple[Served, Runtime]]:
    rt = make_runtime(brain=lambda turn: "ok", data_dir=tmp_path / "data")
    srv = Served(app_for(rt))
    yield srv, rt
    srv.close()


def add_job(srv: Served, **fields: Any) -> tuple[int, Any]:
    body = {"name": "n", "cron": "0 9 * * *", "prompt": "p", **fields}
    return post(srv, "/cron/jobs", json.dumps(body).encode(), STATE)


# -- HTTP: 500s on bad input ----------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_cron_expression_with_a_lone_surrogate_is_a_422_not_a_500(
        served: tuple[Served, Runtime]) -> None:
    srv, _rt = served
    status, body = add_job(srv, cron="\ud800 9 * * *")
    assert (status, body["error"]) == (422, "invalid_argument")
    assert srv.request("GET", "/cron/jobs") == (200, [])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("zone", ["Europe", "America", "x" * 300])
def test_a_time_zone_that_is_a_folder_or_too_long_is_a_422_not_a_500(
        served: tuple[Served, Runtime], zone: str) -> None:
    srv, _rt = served
    status, body = add_job(srv, timezone=zone)
    assert (status, body["error"]) == (422, "invalid_argument")
    assert "timezone" in body["message"]


@pytest.mark.timeout(60)
def test_cli_cron_add_with_a_folder_time_zone_names_the_time_zone(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    Stores(url).close()
    line = one_line_error(kinbox_bytes("cron", "add", "n", "--cron", "0 9 * * *", "--prompt",
                                       "p", "--timezone", "Europe", "--db", url))
    assert "time zone" in line and "site-packages" not in line


# -- HTTP: status codes that lie -------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["/focal", "/focal/panel"])
def test_focal_routes_of_a_stopped_runtime_answer_503_not_500(
        make_runtime: MakeRuntime, tmp_path: Path, path: str) -> None:
    rt = make_runtime(data_dir=tmp_path / "data")
    srv = Served(app_for(rt))
    try:
        rt.stop()  # a host app that mounts kinbox keeps serving after the runtime stops
        status, body = srv.request("GET", path)
        assert (status, body["error"]) == (503, "unavailable")
    finally:
        srv.close()


# -- secrets ----------------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("query", ["passw%6Frd=Sup3rSecret", "%70assword=Sup3rSecret",
                                   "sslpassw%6Frd=Sup3rSecret"])
def test_a_percent_encoded_password_parameter_is_masked_too(query: str) -> None:
    # libpq decodes the parameter's name: this is the password (see psycopg2's parse_dsn).
    url = f"postgresql://kinbox@127.0.0.1:1/x?{query}"
    done = kinbox_bytes("db", "status", "--db", url)
    assert done.returncode == 1
    assert b"Sup3rSecret" not in done.stderr + done.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize("url", [
    "postgresql:/kinbox:Sup3rSecret@127.0.0.1:1/x",  # one slash short of a URL
    "postgresql//kinbox:Sup3rSecret@127.0.0.1:1/x",
    "postgresql:kinbox:Sup3rSecret@127.0.0.1/x",
    "host=127.0.0.1 user=kinbox password='not Sup3rSecret'",  # libpq's key=value form
    "host=127.0.0.1 password=not\\ Sup3rSecret",
])
def test_a_mistyped_database_url_is_refused_without_its_password(url: str) -> None:
    """A URL that is not one (a slash or the colon left out, a libpq key=value string) is
    refused as an unsupported scheme, and that error quoted it whole: the password sat in
    the one line the operator, their terminal's scrollback and any CI log saw."""
    done = kinbox_bytes("db", "status", "--db", url)
    assert done.returncode == 1
    assert b"cannot open database" in done.stderr
    assert b"Sup3rSecret" not in done.stderr + done.stdout, done.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("url", [
    "host=127.0.0.1 user=kinbox password = Sup3rSecret dbname=x",  # blanks around the '='
    "host=127.0.0.1 password= Sup3rSecret",
    "host=127.0.0.1 password =Sup3rSecret",
    "host=127.0.0.1 password = 'not Sup3rSecret' dbname=x",
    "host=127.0.0.1 password='it\\'s Sup3rSecret' dbname=x",  # a quote escaped in quotes
])
def test_a_libpq_key_value_string_is_refused_without_its_password(url: str) -> None:
    """libpq allows blanks around a keyword's '=' (``password = secret``): the mask took
    the password for the next keyword and quoted it whole in the unsupported-scheme error."""
    done = kinbox_bytes("db", "status", "--db", url)
    assert done.returncode == 1
    assert b"cannot open database" in done.stderr
    assert b"Sup3rSecret" not in done.stderr + done.stdout, done.stderr


@pytest.mark.postgres
@pytest.mark.timeout(120)
@pytest.mark.parametrize("json_flag", [(), ("--json",)])
def test_db_status_masks_a_query_password_with_a_blank_in_it(pg_url: str,
                                                             json_flag: tuple[str, ...]) -> None:
    """A URL's query parameter runs to the next '&': the mask stopped at the blank, and
    `kinbox db status` printed the password's second word (trust auth: any password)."""
    url = pg_url + ("&" if "?" in pg_url else "?") + "password=Sup3r Secret"
    done = kinbox_bytes("db", "status", "--db", url, *json_flag)
    assert done.returncode == 3, done.stderr  # an empty database: its upgrade is pending
    assert b"Secret" not in done.stdout + done.stderr, done.stdout
    assert b"password=***" in done.stdout


SECRET_URL = "postgresql://kinbox:Sup3rSecret@127.0.0.1:1/x"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [
    ("--db", SECRET_URL, "db", "status"),  # --db before the command: read as the command
    ("db", "--db", SECRET_URL, "status"),
    ("db", "status", "--dbb", SECRET_URL),  # a mistyped flag: unrecognized arguments
    ("db", "status", f"--db={SECRET_URL}", "extra"),
    ("sessions", "list", "--limit", SECRET_URL),  # a URL pasted into the wrong option
])
def test_a_usage_error_does_not_echo_a_database_password(argv: tuple[str, ...]) -> None:
    """argparse quotes what it could not use ("invalid choice: 'postgresql://kinbox:
    Sup3rSecret@...'", "unrecognized arguments: ..."): a --db in the wrong place printed
    its password."""
    done = kinbox_bytes(*argv)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "usage: kinbox" in err and "error:" in err
    assert "Sup3rSecret" not in err + done.stdout.decode(), err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("password",
                         ["Sup3r\\Secret", "Sup3r'Sec\"ret", "Sup3rSecretLongerThanMost"])
@pytest.mark.parametrize("where", [("--db", "{url}", "db", "status"),  # invalid choice
                                   ("sessions", "list", "--limit", "{url}"),
                                   ("sessions", "list", "--after", "{url}")])  # quoted cut
def test_a_usage_error_does_not_echo_a_password_argparse_quotes_with_escapes(
        password: str, where: tuple[str, ...]) -> None:
    """argparse quotes the argument it refuses as Python's repr: a backslash doubled, a
    quote escaped. The mask looked for the password as typed, and the usage error
    printed one with a backslash or both quotes in it whole (``Sup3r\\\\Secret``). An
    ``--after`` quoted its first 40 characters: the start of a longer password."""
    url = f"postgresql://kinbox:{password}@127.0.0.1:1/x"
    done = kinbox_bytes(*(arg.format(url=url) for arg in where))
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "Sup3r" not in err and "Secret" not in err, err
    assert "postgresql://kinbox:***@127.0.0.1:1/x" in err, err


# -- CLI: tracebacks instead of one-line errors ----------------------------------------------

@pytest.fixture
def cli_db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    Stores(url).close()
    return url


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [("inbox", "list"), ("cron", "runs"), ("sessions", "list")])
def test_a_huge_limit_is_a_usage_error_not_a_traceback(cli_db: str,
                                                       command: tuple[str, str]) -> None:
    done = kinbox_bytes(*command, "--db", cli_db, "--limit", "99999999999999999999")
    err = done.stderr.decode()
    assert "Traceback" not in err, err
    assert done.returncode == 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args", [
    ("inbox", "show", b"m\xff"),
    ("inbox", "requeue", b"m\xff"),
    ("inbox", "cancel", b"m\xff", "--reason", "x"),
    ("inbox", "list", "--target", b"s\xff"),
    ("sessions", "list", "--project", b"p\xff"),
])
def test_an_argument_that_is_not_utf8_is_a_usage_error_not_a_traceback(
        cli_db: str, args: tuple[str | bytes, ...]) -> None:
    done = kinbox_bytes(*args, "--db", cli_db)
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("kinbox: error: argument ")
    assert "is not UTF-8 text" in err


# -- CLI: untrusted text reaches the operator's terminal raw ---------------------------------

@pytest.mark.timeout(60)
def test_cron_list_does_not_print_escape_sequences_from_a_job_added_over_http(
        served: tuple[Served, Runtime], db_url: str) -> None:
    srv, _rt = served
    status, _ = add_job(srv, name="digest\x1b]0;pwned\x07\x1b[2J\nfake-line")
    assert status == 201
    done = kinbox_bytes("cron", "list", "--db", db_url)
    assert done.returncode == 0, done.stderr
    assert b"\x1b" not in done.stdout and b"\x07" not in done.stdout
    assert len(done.stdout.decode().strip().splitlines()) == 1  # one job, one line


@pytest.mark.timeout(60)
def test_sessions_list_does_not_print_a_chat_users_escape_sequences(
        make_runtime: MakeRuntime, tmp_path: Path, db_url: str, clock: ManualClock) -> None:
    def brain(turn: Turn) -> str:
        return "ok"
    rt = make_runtime(brain=brain, data_dir=tmp_path / "data")
    rt.social.register_channel("slack", send=lambda route, text: None, secret=SECRET)
    rt.social.allow("slack", ["U1"])
    srv = Served(app_for(rt))
    name = "Ann\x1b[2J\x1b]0;pwned\x07"
    try:  # the display name is the chat user's to choose; only the id is authorized
        event = json.dumps({"sender_id": "U1", "sender_name": name,
                            "thread_id": "T1", "text": "hi"}).encode()
        status, body = post(srv, "/social/slack/events", event, signed(event, clock.now()))
        assert status == 422 and "sender_name" in body["message"]  # one line, no controls
    finally:
        srv.close()
    # Other titles are anyone's to choose too: the listing escapes what a terminal obeys.
    rt.create_session(None, f"slack: {name}", session_id="social-slack-T1")
    done = kinbox_bytes("sessions", "list", "--db", db_url)
    assert done.returncode == 0, done.stderr
    assert b"social-slack-T1" in done.stdout
    assert b"\x1b" not in done.stdout and b"\x07" not in done.stdout


# -- the event loop -------------------------------------------------------------------------

@pytest.mark.postgres
@pytest.mark.timeout(60)
def test_a_webhook_with_an_event_id_does_not_block_the_event_loop_on_the_database(
        make_runtime: MakeRuntime, pg_url: str, tmp_path: Path, clock: ManualClock) -> None:
    import psycopg2

    rt = make_runtime(db=pg_url, brain=lambda turn: "ok", data_dir=tmp_path / "data")
    rt.social.register_channel("slack", send=lambda route, text: None, secret=SECRET)
    rt.social.allow("slack", ["U1"])
    srv = Served(app_for(rt))
    locker = psycopg2.connect(pg_url)
    try:
        with locker.cursor() as cur:  # a slow database: here, a table lock held a while
            cur.execute("LOCK TABLE delivery_markers IN ACCESS EXCLUSIVE MODE")
        event = json.dumps({"sender_id": "U1", "thread_id": "T1", "text": "hi",
                            "event_id": "ev-1"}).encode()
        hook = threading.Thread(target=post, args=(srv, "/social/slack/events", event,
                                                   signed(event, clock.now())), daemon=True)
        hook.start()
        wait_for(lambda: lock_waits(pg_url) > 0, 20, what="the webhook to wait on the lock")
        began = time.monotonic()
        try:
            status, _ = srv.request("GET", "/", timeout=30)  # needs no database at all
        except OSError as exc:  # TimeoutError: the whole server is frozen
            pytest.fail(f"GET / did not answer while a webhook waited on the database: {exc!r}")
        assert status == 200 and time.monotonic() - began < 30  # the lock is still held
    finally:
        locker.rollback()
        locker.close()
        hook.join(20)
        srv.close()


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_scenario_json_report_masks_the_database_password(pg_url: str) -> None:
    scheme, _, rest = pg_url.partition("://")
    user, _, host = rest.partition("@")
    url = f"{scheme}://{user.split(':')[0]}:Sup3rSecret@{host}"  # trust auth: any password
    done = kinbox_bytes("scenario", "run", "hello", "--json", "--db", url)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert "Sup3rSecret" not in report["db"]
    assert b"Sup3rSecret" not in done.stdout


# -- CLI: a mistyped --db ---------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [("peers", "revoke", "abcdef123456"), ("peers", "list")])
def test_peers_commands_do_not_create_a_database_and_device_key_at_a_mistyped_path(
        tmp_path: Path, command: tuple[str, ...]) -> None:
    where = tmp_path / "tpyo"
    done = kinbox_bytes(*command, "--db", f"sqlite:///{where / 'kinbox.db'}")
    assert done.returncode == 1  # like `inbox list`: there is no database there
    assert not where.exists(), sorted(str(p) for p in where.rglob("*"))


# -- the Python API and HTTP disagree -----------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("limit", [10**20, -1, 0, True])
def test_cron_runs_refuses_the_limits_http_refuses(make_runtime: MakeRuntime, tmp_path: Path,
                                                   limit: Any) -> None:
    from kinbox.actors import KinboxError

    rt = make_runtime(brain=lambda turn: "ok", data_dir=tmp_path / "data")
    with pytest.raises(KinboxError):  # HTTP: 422 "limit must be a whole number 1..500"
        rt.cron.runs(limit=limit)


@pytest.mark.timeout(60)
def test_a_token_file_saved_with_a_utf8_bom_still_lets_the_operator_in(
        make_runtime: MakeRuntime, tmp_path: Path) -> None:
    from kinbox.actors.serve_flags import read_token

    token_file = tmp_path / "token"
    token_file.write_bytes(b"\xef\xbb\xbfs3cret-operator-token\r\n")  # Notepad / PowerShell
    operator = read_token(str(token_file))
    rt = make_runtime(data_dir=tmp_path / "data")
    srv = Served(app_for(rt, operator=operator))
    try:
        status, _ = srv.request("POST", "/focal/notifications/read",
                                {"Authorization": "Bearer s3cret-operator-token"})
        assert status == 200
    finally:
        srv.close()


@pytest.mark.parametrize("text", ["\u0668\u0668", "8_765", "+80", " 80x", "70000", ""])
def test_a_port_is_ascii_digits_in_range(text: str) -> None:
    """``int`` read other scripts' digits and underscores: ``--port 8_765`` served on
    8765, Arabic-Indic "88" on 88."""
    import argparse

    from kinbox.actors.serve_flags import port_number

    with pytest.raises(argparse.ArgumentTypeError):
        port_number(text)
    assert port_number("0") == 0 and port_number("8765") == 8765


# -- CLI: an empty --db is not "no --db" -----------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("args", [
    ("scenario", "run", "hello"),  # its default is a temporary file, not the user's database
    ("db", "upgrade"),
    ("db", "status"),
    ("inbox", "list"),
    ("cron", "add", "n", "--cron", "0 9 * * *", "--prompt", "p"),
    ("peers", "whoami"),
    ("serve", "--port", "0"),
    ("worker", "--brain", "json:loads"),
])
def test_an_empty_db_url_is_a_usage_error_and_touches_no_default_database(
        tmp_path: Path, args: tuple[str, ...]) -> None:
    """``--db "$UNSET_VARIABLE"`` ran on the default database ($KINBOX_HOME/kinbox.db, the
    user's own), creating it if need be; a scenario wrote its run there."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "KINBOX_DB"}
    done = subprocess.run([sys.executable, "-m", "kinbox.actors", *args, "--db", ""],
                          capture_output=True, text=True, timeout=90, cwd=ROOT,
                          env={**env, "KINBOX_HOME": str(home)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "argument --db: expected a database URL" in done.stderr
    assert not home.exists()


@pytest.mark.timeout(60)
def test_cron_runs_limit_is_checked_as_a_usage_error_with_the_range_it_takes(
        cli_db: str) -> None:
    """``cron runs --limit 600`` passed the flag's check (1 to 1,000,000) and failed as an
    error (status 1) in the store, which takes 1 to 500."""
    done = kinbox_bytes("cron", "runs", "--db", cli_db, "--limit", "501")
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err, err
    assert "expected a number from 1 to 500, got 501" in err
    assert kinbox_bytes("cron", "runs", "--db", cli_db, "--limit", "500").returncode == 0


# -- files: a database kinbox creates is its user's alone --------------------------------------

@pytest.mark.timeout(90)
def test_a_sqlite_database_kinbox_creates_is_readable_by_its_user_only(tmp_path: Path) -> None:
    """The file took the umask's mode (0644 under 022): in the data directory, a folder
    kinbox makes with its parents' default mode, every user of the machine could read every
    transcript. SQLite gives its WAL and shared-memory files the database file's mode."""
    home = tmp_path / "home"
    env = {**{k: v for k, v in os.environ.items() if k != "KINBOX_DB"},
           "KINBOX_HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "kinbox.actors", "db", "upgrade"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
                          umask=0o022)
    assert done.returncode == 0, done.stderr
    child = ("import json, os, sys\nfrom kinbox.actors import Runtime\n"
             "with Runtime(db='sqlite:///' + sys.argv[1], brain=lambda turn: 'ok') as rt:\n"
             "    rt.post(rt.create_session(None, 'a').id, 'hello')\n"
             "    rt.run_until_idle()\n"
             "    print(json.dumps({n: oct(os.stat(sys.argv[1] + n).st_mode & 0o777)\n"
             "                      for n in ('', '-wal', '-shm')}))\n")
    done = subprocess.run([sys.executable, "-c", child, str(tmp_path / "app.db")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
                          umask=0o022)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"": "0o600", "-wal": "0o600", "-shm": "0o600"}
    assert oct((home / "kinbox.db").stat().st_mode & 0o777) == "0o600"


@pytest.mark.timeout(60)
def test_an_empty_kind_filter_is_a_usage_error_as_an_empty_target_is(cli_db: str) -> None:
    """``--kind ""`` (an unset variable) filtered on a kind no row has: the command said
    "requeued 0 failed row(s)" with status 0, as if none had failed."""
    done = kinbox_bytes("inbox", "requeue", "--all-failed", "--kind", " ", "--db", cli_db)
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err, err
    assert "argument --kind: expected a message kind, got an empty one" in err


# -- CLI: every usage error exits 2 with the subcommand's usage ------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("args", [
    ("inbox", "requeue"),  # neither an id nor --all-failed
    ("inbox", "requeue", "m1", "--all-failed"),  # both
    ("inbox", "requeue", "m1", "--target", "s1"),  # a filter beside one id
    ("inbox", "requeue", "m1", "--kind", "chat"),
    ("inbox", "cancel", "m1", "--reason", " "),  # no reason given
    ("inbox", "cancel", "m1", "--reason", "r", "--by", " "),  # nobody
])
def test_requeue_and_cancel_usage_errors_exit_two_as_every_usage_error(
        cli_db: str, args: tuple[str, ...]) -> None:
    """``inbox requeue`` with neither an id nor ``--all-failed`` (or both, or a filter beside
    one id), and ``inbox cancel`` with a blank ``--reason``, exited 1 as if the database had
    refused: the README's usage errors exit 2, with the subcommand's usage line, before
    anything is opened."""
    done = kinbox_bytes(*args, "--db", cli_db)
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err, err
    assert f"usage: kinbox inbox {args[1]}" in err


# -- CLI: a refused change leaves the file as it was -----------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("args", [
    ("inbox", "requeue", "--all-failed"),
    ("inbox", "requeue", "m1"),
    ("inbox", "cancel", "m1", "--reason", "stale"),
    ("inbox", "prune", "--older-than", "40h"),
    ("cron", "pause", "j1"),
    ("peers", "pause", "abcdef123456"),
])
def test_a_change_refused_for_the_schema_leaves_a_sqlite_file_as_it_was(
        tmp_path: Path, args: tuple[str, ...]) -> None:
    """A command that changes the journal, pointed at a SQLite file that is not a kinbox
    database of the current schema (another program's, a mistyped --db), said "run `kinbox
    db upgrade`" and exited 1, but had already switched the file to WAL mode (and a new,
    empty file to a database of kinbox's page size): the README says it is left as it
    was."""
    path = tmp_path / "theirs.db"
    with sqlite3.connect(path) as con:  # another program's database, in rollback mode
        con.execute("CREATE TABLE notes (x TEXT)")
    con.close()
    empty = tmp_path / "empty.db"
    empty.touch()
    for file in (path, empty):
        before = file.read_bytes()
        done = kinbox_bytes(*args, "--db", f"sqlite:///{file}")
        err = done.stderr.decode()
        assert done.returncode == 1 and "kinbox db upgrade" in err, err
        assert file.read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db", "theirs.db"]


# -- CLI: a corrupt SQLite file is one line, not a traceback ---------------------------------

@pytest.fixture
def damaged_db(tmp_path: Path) -> str:
    """A journal of 3,000 rows whose middle pages are overwritten with garbage (a disk
    error, a copy taken mid-write): its header and schema read fine, its rows do not."""
    url = f"sqlite:///{tmp_path / 'damaged.db'}"
    s = Stores(url)
    s.store.create_session("s1", None, "Worker", "interactive", 0)
    for i in range(3000):
        s.journal.enqueue(NewMessage(f"m{i}", "s1", f"body {i}"), 0)
    s.close()
    path = tmp_path / "damaged.db"
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 20_000] = random.Random(1).randbytes(20_000)
    path.write_bytes(bytes(data))
    return url


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args", [
    ("inbox", "list", "--limit", "3000"),
    ("inbox", "prune", "--older-than", "40h", "--dry-run"),
    ("inbox", "requeue", "--all-failed"),
    ("db", "status"),
])
def test_a_damaged_sqlite_file_is_a_one_line_error_not_a_traceback(
        damaged_db: str, args: tuple[str, ...]) -> None:
    """SQLite reads a result's rows as they are fetched, after the statement ran: a damaged
    page met then ("database disk image is malformed") came out of ``inbox list`` and
    ``inbox prune --dry-run`` as a Python traceback, not the one line every other error
    is."""
    one_line_error(kinbox_bytes(*args, "--db", damaged_db))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [("db", "status"), ("db", "upgrade"), ("inbox", "list"),
                                     ("inbox", "requeue", "--all-failed")])
def test_a_home_folder_of_no_user_is_a_one_line_error_not_a_traceback(
        command: tuple[str, ...]) -> None:
    """``--db sqlite:///~someone/kinbox.db`` for a user this machine has not (a path
    copied from another machine) failed with a traceback ending in ``RuntimeError: Could
    not determine home directory``."""
    one_line_error(kinbox_bytes(*command, "--db", "sqlite:///~no-such-user-kinbox/k.db"))


# -- CLI: --json is JSON ---------------------------------------------------------------------

def _strict_json(text: str) -> Any:
    """``text`` read as JSON is written: Python's reader takes NaN and Infinity, which
    no other does (jq, JavaScript)."""
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.timeout(60)
def test_inbox_show_json_of_a_payload_holding_nan_is_json(cli_db: str) -> None:
    """``rt.post`` took a payload holding ``float('nan')`` or ``inf`` (Python's json writes
    them), and ``inbox show --json`` printed ``NaN`` and ``Infinity``: no JSON reader but
    Python's takes them, so the operator's script (jq) failed on the row it had to look
    at. They print as the strings "NaN", "Infinity" and "-Infinity"."""
    s = Stores(cli_db)
    s.store.create_session("s1", None, "Worker", "interactive", 0)
    s.journal.enqueue(NewMessage("odd", "s1", "body", payload={
        "x": float("nan"), "up": [float("inf")], "down": {"y": float("-inf")}, "n": 1.5}), 0)
    s.close()
    done = kinbox_bytes("inbox", "show", "odd", "--json", "--db", cli_db)
    assert done.returncode == 0, done.stderr.decode()
    shown = _strict_json(done.stdout.decode())
    assert shown["payload"] == {"x": "NaN", "up": ["Infinity"], "down": {"y": "-Infinity"},
                                "n": 1.5}


@pytest.mark.timeout(60)
def test_db_upgrade_of_a_table_kinbox_did_not_make_is_a_one_line_error(tmp_path: Path) -> None:
    """A file holding another program's table under a name kinbox uses (here
    ``agent_inbox_messages`` with a column of its own): ``db upgrade`` failed with a
    traceback ending in playhouse's ``ValueError: message_id is not null but has no
    default``. It is a one-line error now, and the file keeps its table as it was."""
    path = tmp_path / "theirs.db"
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE agent_inbox_messages (x INTEGER)")
    con.close()
    line = one_line_error(kinbox_bytes("db", "upgrade", "--db", f"sqlite:///{path}"))
    assert "agent_inbox_messages" in line
    with sqlite3.connect(path) as con:
        columns = [r[1] for r in con.execute("PRAGMA table_info(agent_inbox_messages)")]
    con.close()
    assert columns == ["x"]
