"""``kinbox scenario`` as a user runs it: real subprocesses, real signals, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import Runtime
from kinbox.persistence import bind_tables, open_database

ROOT = Path(__file__).resolve().parent.parent


def kinbox(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kinbox.actors", *args], capture_output=True,
                          text=True, timeout=60, cwd=cwd)


def script(tmp_path: Path, text: str, name: str = "story.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- item 6: the script's own errors, exit codes, output paths, bundled scenarios -----------

def test_an_error_before_start_shows_the_scripts_own_error(tmp_path: Path) -> None:
    path = script(tmp_path, "def run(sc):\n    x = 1\n    raise ValueError('no such fixture')\n")
    result = kinbox("scenario", "run", str(path))
    assert result.returncode == 1, result.stderr
    assert "call sc.start() first" not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert f"{path}:3: ValueError: no such fixture" in result.stdout
    assert "[FAIL] the scenario script ran to the end" in result.stdout


def test_an_error_deep_in_the_script_names_the_scripts_line(tmp_path: Path) -> None:
    path = script(tmp_path, "def helper(rt):\n    return rt.session('nope').title\n\n"
                            "def run(sc):\n    rt = sc.start()\n    helper(rt)\n")
    result = kinbox("scenario", "run", str(path), "--json")
    assert result.returncode == 1, result.stderr
    error = json.loads(result.stdout)["error"]
    assert (error["type"], error["path"], error["lineno"]) == ("AttributeError", str(path), 2)
    assert [f["where"] for f in error["frames"]] == [f"{path}:6", f"{path}:2"]
    text = kinbox("scenario", "run", str(path)).stdout
    assert f"  {path}:6 in run: helper(rt)\n  {path}:2 in helper: return rt.session" in text


@pytest.mark.parametrize(("text", "lineno", "kind"), [
    ("def run(sc):\n    sc.start(\n\n", 2, "SyntaxError"),
    ("import os\nimport no_such_module_here\n\ndef run(sc):\n    pass\n", 2,
     "ModuleNotFoundError"),
], ids=["syntax-error", "import-error"])
def test_a_script_that_cannot_load_is_a_usage_error(tmp_path: Path, text: str, lineno: int,
                                                    kind: str) -> None:
    path = script(tmp_path, text)
    result = kinbox("scenario", "run", str(path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{path}:{lineno}" in result.stderr and kind in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("head", ["async def run(sc):", "def run(sc):\n    yield"],
                         ids=["coroutine", "generator"])
def test_a_run_whose_body_a_call_does_not_run_is_a_usage_error(tmp_path: Path,
                                                               head: str) -> None:
    """``async def run(sc)`` (or a ``yield`` in it) made ``run(sc)`` return without running
    its body: the report said FAILED with no check and no reason, beside a RuntimeWarning
    that the coroutine was never awaited."""
    path = script(tmp_path, f"{head}\n    sc.start()\n    sc.expect(True, 'ran')\n")
    result = kinbox("scenario", "run", str(path))
    assert result.returncode == 2, result.stdout
    assert f"{path}: run(sc) must be a plain function" in result.stderr
    assert "Traceback" not in result.stderr and "RuntimeWarning" not in result.stderr
    assert result.stdout == ""


def test_a_diagram_path_that_cannot_be_written_is_refused_before_running(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    path = script(tmp_path, f"def run(sc):\n    open({str(ran)!r}, 'w').close()\n"
                            "    sc.start()\n    sc.expect(True, 'fine')\n")
    (tmp_path / "a-file").write_text("")  # a folder no one can create: a file is in its way
    result = kinbox("scenario", "run", str(path), "--diagram", str(tmp_path / "a-file" / "x.md"))
    assert result.returncode == 2
    assert "a-file" in result.stderr and "Traceback" not in result.stderr
    assert not ran.exists()
    assert result.stdout == ""


def test_an_empty_diagram_path_is_a_usage_error_before_running(tmp_path: Path) -> None:
    """``--diagram ""`` was read as no flag: the run went on and wrote no diagram."""
    ran = tmp_path / "ran"
    path = script(tmp_path, f"def run(sc):\n    open({str(ran)!r}, 'w').close()\n")
    result = kinbox("scenario", "run", str(path), "--diagram", "")
    assert result.returncode == 2, result.stderr
    assert "argument --diagram: " in result.stderr and "Traceback" not in result.stderr
    assert not ran.exists()


def test_a_diagram_folder_that_is_a_file_and_a_scenario_that_is_a_folder_are_named_so(
        tmp_path: Path) -> None:
    """Each was refused as something that "does not exist", which it does."""
    (tmp_path / "a-file").write_text("")
    path = script(tmp_path, "def run(sc):\n    pass\n")
    result = kinbox("scenario", "run", str(path), "--diagram", str(tmp_path / "a-file" / "x.md"))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"kinbox: --diagram {tmp_path / 'a-file' / 'x.md'}: "
                                     f"{str(tmp_path / 'a-file')!r} is a file, not a folder")
    result = kinbox("scenario", "run", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"kinbox: scenario file {str(tmp_path)!r} is a folder; "
                                     "give a scenario's .py file")


@pytest.mark.parametrize("target", ["the database", "its journal", "the script"])
def test_a_diagram_path_that_would_overwrite_the_runs_own_files_is_refused(
        tmp_path: Path, target: str) -> None:
    """``--db sqlite:///run.db --diagram run.db`` (a slip of the shell's completion): the run
    went on and its diagram was renamed over the journal the user gave ``--db`` to keep
    (or over the scenario script itself)."""
    ran = tmp_path / "ran"
    path = script(tmp_path, f"def run(sc):\n    open({str(ran)!r}, 'w').close()\n"
                            "    sc.start()\n    sc.expect(True, 'fine')\n")
    db = tmp_path / "run.db"
    db.write_bytes(b"")  # an empty file is a new database to SQLite
    diagram = {"the database": db, "its journal": tmp_path / "run.db-wal",
               "the script": path}[target]
    result = kinbox("scenario", "run", str(path), "--db", f"sqlite:///{db}",
                    "--diagram", str(diagram), cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith(f"kinbox: --diagram {diagram}: ") and "Traceback" not in \
        result.stderr
    assert not ran.exists() and result.stdout == ""
    assert path.read_text().startswith("def run(sc):")


def test_scenario_list_names_the_bundled_scenarios() -> None:
    result = kinbox("scenario", "list")
    assert result.returncode == 0, result.stderr
    names = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    assert names == sorted(p.stem for p in (ROOT / "scenarios").glob("*.py"))
    assert any(line.startswith("hello ") and "two sessions" in line
               for line in result.stdout.splitlines())


def test_without_a_source_tree_bundled_names_are_refused_clearly(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from kinbox.actors import cli, scenario_files

    monkeypatch.setattr(scenario_files, "BUNDLED", tmp_path / "site-packages" / "scenarios")
    assert cli.main(["scenario", "list"]) == 2
    assert "no bundled scenarios" in capsys.readouterr().err
    assert cli.main(["scenario", "run", "hello"]) == 2
    assert "give a scenario file's path" in capsys.readouterr().err


def test_a_bundled_scenario_runs_by_name_from_any_directory(tmp_path: Path) -> None:
    result = kinbox("scenario", "run", "hello", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "scenario hello (seed 0)" in result.stdout and "result: ok" in result.stdout


def test_an_unknown_scenario_name_lists_the_known_ones() -> None:
    result = kinbox("scenario", "run", "helo")
    assert result.returncode == 2
    assert "helo" in result.stderr and "hello" in result.stderr


# -- item 18: a wrong flag is reported by the subcommand ------------------------------------

def test_an_unknown_flag_prints_the_subcommands_usage(tmp_path: Path) -> None:
    result = kinbox("scenario", "run", "hello", "--bogus")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: kinbox scenario run")
    assert "--bogus" in result.stderr


# -- item 4: Ctrl-C ----------------------------------------------------------------------------

UNDER_WAY = '''
import sys
import threading

def run(sc):
    rt = sc.start()
    project = sc.project("slow", "Slow")
    bob = rt.create_session(project.id, "Bob")
    gate = threading.Event()

    def bob_turn(turn):
        if turn.messages[0].content == "block":
            print("TURN RUNNING", file=sys.stderr, flush=True)
            gate.wait(50)  # ignores the stop request: only a second signal ends this
        turn.reply("done")

    sc.on(bob.id, bob_turn)
    for n in range(3):
        rt.post(bob.id, f"warm-up {n}")
    sc.settle()
    print("UNDER WAY", file=sys.stderr, flush=True)
    if MODE == "block":
        rt.post(bob.id, "block")
        sc.settle(timeout=50)
    threading.Event().wait(50)  # the first SIGINT arrives here
'''


class Child:
    """A ``kinbox scenario run`` subprocess whose stderr is read line by line."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "kinbox.actors", *args], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.err: list[str] = []
        self._seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._seen:
                self.err.append(line)
                self._seen.notify_all()

    def wait_for_line(self, text: str, timeout: float = 30) -> None:
        with self._seen:
            if not self._seen.wait_for(lambda: any(text in x for x in self.err), timeout):
                self.proc.kill()
                raise AssertionError(f"no {text!r} on stderr: {''.join(self.err)}")

    def ctrl_c_twice(self) -> None:
        """Ctrl-C while its turn runs, then again once it stops gracefully: it must end at
        once, 130, saying so."""
        self.wait_for_line("TURN RUNNING")
        self.proc.send_signal(signal.SIGINT)
        self.wait_for_line("stopping gracefully")
        self.proc.send_signal(signal.SIGINT)
        rc, _out, err = self.finish()
        assert rc == 130, err
        assert "second SIGINT: stopping now" in err

    def finish(self, timeout: float = 30) -> tuple[int, str, str]:
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()  # stderr is the reader thread's alone
        self.proc.wait(timeout)
        self._reader.join(5)
        return self.proc.returncode, out, "".join(self.err)


@pytest.fixture
def child_db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'sc.db'}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_first_signal_stops_gracefully_and_prints_the_report_marked_interrupted(
        tmp_path: Path, child_db: str, signum: signal.Signals) -> None:
    path = script(tmp_path, "MODE = 'wait'\n" + UNDER_WAY)
    child = Child(["scenario", "run", str(path), "--db", child_db])
    child.wait_for_line("UNDER WAY")
    child.proc.send_signal(signum)
    rc, out, err = child.finish()
    assert rc == 130, err
    assert "Traceback" not in err
    assert f"scenario story (seed 0): INTERRUPTED by {signum.name}" in out
    assert "3 messages {'delivered': 3}" in out
    assert "result: interrupted" in out


@pytest.mark.timeout(60)
def test_a_second_ctrl_c_stops_at_once_and_the_journal_keeps_the_row(
        tmp_path: Path, child_db: str) -> None:
    path = script(tmp_path, "MODE = 'block'\n" + UNDER_WAY)
    Child(["scenario", "run", str(path), "--db", child_db]).ctrl_c_twice()
    db = open_database(child_db)
    rows = {r.content: r.status for r in bind_tables(db).inbox.select()}
    db.close()
    assert rows == {"warm-up 0": "delivered", "warm-up 1": "delivered",
                    "warm-up 2": "delivered", "block": "processing"}



# -- a --db that cannot be opened is refused before the script runs --------------------------

def _refused_db(tmp_path: Path, url: str) -> subprocess.CompletedProcess[str]:
    ran = tmp_path / "ran"
    path = script(tmp_path, f"def run(sc):\n    open({str(ran)!r}, 'w').close()\n"
                            "    sc.start()\n    sc.expect(True, 'fine')\n")
    result = kinbox("scenario", "run", str(path), "--db", url)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert not ran.exists()  # the script never ran: there is no report blaming its line
    assert result.stdout == ""
    return result


@pytest.mark.parametrize("url", ["foo://x", "sqlite:///{tmp}/sc.db?mode=ro",
                                 "postgresql://kinbox:hunter2@127.0.0.1:1/nothing"],
                         ids=["unknown-scheme", "sqlite-query", "no-server"])
def test_a_database_that_cannot_be_opened_is_a_usage_error_before_running(
        tmp_path: Path, url: str) -> None:
    """It ran the script, which failed at ``sc.start()``: a FAILED report with exit 1
    naming the script's line, and one runtime life that never was."""
    result = _refused_db(tmp_path, url.format(tmp=tmp_path))
    assert result.stderr.startswith("kinbox: cannot open database")
    assert "hunter2" not in result.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "story.py"]  # no database file either


def test_a_missing_postgresql_database_is_refused_before_running(pg_url: str,
                                                                 tmp_path: Path) -> None:
    result = _refused_db(tmp_path, pg_url.rsplit("/", 1)[0] + "/kinbox_no_such_database")
    assert "kinbox_no_such_database" in result.stderr


@pytest.mark.timeout(60)
def test_a_sqlite_file_another_runtime_delivers_on_is_refused_before_running(
        tmp_path: Path) -> None:
    """The file opened, so the script ran and failed at ``sc.start()`` (DatabaseInUse): a
    FAILED report, exit 1, blaming the script's line for the ``--db`` flag."""
    url = f"sqlite:///{tmp_path / 'busy.db'}"
    other = Runtime(db=url, brain=lambda turn: None).start()
    try:
        result = _refused_db(tmp_path, url)
    finally:
        other.stop()
    assert result.stderr.startswith("kinbox: database ") and "in use" in result.stderr
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.timeout(60)
def test_a_database_with_open_messages_is_refused_before_running(any_db_url: str,
                                                                 tmp_path: Path) -> None:
    """The scenario's runtime delivers every open row of its database: an earlier run's
    left over (a crash, an interrupt), or a real deployment's, were answered by the
    scripted brain ("ok", delivered for good) and told in this run's timeline beside a
    message table that left them out."""
    sender = Runtime(db=any_db_url).start()  # send-only: it only writes
    try:
        project = sender.create_project("elsewhere", "Elsewhere")
        target = sender.create_session(project.id, "Someone").id
        waiting = sender.post(target, "a real question").message_id
    finally:
        sender.stop()
    result = _refused_db(tmp_path, any_db_url)
    assert "1 open message" in result.stderr and len(result.stderr.splitlines()) == 1
    after = Runtime(db=any_db_url).start()
    try:
        assert after.context.journal.get(waiting)["status"] == "pending"
    finally:
        after.stop()


@pytest.mark.timeout(60)
def test_a_database_with_active_schedules_is_refused_before_running(any_db_url: str,
                                                                   tmp_path: Path) -> None:
    """The scenario's runtime ran the database's cron jobs, an earlier run's or a
    deployment's, with its scripted brain, and advanced their schedules for good."""
    with Runtime(db=any_db_url) as rt:  # no brain: it manages definitions, runs nothing
        job = rt.cron.add("digest", "* * * * *", "Write the digest.")
    result = _refused_db(tmp_path, any_db_url)
    assert "1 active cron job(s)" in result.stderr and len(result.stderr.splitlines()) == 1
    with Runtime(db=any_db_url) as rt:
        [kept] = rt.cron.jobs()
        assert (kept["job_id"], kept["next_run_at"]) == (job["job_id"], job["next_run_at"])
        rt.cron.pause(job["job_id"])
    ran = tmp_path / "ran"
    path = script(tmp_path, f"def run(sc):\n    open({str(ran)!r}, 'w').close()\n"
                            "    sc.start()\n    sc.expect(True, 'fine')\n")
    assert kinbox("scenario", "run", str(path), "--db", any_db_url).returncode == 0
    assert ran.exists()  # a paused job holds nothing back


@pytest.mark.postgres
@pytest.mark.timeout(60)
def test_a_postgresql_database_a_runtime_delivers_on_is_refused_before_running(
        pg_url: str, tmp_path: Path) -> None:
    """A live delivering runtime on the database would claim the scenario's rows and run
    them with its own brain (and the scenario's runtime, rows of its)."""
    other = Runtime(db=pg_url, brain=lambda turn: None).start()
    try:
        result = _refused_db(tmp_path, pg_url)
    finally:
        other.stop()
    assert "runtime" in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.mark.timeout(60)
def test_a_sqlite_file_whose_folder_cannot_be_made_is_refused_before_running(
        tmp_path: Path) -> None:
    """A file stands where the database's folder would go: the check let the missing file
    pass, the script ran and failed at ``sc.start()`` ("cannot make its folder"), a
    FAILED report with exit 1 blaming the script's line for the ``--db`` flag."""
    (tmp_path / "afile").write_text("")
    result = _refused_db(tmp_path, f"sqlite:///{tmp_path}/afile/sub/sc.db")
    assert result.stderr.startswith("kinbox: cannot open database")
    assert "afile" in result.stderr and len(result.stderr.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "story.py"]


def test_a_new_sqlite_file_in_new_folders_is_still_made_by_the_run(tmp_path: Path) -> None:
    db = tmp_path / "new" / "folders" / "sc.db"
    path = script(tmp_path, "def run(sc):\n    sc.start()\n    sc.expect(True, 'fine')\n")
    result = kinbox("scenario", "run", str(path), "--db", f"sqlite:///{db}")
    assert result.returncode == 0, result.stderr
    assert db.is_file()


# -- the diagram file: UTF-8, written whole or not at all ------------------------------------

ASCII_LOCALE = {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
"""A locale whose encoding is ASCII (Python's UTF-8 mode and locale coercion off)."""


def kinbox_env(*args: str, env: dict[str, str],
               preexec: Any = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kinbox.actors", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env={**os.environ, **env},
                          encoding="utf-8", errors="replace", preexec_fn=preexec)


def test_the_diagram_and_the_report_survive_an_ascii_locale(tmp_path: Path) -> None:
    """The report's short ids end in '…': the text report raised UnicodeEncodeError on an
    ASCII stdout, and the diagram was written in the locale's encoding, raising half-way
    (a traceback, the old diagram truncated)."""
    diagram = tmp_path / "d.md"
    diagram.write_text("old diagram\n")
    result = kinbox_env("scenario", "run", "hello", "--diagram", str(diagram),
                        env=ASCII_LOCALE)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "result: ok" in result.stdout
    text = diagram.read_text(encoding="utf-8")
    assert text.startswith("# hello\n\n```mermaid\n") and "…" in text
    assert [p.name for p in tmp_path.iterdir()] == ["d.md"]  # no temporary file left


def _limit_file_size() -> None:
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))


def test_a_diagram_that_cannot_be_written_whole_leaves_the_old_one(
        tmp_path: Path, pg_url: str) -> None:
    """The disk fills half-way (a file size limit: the database is PostgreSQL, so the
    diagram is the only file the run writes): the diagram was left cut off."""
    diagram = tmp_path / "d.md"
    diagram.write_text("old diagram\n")
    result = kinbox_env("scenario", "run", "hello", "--db", pg_url, "--diagram", str(diagram),
                        env={"KINBOX_HOME": str(tmp_path / "data"),
                             "PYTHONDONTWRITEBYTECODE": "1"},
                        preexec=_limit_file_size)
    assert result.returncode == 1, result.stderr
    assert "result: ok" in result.stdout  # the report was printed; the diagram failed
    assert "kinbox: --diagram" in result.stderr and "Traceback" not in result.stderr
    assert diagram.read_text() == "old diagram\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["d.md"]


@pytest.mark.timeout(60)
def test_a_second_ctrl_c_leaves_no_temporary_database_behind(tmp_path: Path) -> None:
    """Without --db the run's database is a temporary folder, removed at the end: a second
    signal exited at once, past that ``finally``, and left the folder and its database in
    the temp dir, where no one would ever look at (or remove) them."""
    temp = tmp_path / "temp"
    temp.mkdir()
    path = script(tmp_path, "MODE = 'block'\n" + UNDER_WAY)
    child = Child(["scenario", "run", str(path)], env={"TMPDIR": str(temp)})
    child.wait_for_line("TURN RUNNING")
    assert [p.name[:16] for p in temp.iterdir()] == ["kinbox-scenario-"]
    child.ctrl_c_twice()
    assert list(temp.iterdir()) == []


@pytest.mark.timeout(120)
def test_a_diagram_path_that_is_no_regular_file_is_written_into_not_replaced(
        tmp_path: Path) -> None:
    """``--diagram /dev/stdout`` or ``/dev/null`` (a device, a pipe): the diagram was written
    to a new file beside it, renamed over it. Run as root, that replaced ``/dev/null``
    with a regular file holding the diagram (every later ``> /dev/null`` of the machine then
    wrote into it); run as a user it was refused, as ``/dev`` is not theirs to write. A
    named pipe stands in for the device here: it must still be a pipe, and carry the
    diagram."""
    pipe = tmp_path / "diagram.pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # a writer's open does not block
    try:
        result = kinbox("scenario", "run", "hello", "--diagram", str(pipe))
        assert result.returncode == 0, result.stderr
        assert pipe.is_fifo()
        received = b""
        while chunk := os.read(reader, 65536):
            received += chunk
    finally:
        os.close(reader)
    assert received.decode().startswith("# hello\n\n```mermaid\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["diagram.pipe"]


@pytest.mark.timeout(60)
def test_a_database_with_unsent_social_replies_is_refused_before_running(
        any_db_url: str, tmp_path: Path) -> None:
    """A reply a deployment's turn committed and its platform never took (no channel yet,
    or a stop cut the send off) is kept for its next start to send. A scenario that
    registers that platform's channel (cron_social) took it over, "sent" it through its
    scripted adapter and forgot it for good: the deployment's user never got it, and the
    run FAILED on a reply that was not its own."""
    with Runtime(db=any_db_url, brain=lambda turn: turn.reply("on my way")) as rt:
        rt.social.allow("slack", ["U1"])  # no channel registered: the reply is kept
        rt.social.ingest({"platform": "slack", "sender_id": "U1", "thread_id": "T1",
                          "text": "where are you?", "reply_route": {"channel": "C1"}})
        assert rt.social.wait_idle(30)
    result = kinbox("scenario", "run", "cron_social", "--db", any_db_url)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert "1 social reply(ies)" in result.stderr and len(result.stderr.splitlines()) == 1
    db = open_database(any_db_url)
    try:
        kept = bind_tables(db).social_reply
        assert [r.text for r in kept.select()] == ["on my way"]
    finally:
        db.close()
