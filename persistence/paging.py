"""The one contract of every paged read a store offers: what ``limit``, ``offset`` and a
keyset position (``before_seq``) may be.

``limit`` is a whole number from 1 or None (no cut: every row the read's filters keep,
unless the method documents another default); ``offset`` a whole number from 0; a
position (``before_seq``) a whole number from 1 or None (from the newest). All at most
:data:`PAGE_NUMBER_MAX`. Anything else (0, -1, ``True``, ``"3"``, ``2.0``, a number no
database column holds) is :class:`~.errors.InvalidArgument`, raised at the store's
public method before any SQL runs.

Why here and not at each caller: the databases read the numbers they are sent their own
way. SQLite takes a negative LIMIT as no limit and a negative OFFSET as none, a limit of
0 read as "not given" served every row, and a number past 64 bits failed inside the
driver as an ``OverflowError``. The CLI's and HTTP's bounds stay theirs (what a user may
ask for); these are what a store may be asked at all.
"""

from __future__ import annotations

import base64
import json
import math
from typing import NamedTuple, Protocol, Self, TypeVar

from .errors import InvalidArgument


class _Bounded(Protocol):
    """A query that takes a page's bounds (a peewee ``Select``)."""

    def limit(self, value: int | None) -> Self: ...
    def offset(self, value: int | None) -> Self: ...


QueryT = TypeVar("QueryT", bound=_Bounded)

PAGE_NUMBER_MAX = 2**62
"""The largest limit, offset or position a read takes: past any count of rows or ``seq``
a database holds, and small enough that a caller's ``limit + 1`` (one row more says
whether another page follows) still fits the 64-bit integers both databases take."""


def _whole(field: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (
            low <= value <= PAGE_NUMBER_MAX):
        raise InvalidArgument(field, value, f"a whole number from {low} to {PAGE_NUMBER_MAX}")
    return value


def limit(value: object, field: str = "limit") -> int | None:
    """A page's size: None (no cut) or a whole number from 1."""
    return None if value is None else _whole(field, value, 1)


def offset(value: object, field: str = "offset") -> int:
    """How many rows of the order a page skips: a whole number from 0."""
    return _whole(field, value, 0)


def position(value: object, field: str = "before_seq") -> int | None:
    """A keyset page's bound (a ``seq``, an id number): None (from the end) or a whole
    number from 1."""
    return None if value is None else _whole(field, value, 1)


def cut(query: QueryT, limit: int | None, offset: int) -> QueryT:
    """``query`` with a validated page's bounds (:func:`limit`, :func:`offset`) applied;
    unchanged when the page is every row (no ``LIMIT``/``OFFSET`` sent at all)."""
    if limit is None and not offset:
        return query
    return query.limit(limit).offset(offset)


CURSOR_LIMIT = 1000
"""The longest cursor token a read takes (one holds a time and an id of at most 128
characters, base64-encoded)."""

CURSOR_ID_LIMIT = 128
"""Longest id a cursor may name (the ids it pages over, sessions', are at most 128): a
position no row has reads an empty page, but an id no column could hold is refused. A NUL
is refused too: PostgreSQL takes none in a text parameter (SQLite would read it)."""


class Keyset(NamedTuple):
    """A position in an order that never changes once a row exists, ``(at, id)`` (a
    creation time, then the unique id for ties): a page is the rows past the last one of
    the page before, found through an index on both, so the pages of a walk neither
    repeat nor skip a row however the rows change meanwhile (an offset counts rows from
    the start, and any row that moves ahead of it shifts every later page)."""

    at: float
    id: str

    def token(self) -> str:
        """The position as an opaque text a user hands back (shell-safe: base64url)."""
        text = json.dumps([self.at, self.id], separators=(",", ":"))
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _position(at: object, key: object) -> Keyset | None:
    """``(at, key)`` as a position some row could have, or None: a finite time, and an id
    a column holds and every driver takes."""
    try:
        if (isinstance(at, int | float) and not isinstance(at, bool)
                and math.isfinite(float(at)) and isinstance(key, str)
                and 0 < len(key) <= CURSOR_ID_LIMIT and "\x00" not in key):
            key.encode()  # a lone surrogate: no id has one, and no driver takes it
            return Keyset(float(at), key)
    # A lone surrogate (a ValueError); a time too large for a float (OverflowError).
    except (ValueError, OverflowError):
        pass
    return None


def keyset(value: object, field: str = "after") -> Keyset | None:
    """A cursor a page returned (:meth:`Keyset.token`, or the :class:`Keyset` itself):
    None (from the start) or the position; anything else is
    :class:`~.errors.InvalidArgument`. A Keyset is held to its token's rule: it is a
    plain tuple a caller can build, and its parts go to the SQL as they are."""
    if value is None:
        return None
    if isinstance(value, Keyset):
        position = _position(value.at, value.id)
        if position is not None:
            return position
    elif isinstance(value, str) and 0 < len(value) <= CURSOR_LIMIT:
        try:
            text = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            at, key = json.loads(text)
            position = _position(at, key)
            if position is not None:
                return position
        # binascii.Error, JSON, not two values (ValueErrors, a TypeError).
        except (ValueError, TypeError):
            pass
    raise InvalidArgument(field, value, "a cursor a page of the listing returned")


def key_after(value: object, field: str = "after") -> str | None:
    """A cursor that is a row's own unique key (a cron job's id, which a walk in key order
    is past): None (no cursor), or a key some row could have. The empty key sorts before
    every row's, so it starts a walk. Anything else (not text, longer than
    :data:`CURSOR_ID_LIMIT`, a NUL, a lone surrogate) is :class:`~.errors.InvalidArgument`:
    no id has it, and PostgreSQL would fail the comparison instead of finding nothing."""
    if value is None:
        return None
    if isinstance(value, str) and len(value) <= CURSOR_ID_LIMIT and "\x00" not in value:
        try:
            value.encode()
            return value
        except UnicodeEncodeError:
            pass
    raise InvalidArgument(field, value, "a job id a page of the listing named")
