"""What a read of another session (``agent_read``, a device's ``read``) loads of its
transcript: the newest shown messages a read's budget can hold, and a count of the rest.

The view (:mod:`.transcript_view`) keeps the newest messages within its character
budget and says how many older ones it left out. Fed the whole transcript, a read of
a session of years loaded every entry it ever had, text and all, at every call. Here
pages of shown entries are read backwards from the newest until they hold more than
the budget, and the older ones are only counted, in the database.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from ..persistence import EntryRecord
from .transcript_view import READ_LIMIT, SHOWN_ROLES, Line, block

PAGE = 32
"""Entries a read takes at a time, newest first (a budget's worth of short messages)."""


class TranscriptReads(Protocol):
    """The session store's transcript reads this needs."""

    def transcript(self, session_id: str, *, last: int | None = None,
                   visible_only: bool = False, before_id: int | None = None,
                   roles: Collection[str] | None = None) -> list[EntryRecord]: ...

    def count_entries(self, session_id: str, *, visible_only: bool = False,
                      before_id: int | None = None,
                      roles: Collection[str] | None = None) -> int: ...


def newest_lines(store: TranscriptReads, session_id: str, limit: int = READ_LIMIT, *,
                 speakers: bool = True) -> tuple[list[Line], int]:
    """The newest shown messages of ``session_id``, oldest first, at least as many as a
    read within ``limit`` characters shows, and how many shown messages came before
    them (for :func:`.transcript_view.render`'s ``older``). ``speakers``: name who sent
    each user message (an agent, a sub-agent), as ``agent_read`` does; without it every
    message is its role's."""
    lines: list[Line] = []
    used = 0
    before: int | None = None
    while True:
        page = store.transcript(session_id, last=PAGE, visible_only=True, before_id=before,
                                roles=SHOWN_ROLES)
        got = [Line(e.role, e.text, e.visible, e.sender_id, e.kind) if speakers
               else Line(e.role, e.text, e.visible) for e in page]
        lines[:0] = got
        used += sum(len(block(line)) + 2 for line in got)
        if len(page) < PAGE:
            return lines, 0
        before = page[0].id
        if used > limit:
            return lines, store.count_entries(session_id, visible_only=True,
                                              before_id=before, roles=SHOWN_ROLES)
