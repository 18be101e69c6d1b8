"""``kinbox cron``: list, add, trigger, pause, resume and remove cron jobs; show their runs.

The commands work on the database directly (like the other operator
commands), so they work while a runtime runs elsewhere; a runtime with a
brain notices a new or triggered job at its next poll (APScheduler, every
15 seconds) and runs it there.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable
from typing import Any, TextIO

from ..persistence import CronStore, InvalidArgument, paging
from ..transport.page_limits import RUNS_LIMIT
from . import cron_rules as rules
from .cli_args import common, cursor_or_offset, whole_number
from .cli_ops import operator_clock, stores
from .cli_output import emit, emit_page, when


def _jobs(args: argparse.Namespace, work: Any, *, read_only: bool = False) -> Any:
    # Stamped by the runtimes' clock (the server's on PostgreSQL), as every operator
    # change is: on this machine's, a trigger from a laptop two hours behind the server
    # was an occurrence missed past the grace time (skipped), two hours ahead one due in
    # two hours; a job added or resumed so first ran as late as the clock was ahead.
    # Here, not at the top: the scheduler it brings is no part of every command's start.
    from .cron_jobs import CronJobs

    with stores(args.db, read_only=read_only) as (journal, sessions), \
            operator_clock(journal.t.db) as clock:
        jobs = CronJobs(CronStore(journal.t, journal.writer), sessions, clock.now,
                        lambda: uuid.uuid4().hex)
        return work(jobs)


def _utc(ts: float | None) -> str:
    # A run's times are UTC: say so (a job's next run is shown in its own zone, named).
    return "-" if ts is None else f"{when(ts)} UTC"


def _line(job: dict[str, Any]) -> str:
    state = "active" if job["active"] else "paused"
    # The next run in the job's own zone, named: the expression's 09:00 in Paris shown in
    # UTC, unsaid, read as a job due at 08:00.
    from .triggers import local_time  # with the scheduler: see _jobs

    upcoming = job["next_run_at"]
    when = "-" if upcoming is None else local_time(upcoming, job["timezone"])
    schedule = f"{job['cron']} ({job['timezone']})"
    return (f"{job['job_id']:<14} {state:<7} {schedule:<30} next {when}"
            f"  retries {job['retry_count']}  {job['name']}"
            + (f"  (last error: {job['last_error']})" if job["last_error"] else ""))


def cron_list(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox cron list``: a page of jobs, read as a page (not every job): soonest due
    first from the ``--offset``-th, or by id past ``--after`` (the cursor a page printed;
    ``''`` starts the walk: each job once while jobs fire)."""
    if args.offset is None:
        args.offset = 0
    jobs, more = _jobs(args, lambda j: j.jobs_page(args.limit, args.offset, after=args.after),
                       read_only=True)
    lines = [_line(j) for j in jobs] or [
        "no cron jobs" + (f" from offset {args.offset}" if args.offset else "")
        + (" after the cursor" if args.after else "")]
    if args.after is None:
        emit_page(out, args, list(jobs), more, lines, next_page="the next {limit}")
    else:
        emit_page(out, args, list(jobs), more, lines, next_page="the next {limit}",
                  keyset=True, after=jobs.after)
    return 0


def cron_add(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox cron add NAME --cron EXPR --prompt TEXT``."""
    job = _jobs(args, lambda j: j.add(args.name, args.cron, args.prompt, delivery=args.delivery,
                                      timezone=args.timezone, active=not args.paused))
    emit(out, args.json, job, [f"added {_line(job)}",
                               f"runs in session {rules.session_id_for(job['job_id'])}"])
    return 0


def _action(verb: str, past: str) -> Any:
    def command(args: argparse.Namespace, out: TextIO) -> int:
        result = _jobs(args, lambda j: getattr(j, verb)(args.job_id))
        if verb == "remove":
            lines = [f"removed {args.job_id} and its run records"]
        else:
            lines = [f"{past} {_line(result)}"]
        emit(out, args.json, result, lines)
        return 0
    command.__doc__ = f"``kinbox cron {verb} JOB_ID``."
    return command


def cron_runs(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox cron runs [JOB_ID]``: newest first, older than ``--before`` (the cursor a
    page printed: each run once while runs are recorded) or from the ``--offset``-th."""
    if args.offset is None:
        args.offset = 0
    runs, more = _jobs(args, lambda j: j.runs_page(args.job_id, args.limit, args.offset,
                                                   before=args.before), read_only=True)
    lines = [f"{r['run_id']:<32} {r['status']:<8} attempt {r['attempts']}  "
             f"started {_utc(r['started_at'])}  "
             + (f"error: {r['error']}" if r["error"] else (r["result"] or "")[:60])
             for r in runs]
    emit_page(out, args, list(runs), more, lines or [
        "no runs" + (f" from offset {args.offset}" if args.offset else "")
        + (" before the cursor" if args.before else "")],
        next_page="the {limit} runs before these", keyset=True, after=runs.before,
        cursor="before")
    return 0


def _cursor_type(check: Callable[[str, str], object], flag: str,
                 start: str = "") -> Callable[[str], str]:
    """An argparse type for ``--{flag}``: the cursor a page printed, checked by the store's
    rule ``check`` (so a mistyped one is a usage error before the database is opened)."""
    def parse(text: str) -> str:
        try:
            check(text, flag)
        except InvalidArgument:
            raise argparse.ArgumentTypeError(
                f"expected the cursor a page printed (its '... more: --{flag}' line or its "
                f"JSON's next_{flag}){start}, got {text[:40]!r}") from None
        return text
    return parse


_cursor = _cursor_type(paging.keyset, "before")
"""``--before`` of ``cron runs``: a page of runs' cursor."""
_job_cursor = _cursor_type(paging.key_after, "after", ", or '' to start")
"""``--after`` of ``cron list``: the job id a page of jobs printed."""


_runs_limit = whole_number(RUNS_LIMIT)
"""``--limit`` of ``cron runs``: the range the store takes (as ``GET /cron/runs``), so a
number past it is a usage error here, not an error from the store."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``kinbox cron``."""

    cron = sub.add_parser("cron", help="user cron jobs: prompts run on a schedule")
    csub = cron.add_subparsers(dest="action", required=True)
    p = common(csub.add_parser("list", help="jobs, soonest due first, paused ones last"))
    p.add_argument("--limit", type=_runs_limit, default=100,
                   help=f"at most N jobs, 1 to {RUNS_LIMIT} (default 100)")
    cursor_or_offset(p, "after", _job_cursor,
                     "by id, the jobs past the page that printed CURSOR ('' from the first): "
                     "each job once while jobs fire",
                     "skip the first N (the next page: --offset 100; jobs that fire "
                     "meanwhile shift it)")
    p.set_defaults(handler=cron_list)
    p = common(csub.add_parser("add", help="add a job"))
    p.add_argument("name")
    p.add_argument("--cron", required=True, help='crontab expression, e.g. "0 9 * * 1-5"')
    p.add_argument("--prompt", required=True, help="what the job's turn is asked")
    p.add_argument("--delivery", choices=rules.DELIVERY_MODES, default="announce")
    p.add_argument("--timezone", default="UTC", help="IANA time zone of the expression")
    p.add_argument("--paused", action="store_true", help="add it paused")
    p.set_defaults(handler=cron_add)
    for verb, past, text in (("trigger", "triggered", "run a job now"),
                             ("pause", "paused", "stop a job's schedule"),
                             ("resume", "resumed", "restart a job, retries reset"),
                             ("remove", "removed", "delete a job and its runs")):
        p = common(csub.add_parser(verb, help=text))
        p.add_argument("job_id")
        p.set_defaults(handler=_action(verb, past))
    p = common(csub.add_parser("runs", help="run records, newest first"))
    p.add_argument("job_id", nargs="?")
    p.add_argument("--limit", type=_runs_limit, default=20,
                   help=f"the newest N runs, 1 to {RUNS_LIMIT} (default 20)")
    cursor_or_offset(p, "before", _cursor,
                     "the runs older than the page that printed CURSOR (each run once, "
                     "however many are recorded meanwhile)",
                     "but the newest N (runs recorded meanwhile shift it)")
    p.set_defaults(handler=cron_runs)
