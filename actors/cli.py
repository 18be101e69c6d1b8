"""The ``kinbox`` command line: scenarios, serving, benchmarks and operator commands.

Exit status: 0 ok, 1 error (or a scenario expectation failed), 2 usage,
3 a schema upgrade pending (``db status``), 130 interrupted. Every error
kinbox raises is a :class:`KinboxError`; the command line prints it on one
line (passwords masked by the errors themselves) and exits 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sqlite3
import sys
from collections.abc import Sequence
from typing import NoReturn, TextIO

from .. import actors
from ..persistence import DatabaseOpenError, redact_text, redact_url
from ..transport import TransportError
from ..transport.frames import shown
from . import (
    bench,
    cli_cron,
    cli_ops,
    cli_peers,
    cli_prune,
    cli_scenario,
    cpu_pinning,
    serve_flags,
    worker,
)
from .errors import ConfigError, KinboxError
from .interrupts import EXIT_INTERRUPTED
from .log_lines import TerminalFormatter
from .validation import unstorable

LOG_LEVELS = ("debug", "info", "warning", "error")


def version() -> str:
    """The installed kinbox version."""
    return str(actors.__version__)


class _Version(argparse.Action):
    """``--version``: the version is read (from the installed metadata, a tenth of a
    second) only when asked for, not on every command's start."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"kinbox {version()}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """Unknown arguments are reported by the subcommand that got them, with its usage; a
    usage error masks the passwords of the arguments it may quote."""

    _given: tuple[str, ...] = ()
    """The arguments this parser was given (a subcommand's: those after its name)."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        self._given = tuple(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        # argparse quotes what it could not use: a --db before its command ("invalid
        # choice: 'postgresql://me:pw@...'"), a mistyped flag and its URL ("unrecognized
        # arguments: ..."), a URL pasted into another option.
        for arg in self._given:
            value = arg.partition("=")[2] if arg.startswith("-") and "=" in arg else arg
            masked = redact_url(value)
            if masked != value:
                # Quoted as Python's repr (argparse's "invalid choice: %r", a type's
                # "got {text!r}"), a password's backslashes are doubled and its quotes
                # escaped: the quoted URL goes whole, then the password as typed.
                message = redact_text(message.replace(repr(value), repr(masked)), value)
        super().error(message)

    def parse_args(self, args: list[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            owner = getattr(parsed, "_parser", self)
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = _Parser(prog="kinbox", description="kinbox: a durable actor runtime for agents")
    parser.add_argument("--version", action=_Version, help="show kinbox's version and exit")
    parser.add_argument("--log-level", choices=LOG_LEVELS, type=str.lower,
                        help="what kinbox logs to stderr (default: $KINBOX_LOG_LEVEL, then "
                             "warning); message bodies appear only at debug")
    parser.add_argument("--cpus", metavar="LIST",
                        help="run this process on these CPUs only, e.g. 1 or 0,2 or 0-3 "
                             "(Linux); one kinbox process per core, each pinned to its own, "
                             "measured 1.25-2x faster than unpinned (see the README)")
    sub = parser.add_subparsers(dest="command", required=True)
    cli_scenario.add_parser(sub)
    cli_ops.add_parsers(sub)
    cli_prune.add_parser(cli_ops.inbox_commands(sub))
    cli_cron.add_parser(sub)
    bench.add_parser(sub)
    serve_flags.add_parser(sub)
    worker.add_parser(sub)
    cli_peers.add_parser(sub)
    _remember_parsers(parser)
    return parser


def _remember_parsers(parser: argparse.ArgumentParser) -> None:
    # Each leaf parser records itself in the namespace so errors name the right usage.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                child.set_defaults(_parser=child)
                _remember_parsers(child)


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; return the exit status."""
    out = out or sys.stdout
    parser = build_parser()
    for arg in sys.argv[1:] if argv is None else argv:
        # Bytes that are not UTF-8 arrive as lone surrogates: no database can store them,
        # and they would fail deep in a query instead of here.
        if unstorable(arg) is not None:
            parser.error(f"argument {redact_url(arg)!a} is not UTF-8 text; kinbox takes "
                         "UTF-8 arguments")
    args = parser.parse_args(argv)
    # An empty variable is no level, as an empty $KINBOX_DB is no database: an env file's
    # `KINBOX_LOG_LEVEL=` must not make every command a usage error.
    level = args.log_level or os.environ.get("KINBOX_LOG_LEVEL", "").strip().lower() \
        or "warning"
    if level not in LOG_LEVELS:
        parser.error(f"KINBOX_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, not {level!r}")
    # The level is kinbox's; libraries (the scheduler, websockets, the ASGI server) say only
    # what goes wrong, so `--log-level info` shows kinbox's own story and no one else's.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TerminalFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    logging.getLogger("kinbox").setLevel(level.upper())
    if args.cpus is not None:
        try:
            cpu_pinning.pin_process(cpu_pinning.parse_cpus(args.cpus,
                                                           cpu_pinning.allowed_cpus()))
        except ConfigError as exc:
            parser.error(str(exc))
    try:
        return int(args.handler(args, out))
    # OSError: a data directory that is a file, a key file it cannot read. sqlite3.Error:
    # SQLite reads a result's rows as they are fetched, after the statement ran (where
    # kinbox's errors stand for the driver's), and a damaged page met then comes as its own.
    except (KinboxError, TransportError, OSError, sqlite3.Error) as exc:
        # An error may quote what a peer or a file said: never raw onto the terminal.
        print(f"kinbox: {shown(str(exc) + url_origin(args, exc), 2000)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C in a command without stop handling of its own (a listing, a requeue): a
        # change it was making commits whole or not at all, so there is nothing to unwind
        # and nothing a traceback would tell the operator.
        print("kinbox: interrupted; a change under way is committed whole or not at all: "
              "look before running it again", file=sys.stderr)
        return EXIT_INTERRUPTED


def url_origin(args: argparse.Namespace, exc: BaseException) -> str:
    """Where a database URL that did not open came from, when the user did not type it:
    a ``$KINBOX_DB`` set long ago is otherwise a URL no flag of theirs names."""
    env = os.environ.get("KINBOX_DB")
    if (isinstance(exc, DatabaseOpenError) and env and getattr(args, "db", None) is None
            and exc.url == redact_url(env)):
        return " (the URL is $KINBOX_DB's: set it to the database you mean, or give --db)"
    return ""


if __name__ == "__main__":
    sys.exit(main())
