"""``kinbox inbox prune``: reclaim finished inbox rows older than a duration.

Deletes what :mod:`kinbox.persistence.retention` lets go (``delivered`` and ``cancelled``
rows last changed before the cutoff, with their delivery markers and history; never an
open or failed row; then the cron runs that finished before it, each job's newest kept)
in short transactions, beside a running runtime. The cutoff is taken
on the rows' own clock (the server's on PostgreSQL). ``--dry-run`` opens the database
read-only and only counts. Interrupted, it stops between two batches and says what went.
"""

from __future__ import annotations

import argparse
import re
from typing import TextIO

from ..persistence import PruneCounts, retention
from .cli_args import common, whole_number
from .cli_ops import operator_clock, stores
from .cli_output import emit, when
from .interrupts import EXIT_INTERRUPTED, StopBetweenSteps

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
"""The units a duration may name: seconds, minutes, hours, days, weeks."""

MAX_SECONDS = 100 * 365 * 86400
"""The longest duration taken (a century): beyond it a cutoff is before any row."""

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw])\s*$")


def duration(text: str) -> float:
    """An argparse type: a duration such as ``30d``, ``12h``, ``90m``, ``3600s``, ``2w``
    (more than zero, at most a century), in seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 30d, 12h, 90m, 3600s or 2w, got {text!r}")
    seconds = float(match[1]) * UNITS[match[2]]
    if not 0 < seconds <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"expected a duration of more than 0 and at most 100 years, got {text!r}")
    return seconds


def retention_age(text: str) -> float:
    """An argparse type: a :func:`duration` of at least :data:`retention.MIN_RETENTION`
    (a shorter one would let a paired device's re-send of a pruned row run again)."""
    seconds = duration(text)
    if seconds < retention.MIN_RETENTION:
        raise argparse.ArgumentTypeError(
            f"expected at least {retention.MIN_RETENTION // 3600}h (a paired device re-sends "
            f"a message that long, and a pruned one would run again), got {text!r}")
    return seconds


def inbox_prune(args: argparse.Namespace, out: TextIO) -> int:
    """``kinbox inbox prune --older-than 30d [--dry-run] [--batch N]``.

    Ctrl-C (or SIGTERM) stops it after the batch under way (each batch is a transaction
    of its own): it says what went in the batches it committed, and exits 130."""
    counts, interrupted = PruneCounts(), False
    with (StopBetweenSteps("the batch under way") as stop,
          stores(args.db, read_only=args.dry_run) as (journal, _),
          operator_clock(journal.t.db) as clock):
        cutoff = clock.now() - args.older_than
        for step in journal.prune_steps(cutoff, batch=args.batch, dry_run=args.dry_run):
            counts += step
            if stop.asked:
                interrupted = True
                break
    verb = "would prune" if args.dry_run else "pruned"
    data = {**counts.as_dict(), "dry_run": args.dry_run, "cutoff": cutoff,
            "interrupted": interrupted}
    emit(out, args.json, data, [
        f"{verb} {counts.rows} inbox row(s) last changed before {when(cutoff)} UTC, "
        f"with {counts.markers} delivery marker(s) and {counts.events} history row(s), "
        f"and {counts.cron_runs} finished cron run(s)"
        + ("; interrupted: the rest stay until the next prune" if interrupted else "")])
    return EXIT_INTERRUPTED if interrupted else 0


def add_parser(isub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``inbox prune`` under ``kinbox inbox``."""
    p = common(isub.add_parser(
        "prune", help="delete delivered and cancelled rows, and finished cron runs, older than a "
             "duration"))
    p.add_argument("--older-than", required=True, type=retention_age, metavar="DURATION",
                   help="rows last changed longer ago than this: 30d, 2w, 48h (at least "
                        f"{retention.MIN_RETENTION // 3600}h)")
    p.add_argument("--dry-run", action="store_true",
                   help="count what would be deleted; change nothing")
    p.add_argument("--batch", type=whole_number(retention.MAX_BATCH),
                   default=retention.DEFAULT_BATCH,
                   help=f"rows per transaction (default {retention.DEFAULT_BATCH})")
    p.set_defaults(handler=inbox_prune)
