"""The ``kinbox`` command line: scenarios and operator commands.

Exit status: 0 ok, 1 error (or a scenario expectation failed), 2 usage.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from ..persistence import PersistenceError
from . import bench, cli_ops, cli_peers, cli_scenario, serve
from .errors import KinboxError


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="kinbox",
                                     description="kinbox: a durable actor runtime for agents")
    sub = parser.add_subparsers(dest="command", required=True)
    cli_scenario.add_parser(sub)
    cli_ops.add_parsers(sub)
    bench.add_parser(sub)
    serve.add_parser(sub)
    cli_peers.add_parser(sub)
    return parser


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; return the exit status."""
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args, out))
    except (PersistenceError, KinboxError, LookupError) as exc:
        print(f"kinbox: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
