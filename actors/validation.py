"""Argument checks for the agent tools: each failure is a ToolError a model can act on.

Pure functions, one per kind of argument, so every tool phrases the same
mistake the same way and writes nothing before its arguments are good.
"""

from __future__ import annotations

import math
import re
from typing import Any, TypeGuard

from .errors import ToolError

SEND_LIMIT = 20_000
"""Characters in one message (``agent_send``, ``rt.post``, a sub-agent's description)."""

TITLE_LIMIT = 512
"""Characters in a session title."""

CHILD_LIMIT = 20
"""Most sub-agents one session may have running at once (the task ``agent`` handed them
``pending`` or ``in_progress``; one ``blocked`` waits on the user and does not count, nor
do tasks a child made for itself): a brain that calls ``agent`` in a loop is refused at
the limit instead of starting a model turn each (:class:`.child_tools.ChildPlace`)."""

JSON_OBJECT_LIMIT = 256 * 1024
"""Characters of a message's payload or a session's config as stored (JSON, keys sorted,
ASCII): a payload is read with its row at every claim, a config by every turn of its
session. As much as an HTTP route's body may hold; far more than any a runtime makes."""

ID_LIMIT = 128
"""Characters in the longest id a tool looks up (a session's or task's id column holds
at most 128): a longer one names no row, and is refused rather than quoted back whole."""

QUOTE_LIMIT = 80
"""Characters of a caller's argument an error message quotes (:func:`quoted`)."""

SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A project slug: a letter or digit, then up to 63 letters, digits, ``.``, ``_`` or ``-``."""


def finite_number(value: object) -> TypeGuard[int | float]:
    """A real number a float holds (not a bool, NaN or infinity; not an int too large for a
    float, on which ``math.isfinite`` raised ``OverflowError`` past every option's check)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def unstorable(text: str) -> str | None:
    """Why ``text`` cannot be stored as text on every backend, or None when it can.

    A lone surrogate is not Unicode a database can hold (UTF-8 cannot encode it), and a
    NUL character is refused by PostgreSQL's ``text`` (SQLite keeps it), so a message
    with one would be accepted on one backend and fail deep in a commit on the other.
    The one rule for every boundary that takes text (tools, social events, cron jobs)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid Unicode: a lone surrogate {text[exc.start]!r} at position {exc.start}"
    nul = text.find("\x00")
    if nul >= 0:
        return f"contains a NUL character (at position {nul}), which cannot be stored"
    return None


def lookup_key(value: object) -> str | None:
    """``value`` as a key some row could have, or None when none can: not a string, or
    one no database stores (PostgreSQL would fail the lookup instead of finding nothing)."""
    return value if isinstance(value, str) and unstorable(value) is None else None


def escaped(text: str) -> str:
    """``text`` made storable (:func:`unstorable`) by escaping what cannot be stored, for
    text kinbox records but did not choose (a brain's exception, its traceback)."""
    if unstorable(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters: a model's
    runaway argument must not come back whole into its context (or a log line)."""
    try:
        text = repr(value)
    except ValueError:  # an int (or a container of one) past Python's 4,300 digits
        if isinstance(value, int):
            return f"an integer of {value.bit_length():,} bits"
        return f"a {type(value).__name__} holding an integer too long to print"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def require_str(name: str, value: Any) -> str:
    """``value`` must be a string that can be stored (:func:`unstorable`)."""
    if not isinstance(value, str):
        raise ToolError("invalid_argument",
                        f"{name} must be a string, not {type(value).__name__}.")
    problem = unstorable(value)
    if problem is not None:
        raise ToolError("invalid_argument", f"{name} {problem}.")
    return value


def require_id(name: str, value: Any, limit: int | None = None) -> str:
    """A non-empty id string, stripped; at most ``limit`` characters when given (the
    tools give :data:`ID_LIMIT`)."""
    text = require_str(name, value).strip()
    if not text:
        raise ToolError("invalid_argument", f"{name} must not be empty.")
    if limit is not None and len(text) > limit:
        raise ToolError("invalid_argument",
                        f"{name} is {len(text):,} characters; an id has at most {limit}.")
    return text


def require_message(value: Any, limit: int, name: str = "message") -> str:
    """A message: stripped, 1..``limit`` characters. A peer's message is held to the same
    rule by its receiver (``transport.frames.is_blank``; this pure module may not import
    it, and a test keeps the two in step)."""
    text = require_str(name, value).strip()
    if not text:
        raise ToolError("invalid_argument", f"{name} must not be empty.")
    if len(text) > limit:
        raise ToolError("invalid_argument",
                        f"{name} is {len(text):,} characters; the limit is {limit:,}. "
                        "Shorten it or split it into several messages.")
    return text


def require_int(name: str, value: Any, low: int, high: int) -> int:
    """An integer in ``low..high``, as JSON Schema's ``integer`` has it: a float with no
    fraction is one (``5.0``: some models send every number as a float, and the schema
    the model was given allows it); booleans are not integers here."""
    if isinstance(value, float) and finite_number(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        got = quoted(value) if isinstance(value, float) else type(value).__name__
        raise ToolError("invalid_argument",
                        f"{name} must be an integer from {low} to {high}, not {got}.")
    if not low <= value <= high:
        raise ToolError("invalid_argument",
                        f"{name} must be from {low} to {high}, got {quoted(value)}.")
    return value


def require_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """One of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        options = ", ".join(repr(c) for c in choices)
        raise ToolError("invalid_argument",
                        f"{name} must be one of {options}, got {quoted(value)}.")
    return value


def require_slug(value: Any, name: str = "slug") -> str:
    """A project slug (:data:`SLUG`), stripped."""
    text = require_str(name, value).strip()
    if not SLUG.fullmatch(text):
        raise ToolError("invalid_argument",
                        f"{name} must be 1 to 64 letters, digits, '.', '_' or '-', starting "
                        f"with a letter or digit; got {quoted(text)}.")
    return text
