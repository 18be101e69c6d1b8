"""The command line as a user runs it: a real subprocess against a real database file."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kinbox.persistence import NewMessage

from .conftest import Stores

ROOT = Path(__file__).resolve().parent.parent


def kinbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kinbox.actors", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})}, cwd=ROOT)


@pytest.fixture
def failed_row_db(db_url: str) -> str:
    """A database with one delivered, one pending and one failed row."""
    s = Stores(db_url)
    s.store.create_session("s1", None, "Worker", "interactive", 0)
    for mid in ("ok", "stuck", "waiting"):
        s.journal.enqueue(NewMessage(mid, "s1", f"body of {mid}"), 0)
    s.journal.claim("w", 0)
    s.journal.complete_turn("w", "s1", ["ok"], [], 0)
    s.journal.claim("w", 0)
    s.journal.retry("w", "stuck", "boom", 0, permanent=True)
    s.close()
    return db_url


def test_scenario_run_prints_a_report_and_exits_zero(tmp_path: Path) -> None:
    diagram = tmp_path / "hello.md"
    result = kinbox("scenario", "run", "scenarios/hello.py", "--diagram", str(diagram))
    assert result.returncode == 0, result.stderr
    assert "[PASS] each message committed exactly one turn" in result.stdout
    assert "result: ok" in result.stdout
    assert diagram.read_text().count("->>") == 3
    assert "sequenceDiagram" in diagram.read_text()


def test_scenario_reports_are_the_same_for_the_same_seed() -> None:
    runs = [json.loads(kinbox("scenario", "run", "scenarios/hello.py", "--json",
                              "--seed", "3").stdout) for _ in range(2)]
    for r in runs:
        r.pop("db")
    assert runs[0] == runs[1]


def test_a_failing_expectation_exits_one(tmp_path: Path) -> None:
    script = tmp_path / "bad.py"
    script.write_text("def run(sc):\n    sc.start()\n    sc.expect(1 == 2, 'one is two')\n")
    result = kinbox("scenario", "run", str(script))
    assert result.returncode == 1
    assert "[FAIL] one is two" in result.stdout


@pytest.mark.parametrize("args", [
    ("scenario", "run", "no/such/file.py"),
    ("scenario", "run"),
    ("inbox", "list", "--state", "lost"),
    ("inbox", "list", "--limit", "0"),
    ("sessions", "list", "--limit", "0"),
    ("sessions", "list", "--limit", "ten"),
    ("sessions", "list", "--offset", "-1"),
    ("frobnicate",),
])
def test_usage_errors_exit_two(args: tuple[str, ...]) -> None:
    result = kinbox(*args)
    assert result.returncode == 2
    assert result.stderr.strip()


def test_inbox_list_filters_by_state_and_hides_bodies(failed_row_db: str) -> None:
    result = kinbox("inbox", "list", "--db", failed_row_db, "--state", "failed", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["items"]
    assert [r["message_id"] for r in rows] == ["stuck"]
    assert "content" not in rows[0]
    text = kinbox("inbox", "list", "--db", failed_row_db)
    assert "body of" not in text.stdout and "stuck" in text.stdout


def test_the_database_can_come_from_kinbox_db(failed_row_db: str) -> None:
    result = kinbox("inbox", "list", "--json", env={"KINBOX_DB": failed_row_db})
    assert len(json.loads(result.stdout)["items"]) == 3


def test_inbox_show_prints_the_row_and_its_history(failed_row_db: str) -> None:
    result = kinbox("inbox", "show", "stuck", "--db", failed_row_db, "--json")
    row = json.loads(result.stdout)
    assert row["status"] == "failed" and row["content"] == "body of stuck"
    assert [h["event"] for h in row["history"]] == ["failed"]


def test_requeue_moves_only_failed_rows_back_to_pending(failed_row_db: str) -> None:
    refused = kinbox("inbox", "requeue", "waiting", "--db", failed_row_db)
    assert refused.returncode == 1
    assert "cannot requeue a row in state 'pending'" in refused.stderr
    missing = kinbox("inbox", "requeue", "nope", "--db", failed_row_db)
    assert missing.returncode == 1 and "no inbox row" in missing.stderr
    ok = kinbox("inbox", "requeue", "stuck", "--db", failed_row_db)
    assert ok.returncode == 0, ok.stderr
    row = json.loads(kinbox("inbox", "show", "stuck", "--db", failed_row_db, "--json").stdout)
    assert (row["status"], row["attempts"]) == ("pending", 0)
    assert [h["event"] for h in row["history"]] == ["failed", "requeued"]


def test_sessions_list_and_db_status(failed_row_db: str) -> None:
    sessions = json.loads(kinbox("sessions", "list", "--db", failed_row_db, "--json").stdout)
    assert [s["id"] for s in sessions["items"]] == ["s1"]
    status = json.loads(kinbox("db", "status", "--db", failed_row_db, "--json").stdout)
    assert status["up_to_date"] is True
    assert status["rows"] == {"delivered": 1, "failed": 1, "pending": 1, "processing": 0,
                              "cancelled": 0}


def test_sessions_list_shows_a_page_and_says_how_to_see_the_next(db_url: str) -> None:
    """A listing was every session the database ever had (cron runs and sub-agents make
    thousands): now the newest 100, or ``--limit``, from ``--offset`` on."""
    s = Stores(db_url)
    s.store.create_many([(f"s{i:03d}", None, f"t{i}", "cron") for i in range(103)], 0)
    s.close()

    def listed(*args: str) -> list[str]:
        done = kinbox("sessions", "list", "--db", db_url, "--json", *args)
        assert done.returncode == 0, done.stderr
        return [row["id"] for row in json.loads(done.stdout)["items"]]
    # One creation time: newest first is by id, descending.
    ids = [f"s{i:03d}" for i in reversed(range(103))]
    assert listed() == ids[:100]
    assert listed("--limit", "2", "--offset", "100") == ids[100:102]
    assert listed("--limit", "1000") == ids
    text = kinbox("sessions", "list", "--db", db_url, "--limit", "2").stdout.splitlines()
    assert len(text) == 4 and text[3].startswith("... more: --after ")
    assert text[3].endswith(" lists the next 2")
    assert listed("--limit", "2", "--after", text[3].split()[3]) == ids[2:4]
    assert text[1].startswith("s102 ") and text[2].startswith("s101 ")
    last = kinbox("sessions", "list", "--db", db_url, "--limit", "3", "--offset", "100")
    assert not any(line.startswith("...") for line in last.stdout.splitlines())
    beyond = kinbox("sessions", "list", "--db", db_url, "--offset", "200")
    assert beyond.stdout == "no sessions from offset 200\n"
    bad = kinbox("sessions", "list", "--db", db_url, "--limit", "0")
    assert bad.returncode == 2 and "--limit" in bad.stderr and "from 1 to" in bad.stderr


def test_an_unknown_project_slug_is_named_as_a_slug(failed_row_db: str) -> None:
    """``--project`` takes a slug: the refusal said "no project with id 'nope' (looked up
    by slug)", an id and a slug at once."""
    result = kinbox("sessions", "list", "--project", "nope", "--db", failed_row_db)
    assert result.returncode == 1
    assert result.stderr == "kinbox: no project with slug 'nope'\n"


def test_db_upgrade_creates_a_schema_and_commands_refuse_an_old_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    before = kinbox("inbox", "list", "--db", url)
    assert before.returncode == 1 and "kinbox db upgrade" in before.stderr
    up = kinbox("db", "upgrade", "--db", url)
    assert up.returncode == 0 and "create table agent_inbox_messages" in up.stdout
    assert "already up to date" in kinbox("db", "upgrade", "--db", url).stdout


def test_an_unopenable_database_is_a_clear_error() -> None:
    result = kinbox("inbox", "list", "--db", "sqlite:////no/such/dir/x.db")
    assert result.returncode == 1
    assert "no database file at" in result.stderr


def test_a_database_from_kinbox_db_that_does_not_open_says_where_its_url_came_from() -> None:
    """A ``$KINBOX_DB`` set long ago (or to a stray value) made every command say only
    "cannot open database ' ': unsupported scheme", naming no flag the user had given:
    the error now says the URL is ``$KINBOX_DB``'s, and a ``--db`` one's does not."""
    from_env = kinbox("db", "status", env={"KINBOX_DB": "sqlite:////no/such/dir/x.db"})
    assert from_env.returncode == 1
    assert "no database file at" in from_env.stderr and "$KINBOX_DB" in from_env.stderr
    given = kinbox("db", "status", "--db", "sqlite:////no/such/dir/x.db",
                   env={"KINBOX_DB": "sqlite:////no/such/dir/x.db"})
    assert given.returncode == 1 and "$KINBOX_DB" not in given.stderr


def test_the_log_level_is_kinboxs_and_libraries_say_only_what_goes_wrong() -> None:
    """`--log-level info` printed APScheduler's INFO lines (every job added, every run)
    among kinbox's own."""
    code = ("import logging\n"
            "from kinbox.actors.cli import main\n"
            "main(['--log-level', 'info', 'scenario', 'list'])\n"
            "for name in ('apscheduler.scheduler', 'websockets.server', 'kinbox.runtime'):\n"
            "    logging.getLogger(name).info('info from %s', name)\n"
            "    logging.getLogger(name).warning('warning from %s', name)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    said = {line.split(": ", 1)[1] for line in done.stderr.splitlines() if ": " in line}
    assert said == {"info from kinbox.runtime", "warning from kinbox.runtime",
                    "warning from apscheduler.scheduler", "warning from websockets.server"}


@pytest.mark.timeout(60)
def test_an_empty_log_level_variable_is_no_level_as_every_other_empty_variable(
        db_url: str) -> None:
    """``KINBOX_LOG_LEVEL=`` (an env file's empty line, systemd's ``Environment=`` cleared,
    ``-e KINBOX_LOG_LEVEL=$UNSET``) made every command a usage error (exit 2), while an
    empty ``$KINBOX_DB``, ``$KINBOX_HOME`` or ``$KINBOX_OPERATOR_TOKEN`` reads as unset:
    a worker under such a unit never started. Empty is the default, warning; a level
    that is not one is still refused."""
    assert kinbox("db", "upgrade", "--db", db_url).returncode == 0
    for empty in ("", " "):
        done = kinbox("db", "status", "--db", db_url, env={"KINBOX_LOG_LEVEL": empty})
        assert done.returncode == 0, done.stderr
        assert "up to date" in done.stdout
    wrong = kinbox("db", "status", "--db", db_url, env={"KINBOX_LOG_LEVEL": "verbose"})
    assert wrong.returncode == 2 and "KINBOX_LOG_LEVEL" in wrong.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "problem", ["readable_key", "junk_key", "file_not_folder", "world_writable_folder"]
)
def test_an_unusable_data_directory_is_one_line_not_a_traceback(tmp_path: Path,
                                                                problem: str) -> None:
    data = tmp_path / "data"
    if problem == "file_not_folder":
        data.write_text("not a folder")
        expected = "Not a directory"
    elif problem == "world_writable_folder":
        data.mkdir()
        data.chmod(0o777)
        expected = "chmod 700 it"
    else:
        data.mkdir()
        key = data / "device_key.pem"
        key.write_text("junk" if problem == "junk_key" else "")
        key.chmod(0o600 if problem == "junk_key" else 0o644)
        expected = "not a PEM private key" if problem == "junk_key" else "chmod 600 it"
    done = kinbox("serve", "--port", "0", "--db", f"sqlite:///{tmp_path / 'k.db'}",
                  "--data-dir", str(data))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("kinbox: ") and expected in line


READ_ONLY_COMMANDS = [("inbox", "list"), ("inbox", "show", "stuck"), ("sessions", "list"),
                      ("db", "status"), ("peers", "list"), ("peers", "invites"),
                      ("cron", "list"), ("cron", "runs")]


@pytest.fixture
def read_only_folder(failed_row_db: str) -> Iterator[str]:
    """``failed_row_db`` in a folder nobody may write: by its mode, or for root (whom modes
    do not stop) by the immutable attribute."""
    path = Path(failed_row_db.removeprefix("sqlite:///"))
    made = [path, path.parent]
    if os.geteuid() != 0:
        path.chmod(0o444)
        path.parent.chmod(0o555)
    elif subprocess.run(["chattr", "+i", *map(str, made)], capture_output=True).returncode:
        pytest.skip("root, and chattr +i is not available here to make a folder read-only")
    try:
        with pytest.raises(OSError):
            (path.parent / "probe").touch()
        yield failed_row_db
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", *map(str, made)], check=True)
        else:
            path.parent.chmod(0o755)
            path.chmod(0o644)


@pytest.mark.parametrize("command", READ_ONLY_COMMANDS, ids=" ".join)
def test_read_only_commands_work_on_a_read_only_folder(read_only_folder: str,
                                                       command: tuple[str, ...]) -> None:
    result = kinbox(*command, "--db", read_only_folder, "--json")
    assert result.returncode == 0, result.stderr
    if command == ("inbox", "list"):
        listed = json.loads(result.stdout)["items"]
        assert {r["message_id"] for r in listed} == {"ok", "stuck", "waiting"}


def test_read_only_commands_leave_the_database_file_as_it_was(failed_row_db: str) -> None:
    path = Path(failed_row_db.removeprefix("sqlite:///"))
    with sqlite3.connect(path) as con:  # a file some other tool left in rollback mode
        con.execute("PRAGMA journal_mode=delete")
    before = path.read_bytes()
    for command in READ_ONLY_COMMANDS:
        assert kinbox(*command, "--db", failed_row_db).returncode == 0, command
    assert path.read_bytes() == before
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone() == ("delete",)



@pytest.mark.timeout(120)
def test_a_child_task_the_cli_requeues_and_cancels_is_reported_to_its_parent(
        db_url: str) -> None:
    """``kinbox inbox requeue`` and ``cancel`` wrote the journal alone: a failed child task
    requeued from the command line stayed blocked on its old failure (which counts as
    reported), so cancelling the requeued row was never reported and the parent never
    heard. They do what ``rt.requeue`` and ``rt.cancel`` do now."""
    import time

    from kinbox.actors import Runtime

    with Runtime(db=db_url) as rt:  # send-only: nothing runs the child's task
        parent = rt.create_session(rt.create_project("p").id, "parent").id
        task_id = rt.tools_for(parent).agent(description="clean up")["task_id"]
    mid = f"subagent-task-{task_id}"
    s = Stores(db_url)
    try:  # its run failed for good, as its last attempt leaves it
        now = time.time() + 1
        s.journal.claim("w", now)
        s.journal.retry("w", mid, "the model is down", now, permanent=True)
    finally:
        s.close()
    Runtime(db=db_url).start().stop()  # a start reports the failure to the parent
    requeue = kinbox("inbox", "requeue", mid, "--db", db_url)
    assert requeue.returncode == 0, requeue.stderr
    cancel = kinbox("inbox", "cancel", mid, "--reason", "not needed", "--db", db_url)
    assert cancel.returncode == 0, cancel.stderr
    with Runtime(db=db_url) as rt:
        woken = [r["payload"]["outcome"] for r in rt.inbox(target=parent)
                 if r["kind"] == "subagent_result"]
        assert woken == ["failed", "cancelled"]
        assert rt.context.tasks.get(task_id).status == "cancelled"  # type: ignore[union-attr]


def test_ctrl_c_in_an_operator_command_exits_130_without_a_traceback(
        failed_row_db: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from kinbox.actors import cli, cli_ops

    def interrupted(*_args: object) -> int:
        raise KeyboardInterrupt
    monkeypatch.setattr(cli_ops, "inbox_list", interrupted)
    assert cli.main(["inbox", "list", "--db", failed_row_db]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err


LOGS_OUTSIDE_TEXT = """
import logging, sys
from kinbox.actors import cli, cli_ops

def handler(args, out):
    log = logging.getLogger("kinbox.turns")
    log.warning("turn failed: %s", "\\x1b[2J\\x1b]0;owned\\x07boom\\n2026-01-01 ERROR forged")
    try:
        raise ValueError("bad \\x1b[31mred\\x1b[0m input")
    except ValueError:
        log.exception("a brain raised")
    return 0

cli_ops.inbox_list = handler
sys.exit(cli.main(["inbox", "list", "--db", sys.argv[1]]))
"""


def test_log_lines_show_outside_text_escaped_on_the_terminal(failed_row_db: str) -> None:
    """A brain's exception (or a peer's, a chat user's text) quoted in a log line reaches
    the operator's terminal with no escape sequence and no line of its own."""
    done = subprocess.run([sys.executable, "-c", LOGS_OUTSIDE_TEXT, failed_row_db],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert "\x1b" not in err and "\x07" not in err
    assert "turn failed: \\x1b[2J" in err and "boom\\n2026-01-01 ERROR forged" in err
    assert not any(line.startswith("2026-01-01 ERROR forged") for line in err.splitlines())
    # A traceback keeps its own lines; its quoted text is escaped the same way.
    assert "Traceback (most recent call last):" in err.splitlines()
    assert "ValueError: bad \\x1b[31mred\\x1b[0m input" in err
