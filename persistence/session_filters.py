"""The conditions session reads put in their SQL, so that a listing reads a page, not
every session the database ever had.

Each is a predicate the caller's own rule decides over again in Python (the access
rules, the roster, a session's derived status): here they only narrow what is read, and
each is exact or wider than the rule, never narrower. Listings read them on every tool
call; with cron jobs and sub-agents a project holds thousands of sessions.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Collection

import peewee as pw

from .database import is_postgres
from .hot_path import PROCESSING, is_open
from .models import Tables


def outside(t: Tables, kinds: Collection[str]) -> pw.Expression:
    """Sessions whose kind and platform are both outside ``kinds`` (the hidden ones: a
    session is hidden by either)."""
    s, hidden = t.session, sorted(kinds)
    return s.kind.not_in(hidden) & pw.fn.COALESCE(s.platform, "").not_in(hidden)


def active_ids(t: Tables) -> pw.SelectQuery:
    """The ids of the sessions whose derived status is ``active`` (:mod:`.session_view`):
    a direct turn's mark, or an open row of theirs processing; each part an index read."""
    s, row = t.session.alias("m"), t.inbox.alias("i")
    # ``>= ''`` holds for every string: it only lets SQLite read the marks off their
    # index, where IS NOT NULL alone scanned every session.
    marked = s.turn_owner.is_null(False) & (s.turn_owner >= "")
    return (s.select(s.id).where(marked)
            | row.select(row.target_chat_id).where(
                pw.SQL(f"{is_open('i')} AND i.status = '{PROCESSING}'")))


def may_be_named(t: Tables, key: str) -> pw.Expression:
    """Sessions that ``key`` may designate by id, or by a title equal to it up to Unicode
    normalisation (NFC), which SQL cannot compute: the id and the title as typed, in NFC
    and in NFD, and every title that is not plain ASCII (the only ones whose NFC can
    differ from themselves: a title of ASCII letters is its own NFC)."""
    s = t.session
    forms = sorted({key, unicodedata.normalize("NFC", key), unicodedata.normalize("NFD", key)})
    octets = (pw.fn.OCTET_LENGTH(s.title) if is_postgres(t.db)
              else pw.fn.LENGTH(s.title.cast("BLOB")))
    return (s.id == key) | s.title.in_(forms) | (octets != pw.fn.LENGTH(s.title))


def names_a_worker(t: Tables) -> pw.Expression:
    """Sessions whose config may name a worker: the key is in it, as ``json.dumps`` wrote
    it (quoted); what its value means is the roster's to read."""
    return t.session.config.contains('"worker"')
