"""How the operator commands print: a table for people, JSON for scripts.

Shared by every ``kinbox`` operator command (:mod:`.cli_ops`, :mod:`.cli_cron`,
:mod:`.cli_peers`, :mod:`.cli_prune`), so that they all print times, pages and
stored text the same way, and none lets a user's text drive the terminal.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
from typing import Any, TextIO

from ..transport.frames import shown


def when(ts: float | None) -> str:
    """A stored time as UTC ``YYYY-MM-DD HH:MM:SS`` (``-`` for none)."""
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def emit(out: TextIO, as_json: bool, data: Any, lines: list[str]) -> None:
    """Print ``data`` as JSON (``--json``), else ``lines``, escaped for a terminal."""
    if as_json:
        out.write(as_json_text(data) + "\n")
    else:
        # Names, titles, texts and errors come from chat users, peers and HTTP clients:
        # escape sequences and line breaks in them must not reach the operator's terminal.
        out.write("\n".join(shown(line, len(line)) for line in lines)
                  + ("\n" if lines else ""))


def as_json_text(data: Any) -> str:
    """``data`` as JSON text, and only JSON: a float that is not a number (a payload a
    Python caller posted with ``float('nan')`` or ``inf``, which Python's json writes as
    ``NaN`` and ``Infinity``, and no other reader takes) is written as the string
    ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``."""
    try:
        return json.dumps(data, indent=2, sort_keys=True, default=str, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(data), indent=2, sort_keys=True, default=str)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def emit_page(out: TextIO, args: argparse.Namespace, items: list[Any], more: bool,
              lines: list[str], *, next_page: str, keyset: bool = False,
              after: str | int | None = None, cursor: str = "after") -> None:
    """Print one page of a listing read one row past ``args.limit`` (``more``: that row
    was there). ``--json`` prints ``{"items", "more", "next_offset"}``: a bare list left
    a script to believe a cut listing was whole. The table ends with a line saying how
    to list the ``next_page`` (say, "the next {limit}") when there is one. A listing
    that pages by position too (``keyset``: the option ``--{cursor}``, ``--after`` or
    ``--before-seq``) passes the next page's, ``after``: the table's line names it, and
    the JSON says it as ``next_{cursor}`` (``next_offset``: None on a page read from a
    position, which an offset does not count from)."""
    option = cursor.replace("-", "_")
    from_cursor = getattr(args, option, None) is not None
    next_offset = args.offset + len(items) if more and not from_cursor else None
    data: dict[str, Any] = {"items": items, "more": more, "next_offset": next_offset}
    if keyset:
        data[f"next_{option}"] = after
    if more:
        flag = f"--{cursor} {after}" if after is not None else f"--offset {next_offset}"
        lines = [*lines, f"... more: {flag} lists " + next_page.format(limit=args.limit)]
    emit(out, args.json, data, lines)


def emit_all(out: TextIO, as_json: bool, items: list[Any], lines: list[str]) -> None:
    """Print a listing that is never cut (every row there is): as a page's JSON,
    ``{"items", "more": false, "next_offset": null}``, so a script reads every listing
    the same way, never a bare list (which could take no field beside its rows)."""
    emit(out, as_json, {"items": items, "more": False, "next_offset": None}, lines)


def age(seconds: float) -> str:
    """A duration in its largest whole unit: ``90s``, ``5m``, ``3h``, ``2d``."""
    if seconds < 120:
        return f"{max(seconds, 0):.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def last_line(error: str | None) -> str:
    """The last line of a stored error (a traceback ends with the exception itself)."""
    lines = [x for x in (error or "").strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else ""
