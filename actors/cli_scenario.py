"""``kinbox scenario run`` and ``kinbox scenario list``: run a scenario, report what happened.

Exit status of ``run``: 0 when every expectation held; 1 when one failed or
the script raised (the report shows the script's own error, file and line);
2 for usage errors (no such scenario, a script that does not load, a
``--db`` that cannot be opened, that another runtime delivers on, that holds
open messages, active schedules (cron jobs, Focal's wake-ups) or unsent social
replies or, for a
scenario that runs once per database, an earlier run's state, an output path
that cannot be written or that is the run's own script or SQLite database, all checked
before anything runs); 130
when Ctrl-C or SIGTERM stopped the run: the runtime stops gracefully and
the report, marked interrupted, shows what was done (a second signal stops
at once; the journal keeps every unacknowledged row).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..persistence import (
    DatabaseInUse,
    DatabaseMissing,
    DatabaseOpenError,
    ExclusiveLock,
    PersistenceError,
    Tables,
    bind_tables,
    inbox_core,
    is_sqlite,
    live_runtimes,
    open_database,
    redact_url,
    sqlite_path,
)
from . import focal_heartbeat_setting as hs
from . import scenario_files
from .access import FOCAL_ID
from .cli_args import database_url
from .errors import ConfigError, ScenarioError
from .focal_heartbeat_job import HEARTBEAT_JOB
from .interrupts import EXIT_INTERRUPTED, Interrupted, StopSignals, exit_now
from .progress import Progress
from .scenario_report import build_report, render_mermaid, render_text

if TYPE_CHECKING:
    from .scenario import Scenario


def run_scenario(path: str, db_url: str | None = None, seed: int = 0,
                 stream: TextIO | None = None, temp_dirs: list[str] | None = None
                 ) -> tuple[dict[str, Any], Scenario]:
    """Run one scenario (a file, or a bundled scenario's name); return its report and the
    scenario. :class:`ConfigError` / :class:`ScenarioError` when it cannot start.

    Without ``db_url`` the run's database is a temporary folder, removed at the end; it
    is added to ``temp_dirs`` while it exists, for an exit that skips the end (a second
    stop signal) to remove it too."""
    file = scenario_files.resolve(path)
    module = scenario_files.load(file)
    once = scenario_files.once_per_database(module, file)  # checked on any database
    if db_url is not None:
        check_database(db_url, once=once)
    stream = stream or sys.stderr
    tmp = None
    if db_url is None:
        tmp = tempfile.mkdtemp(prefix="kinbox-scenario-")
        if temp_dirs is not None:
            temp_dirs.append(tmp)
        db_url = f"sqlite:///{tmp}/scenario.db"
    from .scenario import Scenario  # the runtime loads with a run, not with the CLI

    progress = Progress(stream)
    sc = Scenario(db_url, seed=seed, name=file.stem, on_event=progress.event)
    error: dict[str, Any] | None = None
    interrupted: str | None = None
    try:
        try:
            module.run(sc)
        except Interrupted as exc:
            interrupted = signal.Signals(exc.signum).name
        except (Exception, SystemExit) as exc:  # sys.exit() too: the script ended early
            failure = scenario_files.script_error(exc, file)
            error = {"type": type(exc).__name__, "message": str(failure),
                     "path": failure.path, "lineno": failure.lineno,
                     "frames": scenario_files.script_frames(exc, file),
                     "notes": [str(n) for n in getattr(exc, "__notes__", ())],
                     "traceback": scenario_files.script_traceback(exc, file)}
            sc.expect(False, "the scenario script ran to the end", str(failure))
        sc.finish()  # graceful: running turns finish and commit before the report reads
        try:
            report = build_report(sc, error=error, interrupted=interrupted)
        except PersistenceError as exc:
            if error is None:
                raise
            # The database the script failed on (gone, say) fails the report's reads too:
            # their error alone hid the script's. The report comes without the journal.
            error["notes"].append(f"the report could not read the journal: "
                                  f"{type(exc).__name__}: {str(exc).strip()}")
            report = build_report(sc, error=error, interrupted=interrupted, journal=False)
        progress.close(report["summary"])
    finally:
        if sc.started:
            sc.runtime.context.journal.t.db.close()  # the report's reads reopened it
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    report["db"] = redact_url(db_url) if tmp is None else "(a temporary SQLite file, removed)"
    return report, sc


def check_database(url: str, *, once: str | None = None) -> None:
    """Refuse a database that cannot be opened (an unknown scheme, no server, no such
    PostgreSQL database, a SQLite file another runtime delivers on or whose folder cannot
    be made) before the script runs: else the script ran, failed at
    ``sc.start()`` and its report blamed the script's line for the ``--db`` flag. A SQLite
    file that does not exist yet is not made here (the runtime makes it, and its folders,
    when the script starts it), so a refused run leaves no file behind. ``once``: the
    scenario runs once per database (:data:`.scenario_files.ONCE_PER_DATABASE`), and one
    that holds what an earlier run made is refused too."""
    try:
        db = open_database(url, must_exist=True)
        try:
            if is_sqlite(db):  # a delivering runtime owns it: the scenario's could not start
                lock = ExclusiveLock(db)  # type: ignore[arg-type]
                lock.acquire()
                lock.release()
            else:
                _check_no_runtime(url, db)
            _check_no_open_rows(url, db)
            if once is not None:
                _check_not_run_before(url, db, once)
            _check_no_schedules(url, db)
            _check_no_unsent_replies(url, db)
        finally:
            db.close()
    except DatabaseInUse as exc:
        raise ConfigError(str(exc), field="db") from None
    except DatabaseMissing:
        # A new SQLite file: its URL was checked before it was found missing. Its folders
        # must be makeable, or the runtime's start fails inside the script.
        path = sqlite_path(url)
        if path is not None:
            _check_new_folder(url, path.resolve().parent)
    except DatabaseOpenError as exc:
        raise ConfigError(str(exc), field="db") from None


def _refused(url: str, why: str) -> ConfigError:
    """The refusal of ``--db`` (its password masked), saying ``why``."""
    return ConfigError(f"cannot run a scenario on {redact_url(url)!r}: {why}", field="db")


def _check_no_runtime(url: str, db: Any) -> None:
    """ConfigError when a delivering runtime runs on the PostgreSQL database: it would
    claim the scenario's rows and run them with its own brain."""
    running = live_runtimes(db)
    if running:
        raise _refused(url, f"{running} delivering kinbox runtime(s) run on it and would "
                       "deliver the scenario's messages with their own brains; stop them or "
                       "give another database")


def _check_no_open_rows(url: str, db: Any) -> None:
    """ConfigError when the database holds open rows (pending or processing): the
    scenario's runtime would deliver them, an earlier run's or a deployment's, with its
    scripted brain (answered "ok", delivered for good)."""
    tables = bind_tables(db)
    if not db.table_exists(tables.inbox._meta.table_name):
        return  # no kinbox tables yet: the runtime makes them
    m = tables.inbox
    count = m.select().where(m.status.in_([inbox_core.PENDING,
                                           inbox_core.PROCESSING])).count()
    if count:
        raise _refused(url, f"it holds {count} open message(s) (pending or processing) "
                       "that the scenario's runtime would deliver with its scripted brain; "
                       "give a fresh database, or see to them first (kinbox inbox list "
                       "--db ...)")


def _check_no_schedules(url: str, db: Any) -> None:
    """ConfigError when the database holds active schedules (user cron jobs, Focal's
    wake-ups and heartbeat): the scenario's runtime would fire them, an earlier run's or a
    deployment's, with its scripted brain, as it would deliver open rows."""
    tables = bind_tables(db)
    cron, job = tables.cron_job, tables.job
    wakes = job.active
    if not _heartbeat_runs(db, tables):  # its job stays active, and fires to do nothing
        wakes &= job.id != HEARTBEAT_JOB
    held = [(cron, "active cron job(s)", cron.active), (job, "Focal wake-up(s)", wakes)]
    found = [f"{n} {what}" for model, what, active in held
             if db.table_exists(model._meta.table_name)
             and (n := model.select().where(active).count())]
    if found:
        raise _refused(url, f"it holds {' and '.join(found)} that the scenario's runtime "
                       "would run with its scripted brain; give a fresh database")


def _check_no_unsent_replies(url: str, db: Any) -> None:
    """ConfigError when the database keeps social replies no platform has taken yet (an
    earlier run's or a deployment's, kept for its next start to send): a scenario that
    registers their platform's channel would take them over, "send" them through its
    scripted adapter and forget them for good."""
    kept = bind_tables(db).social_reply
    if not db.table_exists(kept._meta.table_name):
        return
    count = kept.select().count()
    if count:
        raise _refused(url, f"it keeps {count} social reply(ies) not yet sent, which the "
                       "scenario's channel adapters would send in their platform's place and "
                       "forget; give a fresh database")


def _heartbeat_runs(db: Any, tables: Tables) -> bool:
    """Is Focal's heartbeat switched on (by the setting its job obeys)?"""
    session = tables.session
    if not db.table_exists(session._meta.table_name):
        return False
    row = session.get_or_none(session.id == FOCAL_ID)
    return row is not None and hs.runs(hs.from_config(json.loads(row.config or "{}")))


def _check_not_run_before(url: str, db: Any, once: str) -> None:
    """ConfigError when the database holds what an earlier run of a once-per-database
    scenario made: the script would continue that run's state (its fixed ids taken, its
    devices paired) and fail on it, an IdempotencyConflict deep in the script."""
    tables = bind_tables(db)
    what, held = scenario_files.ONCE_PER_DATABASE[once]
    if db.table_exists(tables.inbox._meta.table_name) and held(tables):
        raise ConfigError(f"cannot run this scenario on {redact_url(url)!r}: it runs once "
                          f"per database, and this one holds {what} from an earlier run; "
                          "give a fresh --db, or none (a temporary database)", field="db")


def _check_new_folder(url: str, folder: Path) -> None:
    """ConfigError unless ``folder`` is, or could be made as, a folder a file can be made
    in: its nearest existing ancestor is a writable folder (nothing is made here)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        why = f"{str(existing)!r} is not a folder"
    elif not os.access(existing, os.W_OK | os.X_OK):
        why = f"the folder {str(existing)!r} is not writable"
    else:
        return
    raise ConfigError(f"cannot open database {redact_url(url)!r}: cannot make the file in "
                      f"{str(folder)!r}: {why}", field="db")


def check_output_path(path: str, flag: str) -> None:
    """Refuse an output file that could not be written, before anything runs."""
    file = Path(path)
    folder = file.parent
    if file.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory", field=flag.lstrip("-"))
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{flag} {path}: {str(folder)!r} is a file, not a folder",
                          field=flag.lstrip("-"))
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: the folder {str(folder)!r} does not exist",
                          field=flag.lstrip("-"))
    if not os.access(folder, os.W_OK) or (file.exists() and not os.access(file, os.W_OK)):
        raise ConfigError(f"{flag} {path}: not writable", field=flag.lstrip("-"))


SQLITE_FILES = ("", "-wal", "-shm", "-journal")
"""A SQLite database's file and those SQLite keeps beside it."""


def check_not_the_runs_own(path: str, flag: str, scenario: Path, db_url: str | None) -> None:
    """Refuse an output file that is one of the run's own: the scenario's script, or the
    SQLite database it keeps (or a file SQLite keeps beside it). The output is renamed
    over its path after the run: a slip of the shell's completion (``--db
    sqlite:///run.db --diagram run.db``) replaced the journal ``--db`` was given to
    keep."""
    target = Path(os.path.realpath(path))
    own = [(Path(os.path.realpath(scenario)), "the scenario's script")]
    try:
        database = sqlite_path(db_url) if db_url is not None else None
    except DatabaseOpenError:  # no file at all: the database's own check says why
        database = None
    if database is not None:
        own += [(Path(os.path.realpath(f"{database}{suffix}")), "the run's SQLite database")
                for suffix in SQLITE_FILES]
    for file, what in own:
        if target == file:
            raise ConfigError(f"{flag} {path}: is {what} ({str(file)!r}); give another file",
                              field=flag.lstrip("-"))


def encodable(text: str, stream: TextIO) -> str:
    """``text`` as ``stream`` can write it: what its encoding lacks (the report's '…' on an
    ASCII terminal) escaped, rather than an error half-way through the report."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:  # an encoding Python does not know: the stream's own problem
        return text


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` as UTF-8 to ``path`` whole or not at all: into a new file beside it,
    synced and then renamed over it, so a failure half-way (a full disk) leaves the old
    file as it was and no part of the new one. A file there keeps its mode; a new one gets
    the umask's, as an ordinary write would give it.

    A path there that is no regular file (``/dev/stdout``, ``/dev/null``, a named pipe) is
    written into as it is: a file renamed over it would replace the device itself (run
    as root, ``/dev/null`` became a regular file holding the diagram). A regular file is
    reached through its symlinks, so the rename replaces the file, not a link to it."""
    if path.exists() and not path.is_file():
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        return
    path = Path(os.path.realpath(path))
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if path.exists():
                os.chmod(f.fileno(), path.stat().st_mode & 0o7777)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _file_path(text: str) -> str:
    """An argparse type: a file to write. An empty one (an unset variable) was read as no
    flag, and the run wrote no diagram."""
    if not text.strip():
        raise argparse.ArgumentTypeError("give a file to write; an empty path names none")
    return text


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``scenario run`` and ``scenario list``."""
    p = sub.add_parser("scenario", help="run scenario scripts")
    ssub = p.add_subparsers(dest="action", required=True)
    r = ssub.add_parser("run", help="run a scenario and print its report")
    r.add_argument("path", metavar="SCENARIO",
                   help="a scenario file (scenarios/hello.py) or a bundled name (hello)")
    r.add_argument("--db", type=database_url,
                   help="database URL (default: a fresh SQLite file in a temp dir)")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.add_argument("--diagram", metavar="FILE.md", type=_file_path,
                   help="write a Mermaid sequence diagram")
    r.add_argument("--seed", type=int, default=0, help="seed for ids (same seed, same report)")
    r.set_defaults(handler=handle)
    ls = ssub.add_parser("list", help="list the bundled scenarios")
    ls.set_defaults(handler=handle_list)


def handle_list(args: argparse.Namespace, out: TextIO) -> int:
    """Print each bundled scenario's name and what it shows."""
    try:
        known = scenario_files.bundled()
    except ConfigError as exc:
        print(f"kinbox: {exc}", file=sys.stderr)
        return 2
    width = max((len(n) for n in known), default=0)
    for name, path in known.items():
        out.write(f"{name:<{width}}  {scenario_files.summary(path)}\n")
    return 0


def handle(args: argparse.Namespace, out: TextIO) -> int:
    """Run the scenario; exit 0 when every expectation held (see the module docstring)."""
    temp_dirs: list[str] = []

    def exit_at_once(signum: int) -> None:
        # A second signal exits past run_scenario's finally: its temporary database too
        # would stay behind, in a folder no one looks at.
        for folder in temp_dirs:
            shutil.rmtree(folder, ignore_errors=True)
        exit_now(signum)
    try:
        if args.diagram:
            check_output_path(args.diagram, "--diagram")
            check_not_the_runs_own(args.diagram, "--diagram",
                                   scenario_files.resolve(args.path), args.db)
        with StopSignals(on_second=exit_at_once):
            try:
                report, _ = run_scenario(args.path, args.db, args.seed, temp_dirs=temp_dirs)
            except Interrupted:  # while loading or stopping: there is no report to print
                return EXIT_INTERRUPTED
    except (ConfigError, ScenarioError) as exc:
        print(f"kinbox: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out.write(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    else:
        out.write(encodable(render_text(report) + "\n", out))
    out.flush()
    if args.diagram:
        try:
            write_whole(Path(args.diagram),
                        f"# {report['scenario']}\n\n{render_mermaid(report)}\n")
        except OSError as exc:
            print(f"kinbox: --diagram {args.diagram}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    if report["interrupted"]:
        return EXIT_INTERRUPTED
    return 0 if report["ok"] else 1
