"""The direct-turn mark on a session row: which runtime's direct turn holds the session.

A direct turn (a cron run, a social event) runs outside the inbox, so the inbox's
leases do not order it against other runtimes' turns of the same session; the mark
does (on PostgreSQL claims and turn commits skip a marked session). These are the
mark's reads and writes, kept apart from the rest of the session store
(:mod:`.sessions`), which takes them in as a base class: the callers keep asking
the store, and no call goes through one more object.
"""

from __future__ import annotations

from .errors import RowNotFound
from .inbox_core import PROCESSING
from .models import Tables
from .stop_requests import forget_now
from .writer import GroupCommitWriter


class DirectTurnMarks:
    """Reads and writes of the sessions' direct-turn marks (a base of
    :class:`~.sessions.SessionStore`)."""

    t: Tables
    writer: GroupCommitWriter

    def end_direct_turn_now(self, session_id: str, owner: str, turn_id: str,
                            now: float) -> bool:
        """End the direct-turn mark of the turn ``turn_id`` of runtime ``owner``, inside the
        caller's transaction; False when the session holds no such mark (another runtime
        took it after this one's was ended as a gone runtime's: it stays)."""
        s = self.t.session
        return bool(s.update(turn_owner=None, turn_id=None, updated_at=now).where(
            (s.id == session_id) & (s.turn_owner == owner)
            & (s.turn_id == turn_id)).execute())

    def end_direct_turn(self, session_id: str, owner: str, turn_id: str,
                        now: float) -> bool:
        """:meth:`end_direct_turn_now` in a transaction of its own."""
        return self.writer.call(
            lambda: self.end_direct_turn_now(session_id, owner, turn_id, now))

    def take_direct_turn(self, session_id: str, owner: str, turn_id: str,
                         now: float) -> bool:
        """Mark the session for the direct turn ``turn_id`` of runtime ``owner``; False
        (nothing written) while another runtime's direct turn holds the mark.

        From the mark on, no runtime on PostgreSQL leases the session a new row (claims
        skip it, and a turn's commit does not chain its next row into it), so the inbox
        turns of other runtimes that run now are the last before it:
        :meth:`others_processing` says when they are over. (This runtime's own inbox turn
        is ordered in its memory: ``RunningTurns``.)"""
        s = self.t.session

        def mark() -> bool:
            if s.update(turn_owner=owner, turn_id=turn_id, updated_at=now).where(
                    (s.id == session_id)
                    & (s.turn_owner.is_null() | (s.turn_owner == owner))).execute():
                return True
            if not s.select(s.id).where(s.id == session_id).exists():
                raise RowNotFound("session", session_id)
            return False
        # A mark whose batch outran the wait may commit yet: known, or it stays for good.
        return self.writer.call_landed(mark)

    def others_processing(self, session_id: str, owner: str) -> bool:
        """Does a runtime other than ``owner`` hold a row of the session in processing (an
        inbox turn the session's marked direct turn waits for)?"""
        m = self.t.inbox
        return (m.select(m.message_id)
                .where((m.target_chat_id == session_id) & (m.status == PROCESSING)
                       & (m.lease_owner != owner)).exists())

    def direct_turn(self, session_id: str) -> tuple[str, str | None] | None:
        """The runtime running a direct turn of the session and that turn's id; None when
        none runs."""
        s = self.t.session
        row = s.select(s.turn_owner, s.turn_id).where(s.id == session_id).first()
        if row is None or row.turn_owner is None:
            return None
        return row.turn_owner, row.turn_id

    def direct_turn_owners(self) -> set[str]:
        """The runtimes whose direct turns mark sessions now."""
        s = self.t.session
        return {r.turn_owner for r in s.select(s.turn_owner).distinct().where(
            s.turn_owner.is_null(False))}

    def end_direct_turn_marks(self, now: float, owners: set[str] | None = None) -> int:
        """End the direct-turn marks of ``owners`` (runtimes known to be gone), or every
        one (the start of a runtime that holds the database alone: no direct turn runs,
        so a mark is a dead process's), with the stop requests naming their turns; how
        many."""
        s = self.t.session
        cond = (s.turn_owner.is_null(False) if owners is None
                else s.turn_owner.in_(sorted(owners)))

        def op() -> int:
            # The stops asked of those dead turns go with their marks: a run taken over
            # runs a turn of the same id, which a lingering request stopped as it began.
            forget_now(self.t, [r.turn_id for r in s.select(s.turn_id)
                                .where(cond, s.turn_id.is_null(False))])
            return int(s.update(turn_owner=None, turn_id=None, updated_at=now).where(cond)
                       .execute())
        return self.writer.call(op)
