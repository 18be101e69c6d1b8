"""Taking back the rows leased to this runtime that nothing here runs.

A lease is written by one statement and known here by its answer. When the connection
goes between the two (a server restart, a failover, a cut network: the server committed,
the runtime got a connection error), the runtime takes the claim, the send or the commit
that leased the row for failed, and nothing runs the row. Its owner is alive, so no one
takes it over (:mod:`.takeover`), and only rows of sessions held here are renewed
(:mod:`.lease_renewal`): the session stalled until the lease ran out (30 s by default),
and the row came back as a suspect.

The dispatcher, between two of its claims, looks at most each :data:`LOOK_INTERVAL` for
the ``local`` rows leased to this runtime whose session no slot here holds, and hands
back unrun those it saw so at its last look too, with the same lease (not renewed, not
leased again); its claim then takes them again. A row leased with its send (SQLite's
fast path) is offered to the slots by the sending thread once the commit's answer
reaches it, however late that thread gets there (a slow observer of ``sent``, a thread
descheduled): it is left alone until then (``RuntimeContext.handing_over``). Taken back
after two looks instead, it ran twice: its claim's turn, then the sender's. Two looks
still, not one: a lease seen once may be one a turn takes up an instant later.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection
from typing import TYPE_CHECKING

from ..persistence import PersistenceError, WriterClosed
from .lease_renewal import log_failure

if TYPE_CHECKING:
    from .context import RuntimeContext
    from .slots import Slots

log = logging.getLogger("kinbox.dispatcher")

LOOK_INTERVAL = 1.0
"""Seconds (on the runtime's clock) at least between two looks: a row nothing here runs
goes back within two of them."""


def unheld(leased: list[tuple[str, str, float]], held: set[str],
           handing_over: Collection[str] = ()) -> dict[str, float]:
    """Of ``leased`` (message id, target, lease end), the rows whose target is not in
    ``held`` and that no sending thread is about to offer (``handing_over``, message ids):
    message id -> lease end."""
    return {mid: until for mid, target, until in leased
            if target not in held and mid not in handing_over}


def seen_twice(before: dict[str, float], now: dict[str, float]) -> list[str]:
    """The rows of ``now`` (message id -> lease end) that ``before`` had with the same
    lease end, in id order."""
    return sorted(mid for mid, until in now.items() if before.get(mid) == until)


class UnheldLeases:
    """The dispatcher's looks for rows leased to this runtime that no session here holds;
    run between claims (on the dispatcher's thread), so no claim of its own is half done."""

    def __init__(self, ctx: RuntimeContext, slots: Slots) -> None:
        self.ctx = ctx
        self.slots = slots
        self._looked = -math.inf
        """When (on the runtime's clock) the last look ran."""
        self._seen: dict[str, float] = {}
        """The rows the last look found unheld: message id -> lease end."""

    def take_back_if_due(self) -> list[str]:
        """Hand back unrun the rows leased here that no session held at this look and the
        last; their ids. A database failure is logged, and the next look tries again."""
        ctx = self.ctx
        now = ctx.now()
        if 0.0 <= now - self._looked < LOOK_INTERVAL or ctx.closed.is_set():
            return []
        self._looked = now
        try:
            # Read before the sessions held: a row held then that ends its turn after the
            # read is acknowledged or released by then, and a hand-back is fenced.
            leased = ctx.journal.leases_of(ctx.owner)
            # The sends handing their rows over, then the sessions held: a send gone from
            # the first has offered its row, so the second holds it.
            sending = set(ctx.handing_over)
            found = unheld(leased, set(self.slots.held()), sending) if leased else {}
            back = seen_twice(self._seen, found)
            self._seen = {mid: until for mid, until in found.items() if mid not in back}
            if back:
                ctx.journal.hand_back(ctx.owner, back, now)
                log.warning("took back %d rows leased to this runtime that nothing here "
                            "ran (a lease whose answer was lost with its connection)",
                            len(back))
            return back
        except WriterClosed:
            return []
        except PersistenceError as exc:
            log_failure(log, "looking for rows leased here that nothing runs", exc,
                        "the next tick looks again")
            return []
