"""Taking over from runtimes that are gone (PostgreSQL).

A runtime on PostgreSQL holds a life lock tied to its connection
(:class:`~kinbox.persistence.OwnerLiveness`). The rows leased by a runtime whose lock
is free, and the direct-turn marks it left, need not wait for their leases: this
makes them claimable at once, starts their cron runs and sends the social replies they
kept, so a restart after SIGKILL (or a live runtime beside it) resumes within a second
while a live, slow owner is never robbed.
"""

from __future__ import annotations

import logging

from ..persistence import OwnerLiveness
from .context import RuntimeContext
from .services import Services

log = logging.getLogger("kinbox.runtime")

TAKEOVER_INTERVAL = 0.5
"""Seconds between checks for runtimes that died holding leases (PostgreSQL)."""


def take_over_from_the_gone(ctx: RuntimeContext, liveness: OwnerLiveness,
                            services: Services | None = None) -> None:
    """Make the rows of runtimes whose life lock is free claimable now, end their direct
    turns' marks, and (given ``services``, a running runtime's) start their cron runs
    and send the social replies they kept.
    Raises :class:`~kinbox.persistence.LifeLockLost` when this runtime's own lock is gone
    (to every other runtime it is dead now)."""
    # Its own lock first, on the lock's connection: the reads below need a connection of
    # their own, and while a restarting server takes none they failed first, every time,
    # and a runtime whose lock was gone ran on until the server was back.
    liveness.still_held()
    leasing, marking = ctx.journal.lease_owners(), ctx.store.direct_turn_owners()
    gone = liveness.gone(leasing | marking)
    leased, marked = gone & leasing, gone & marking
    if leased:
        taken = ctx.journal.expire_leases(ctx.now(), owners=leased)
        log.warning("took over %d rows leased by %d runtime(s) that are gone: %s",
                    taken, len(leased), ", ".join(sorted(leased)))
        ctx.wake_dispatcher()
    if marked:
        ended = ctx.store.end_direct_turn_marks(ctx.now(), owners=marked)
        log.warning("ended %d direct-turn marks of runtime(s) that are gone: %s",
                    ended, ", ".join(sorted(marked)))
    if services is not None:
        services.cron.take_over_the_gone()
        services.social.take_over_the_gone()
