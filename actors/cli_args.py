"""The options and argument types the operator commands share.

Every ``kinbox`` command that opens a database takes the same ``--db`` (and,
if it prints, ``--json``); its numbers and ids are checked by argparse, so a
bad one is a usage error before anything is opened, never a filter silently
dropped (an empty ``--target``) or an integer the database overflows on.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn


def database_url(text: str) -> str:
    """An argparse type: a ``--db`` URL. An empty one (``--db "$UNSET_VARIABLE"``) is a
    usage error, not the flag left out: that would be the default database, the user's
    own, which a scenario would write its run into and ``db upgrade`` would create."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a database URL (sqlite:///path/to/file.db "
                                         "or postgresql://user@host/db), got an empty one")
    return text


def usage_error(args: argparse.Namespace, message: str) -> NoReturn:
    """Refuse arguments argparse could not check alone (two that do not go together, a
    value a command's own rule refuses) as it refuses the rest: the subcommand's usage
    line and ``message`` on stderr, exit status 2, before anything is opened."""
    parser: argparse.ArgumentParser = args._parser  # every leaf parser records itself
    parser.error(message)


DB_HELP = "database URL (default: $KINBOX_DB, then the data dir file)"


def common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options every operator command takes: ``--db`` and ``--json``."""
    p.add_argument("--db", type=database_url, help=DB_HELP)
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


LIST_LIMIT = 1_000_000
"""Most rows a ``--limit`` may ask for (beyond it the databases' integers overflow)."""


def whole_number(high: int, low: int = 1) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"expected a number from {low} to {high:,}, got {value}")
        return value
    return parse


limit_arg = whole_number(LIST_LIMIT)
"""An argparse type: a ``--limit``."""
offset_arg = whole_number(LIST_LIMIT, low=0)
"""An argparse type: an ``--offset``."""
position_arg = whole_number(2**62)
"""An argparse type: a ``--before-seq``, a row's ``seq`` (at most the stores' bound,
``paging.PAGE_NUMBER_MAX``)."""


def session_id_arg(text: str) -> str:
    """A ``--target``: an empty id names no session (and must not read as no filter)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a session id, got an empty one")
    return text


def kind_arg(text: str) -> str:
    """A ``--kind``: an empty one names no kind (and must not read as no filter either)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a message kind, got an empty one")
    return text


def project_slug_arg(text: str) -> str:
    """A ``--project``: an empty slug names no project (``--project "$UNSET"`` listed
    every project's sessions, as if no filter had been given)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a project slug, got an empty one")
    return text


def cursor_or_offset(p: argparse.ArgumentParser, flag: str, cursor: Callable[[str], Any],
                     cursor_help: str, offset_help: str, metavar: str = "CURSOR") -> None:
    """A listing's paging flags: ``--{flag} CURSOR`` (a keyset walk) or ``--offset N``, not
    both. ``--offset`` has no default of 0: argparse refuses a flag beside another of its
    group only when it differs from its default, and took ``--offset 0 --{flag} CURSOR``,
    ignoring the offset."""
    where = p.add_mutually_exclusive_group()
    where.add_argument(f"--{flag}", type=cursor, metavar=metavar, help=cursor_help)
    where.add_argument("--offset", type=offset_arg, default=None, help=offset_help)
