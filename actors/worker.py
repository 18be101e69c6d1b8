"""``kinbox worker --brain module:attribute``: a process that delivers, with no HTTP.

The product's brain is imported by name (as uvicorn takes ``module:app``);
without one there is nothing to deliver with, so ``--brain`` is required.
Any number of workers and send-only processes (``kinbox serve`` without a
brain, the CLI) may share one PostgreSQL database; on SQLite one delivering
runtime owns the file at a time.

The first SIGINT or SIGTERM stops gracefully (running turns finish or hand
their rows back) and prints what this run did; a second exits at once
(status 130), and the journal keeps every unacknowledged row.
"""

from __future__ import annotations

import argparse
import threading
from typing import TYPE_CHECKING, TextIO

from ..persistence import redact_url
from .brain_ref import load_brain
from .cli_args import DB_HELP, database_url
from .data_dirs import add_data_dir_flag
from .errors import BrainRefError
from .interrupts import Interrupted, StopSignals

if TYPE_CHECKING:
    from .runtime import Runtime


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``worker``."""
    p = sub.add_parser("worker", help="deliver messages with a brain (no HTTP)")
    p.add_argument("--brain", required=True, metavar="MODULE:ATTR",
                   help="the product's brain, e.g. myapp.agents:brain")
    p.add_argument("--db", type=database_url, help=DB_HELP)
    add_data_dir_flag(p)
    p.set_defaults(handler=handle, parser=p)


def summary(rt: Runtime) -> str:
    """One line: what this run delivered and what the journal still holds."""
    try:
        stats = rt.statistics()
    except Exception as exc:  # the database is gone (why the runtime ended): say so, briefly
        return f"the journal cannot be read now ({type(exc).__name__})"
    rows = stats["rows"]
    ran = "send-only, no turns run" if rt.send_only else f"turns run: {stats['turns']}"
    return (f"{ran}; journal: {rows.get('pending', 0)} pending, "
            f"{rows.get('processing', 0)} processing, {rows.get('failed', 0)} failed")


def ended_by_itself(rt: Runtime, command: str, out: TextIO) -> int:
    """Say that ``rt`` ended without being asked (it lost its database), whether or not a
    stop signal came after; the status that says so: 1, for a supervisor to restart it."""
    out.write(f"kinbox {command}: the runtime is {rt.state}; {summary(rt)}\n")
    return 1


def handle(args: argparse.Namespace, out: TextIO) -> int:
    """Deliver until the first stop signal."""
    try:
        brain = load_brain(args.brain)
    except BrainRefError as exc:
        args.parser.error(str(exc))
    from .runtime import Runtime  # loaded when a worker starts, not with the CLI

    rt = Runtime(db=args.db, brain=brain, data_dir=args.data_dir)
    with StopSignals():
        try:
            rt.start()
            out.write(f"kinbox worker delivering on {redact_url(rt.url)} with brain "
                      f"{args.brain} (Ctrl-C to stop)\n")
            out.flush()
            idle = threading.Event()
            while rt.state == "running":
                idle.wait(1.0)  # the signal handler interrupts this wait
            return ended_by_itself(rt, "worker", out)
        except Interrupted:
            if rt.state == "new":  # the signal came while it was starting
                out.write("kinbox worker stopped before it started delivering\n")
                return 0
            if rt.state != "running":  # it crashed before the signal came: that is the end
                return ended_by_itself(rt, "worker", out)
            rt.stop()
            out.write(f"kinbox worker stopped: {summary(rt)}\n")
            return 0
        finally:
            rt.stop()
