"""The outbox of social replies: a committed reply, kept until its platform took it.

A social turn's replies leave for their chat platform once the turn has committed.
A stop or a crash can cut that send off, and the reply, in the transcript, then never
reached the user. So the reply is also written here, in the turn's commit
(:meth:`SocialOutbox.keep_now`), and deleted once its send ended for good
(:meth:`SocialOutbox.settle`: the platform accepted it or refused it, or every retry
failed while the runtime ran). A reply some other runtime kept and never settled (an
earlier life of this one cut off, or on PostgreSQL a runtime that died while this one
ran) is sent again (:meth:`SocialOutbox.left_by_others`) by the runtime that takes it
over (:meth:`SocialOutbox.take_over`): at least once, its ``reply_id`` the platform's
dedupe key.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from .conflicts import unless_present
from .models import Tables
from .writer import GroupCommitWriter


@dataclass(frozen=True)
class KeptReply:
    """A committed reply on its way to its platform."""

    reply_id: str
    """The message id that caused it: the platform's dedupe key."""
    session_id: str
    platform: str
    route: Mapping[str, Any]
    text: str
    owner: str
    """The runtime that committed it (and sends it while it lives)."""


class SocialOutbox:
    """The ``social_replies`` table."""

    def __init__(self, t: Tables, writer: GroupCommitWriter) -> None:
        self.t = t
        self.writer = writer

    def keep_now(self, reply: KeptReply, now: float) -> None:
        """Keep ``reply`` inside the caller's transaction (the turn's commit); one kept
        already (the same cause, committed again elsewhere) stays as it was."""
        r = self.t.social_reply
        unless_present(r.insert(
            reply_id=reply.reply_id,
            session_id=reply.session_id,
            platform=reply.platform,
            route=json.dumps(dict(reply.route), sort_keys=True),
            text=reply.text,
            owner=reply.owner,
            created_at=now,
        ), r.reply_id).execute()

    def settle(self, reply_id: str) -> None:
        """The reply's send ended for good: forget it."""
        r = self.t.social_reply
        self.writer.call(lambda: r.delete().where(r.reply_id == reply_id).execute())

    def take_over(self, reply_ids: list[str], gone: set[str], owner: str) -> set[str]:
        """Make ``owner`` the sender of those of ``reply_ids`` still kept by a runtime in
        ``gone``; the ids this call took. Two takers of the same reply (two runtimes, or
        one runtime's start and its tick): the first update wins, the other's finds the
        reply no longer the gone one's and takes nothing, so one of them sends it."""
        r = self.t.social_reply

        def take() -> set[str]:
            taken = (
                r.update(owner=owner)
                .where(r.reply_id.in_(reply_ids), r.owner.in_(sorted(gone)))
                .returning(r.reply_id)
                .tuples()
                .execute()
            )
            return {reply_id for (reply_id,) in taken}

        # Its outcome must be known: a take-over whose batch outran the wait and then
        # committed made this live runtime the replies' sender, which never sent them, and
        # no other runtime takes a live one's replies over.
        return self.writer.call_landed(take) if reply_ids else set()

    def left_by_others(self, platforms: list[str], owner: str,
                       also: Collection[str] = ()) -> list[KeptReply]:
        """The replies for ``platforms`` that runtimes other than ``owner`` kept and never
        settled, and those of ``also`` (reply ids) whoever keeps them, oldest first."""
        r = self.t.social_reply
        others = r.owner != owner
        if also:
            others |= r.reply_id.in_(sorted(also))
        rows = (
            r.select()
            .where(r.platform.in_(platforms), others)
            .order_by(r.created_at, r.reply_id)
        )
        return [
            KeptReply(
                row.reply_id,
                row.session_id,
                row.platform,
                json.loads(row.route),
                row.text,
                row.owner,
            )
            for row in rows
        ]
