"""Taking back the rows leased to this runtime that nothing here runs.

A lease is written by one statement and known here by its answer. When the connection
goes between the two (a server restart, a failover, a cut network: the server committed,
the runtime got a connection error), the runtime takes the claim, the send or the commit
that leased the row for failed, and nothing runs the row. Its owner is alive, so no one
takes it over (:mod:`.takeover`), and only rows of sessions held here are renewed
(:mod:`.lease_renewal`): the session stalled until the lease ran out (30 s by default),
and the row came back as a suspect. The dispatcher, between two of its claims, hands back
unrun the ``local`` rows leased to this runtime that no session here holds, once their
lease is :data:`UNHELD_GRACE` old (a row leased with its send is offered to the slots an
instant after its commit), and claims them again at once.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from ..persistence import PersistenceError, WriterClosed
from .lease_renewal import failure_level

if TYPE_CHECKING:
    from .context import RuntimeContext
    from .slots import Slots

log = logging.getLogger("kinbox.dispatcher")

UNHELD_GRACE = 1.0
"""Seconds (on the runtime's clock) a lease must be old before its row, held by no
session here, is taken back; also the least time between two looks."""

TRANSPORT = "local"
"""The rows the dispatcher claims and runs (a peer link holds its device's rows itself)."""


class UnheldLeases:
    """The dispatcher's look, at most each :data:`UNHELD_GRACE`, for rows leased to this
    runtime that no session here holds; run between claims (on the dispatcher's thread), so
    no claim of its own is half done."""

    def __init__(self, ctx: RuntimeContext, slots: Slots) -> None:
        self.ctx = ctx
        self.slots = slots
        self._looked = -math.inf
        """When (on the runtime's clock) the last look ran."""

    def take_back_if_due(self) -> list[str]:
        """Hand back unrun the rows leased here that no session holds; their ids. A
        database failure is logged, and the next look tries again."""
        ctx = self.ctx
        now = ctx.now()
        if 0.0 <= now - self._looked < UNHELD_GRACE or ctx.closed.is_set():
            return []
        self._looked = now
        try:
            # Read before the sessions held: a row held now that ends its turn after the
            # read is acknowledged or released by then, and the hand-back is fenced.
            leased = ctx.journal.leases_of(ctx.owner, TRANSPORT,
                                           now + ctx.lease_seconds - UNHELD_GRACE)
            if not leased:
                return []
            held = set(self.slots.held())
            unheld = [mid for mid, target in leased if target not in held]
            if unheld:
                ctx.journal.hand_back(ctx.owner, unheld, now)
                log.warning("took back %d rows leased to this runtime that nothing here "
                            "ran (a lease whose answer was lost with its connection)",
                            len(unheld))
            return unheld
        except WriterClosed:
            return []
        except PersistenceError as exc:
            log.log(failure_level(exc), "looking for rows leased here that nothing runs "
                    "failed (%s, SQLSTATE %s): %s; the next tick looks again",
                    type(exc).__name__, getattr(exc, "sqlstate", None), exc)
            return []
