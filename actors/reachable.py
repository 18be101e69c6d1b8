"""The sessions a calling session may list (``agent_list``), read a page at a time.

Who may see whom is :mod:`.access`'s rule, and stays its final word: the read narrows
in SQL by what that rule is made of (the caller's project, or every one for Focal; the
hidden kinds, :data:`.access.HIDDEN_KINDS`; a session's derived status), in listing
order, and each row it returns is decided again by :func:`.access.decide`. A listing
used to read every session of the project (of the database, for Focal) into records and
cut them to at most 50: a tool call's time and memory grew with every cron run and
sub-agent ever started.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..persistence import SessionRecord, SessionStore
from . import access
from .family import subject


def reachable(store: SessionStore, caller: SessionRecord, *, active_only: bool,
              limit: int, new: Sequence[SessionRecord] = ()) -> tuple[list[SessionRecord], bool]:
    """The first ``limit`` sessions ``caller`` may list, most recently active first (only
    ``active`` ones with ``active_only``), and whether more follow.

    ``new``: sessions the caller's running turn created, not committed yet (its
    background children, Focal's new sessions), newest first: the turn's later calls
    see its own writes, and these are the most recent of all."""
    me = subject(caller)

    def allowed(s: SessionRecord) -> bool:
        return (access.decide("agent_list", me, subject(s)) == "allow"
                and (not active_only or s.status == "active"))

    found = [s for s in new if allowed(s)]
    seen = {s.id for s in found}
    if caller.project_id is None and not access.is_focal(me):
        # Nothing else is in its reach: itself, when it is not hidden.
        found += [caller] if allowed(caller) else []
        return found[:limit], len(found) > limit
    # Focal reaches every project (FO4), not only its own hidden one.
    project_id = None if access.is_focal(me) else caller.project_id
    page = limit + 1  # one more than asked says whether more follow
    offset = 0
    while len(found) <= limit:
        rows = store.sessions(project_id=project_id, hide=access.HIDDEN_KINDS,
                              active_only=active_only, limit=page, offset=offset)
        # Rows the SQL kept and the rule refuses would be a gap in the page: read on.
        found += [s for s in rows if s.id not in seen and allowed(s)]
        seen.update(s.id for s in rows)
        if len(rows) < page:
            break
        offset += page
    return found[:limit], len(found) > limit
