"""The dispatcher actor: claims due rows by lease, renews leases, passivates idle actors.

Its mailbox mirror is the set of due rows in the journal; its own messages
(``Wake``, ``ClaimNow``, ``Tick``) are ephemeral nudges. It claims rows that
nothing hands over: recovery, retries that came due, rows other processes
wrote, every row on PostgreSQL. Rows a send leased in its own transaction
(the fast path, see ``RuntimeContext.fast_lease``) and the end of each turn
never pass through here: the sender's and the session's threads start and end
turns on the shared slot table (:mod:`.slots`), which keeps one row in flight
per target (the journal enforces that across processes) and at most
``max_active`` turns at once. What must be serial and may wait for the
database runs here: the claim (one at a time, many requests coalesced into
one query), the renewal of the leases of running turns, and passivation of
actors idle past ``idle_ttl``. A claim that saw a target's next row not yet due
asks the ticker for an alarm at its due time (``RuntimeContext.alarm_in``).
"""

from __future__ import annotations

import logging
from typing import Any

import pykka

from ..persistence import ClaimResult, PersistenceError, WriterClosed
from . import stops, subagents
from .context import RuntimeContext
from .lease_renewal import LeaseRenewal, log_failure
from .messages import ClaimNow, Tick, Wake
from .slots import Slots
from .unheld_leases import UnheldLeases

log = logging.getLogger("kinbox.dispatcher")

def tick_interval_for(tick_interval: float, lease_seconds: float) -> float:
    """The runtime's tick: every ``tick_interval``, but at least four times a lease.

    Leases (of running turns, here, and of cron runs) are renewed on the tick once a third
    of a lease has passed since the last renewal. A tick farther apart than that (a
    ``tick_interval`` raised to poll less, as with many workers) let a live turn's lease
    run out between two ticks, and another process took its row over and ran the turn
    again while this one still ran it. A quarter keeps each renewal at most about half a
    lease after the last, whatever the tick."""
    return min(tick_interval, lease_seconds / 4)


class Dispatcher(pykka.ThreadingActor):
    """Claims due inbox rows and starts their turns on the slot table."""

    # A daemon, like every kinbox thread: a program that never calls stop() still
    # reaches atexit, where the runtime stops cleanly.
    use_daemon_thread = True

    def __init__(self, ctx: RuntimeContext, slots: Slots, idle_ttl: float,
                 renewal: LeaseRenewal) -> None:
        super().__init__()
        self.ctx = ctx
        self.slots = slots
        self.idle_ttl = idle_ttl
        self.renewal = renewal
        self.unheld = UnheldLeases(ctx, slots)
        ref = self.actor_ref  # its mailbox takes messages before the actor runs

        def request_claim() -> None:
            try:
                ref.tell(ClaimNow())
            except pykka.ActorDeadError:
                pass  # stopping: the journal keeps every row for the next start

        slots.request_claim = request_claim

    def on_receive(self, message: Any) -> None:
        if self.ctx.crashed.is_set():
            return
        try:
            self._handle(message)
        except Exception:
            # A bug or an unexpected driver error must not stop the runtime's only
            # dispatcher: the journal still holds every row, the next nudge or tick
            # claims again, and rows leased just before the error come back when
            # their lease runs out.
            log.exception("the dispatcher failed on %s; carrying on", type(message).__name__)

    def _handle(self, message: Any) -> None:
        if isinstance(message, Wake):
            self.ctx.wake_pending = False  # before the claim: later sends nudge again
            if self.slots.wake():
                self.actor_ref.tell(ClaimNow())
        elif isinstance(message, ClaimNow):
            self._claim(requested=True)
        elif isinstance(message, Tick):
            now = self.ctx.now()
            for session_id in self.ctx.turns.stop_overdue(now, self.ctx.turn_timeout):
                log.warning("the turn of %s ran past turn_timeout=%ss; asked it to stop",
                            session_id, self.ctx.turn_timeout)
            if self.ctx.async_host is not None:
                self.ctx.async_host.watch()
                lingering = self.ctx.turns.ignoring_stop(now, self.ctx.stop_grace)
                if lingering:
                    self.ctx.async_host.cancel(lingering)
            self.renewal.renew_if_due()
            self.unheld.take_back_if_due()  # claimed again below, with the rest
            self._carry_out_stops()
            self.slots.passivate_expired(self.ctx.now(), self.idle_ttl)
            self._claim(requested=False)

    def _carry_out_stops(self) -> None:
        """The stops others asked of this process's turns (:func:`.stops.carry_out`); a
        database failure is logged as a failed claim is, and the tick goes on (to its
        passivation and its claim): the next tick reads the requests again."""
        try:
            stops.carry_out(self.ctx)
        except PersistenceError as exc:
            log_failure(log, "reading the stop requests", exc, "the next tick reads them again")

    def on_stop(self) -> None:
        self.slots.stop()
        self.ctx.journal.t.db.close()

    def _claim(self, requested: bool) -> None:
        capacity, exclude, suspects = self.slots.claim_window(requested)
        result = None
        try:
            if capacity > 0:
                result = self._claim_rows(capacity, exclude, suspects)
        finally:
            if result is None:  # nothing to start: the board shows the claim over
                self.slots.claim_ended()
        if result is None:
            return
        if result.next_due is not None:
            self.ctx.alarm_in(result.next_due - self.ctx.now())
        if result.failed:  # ended outside a turn: a sub-agent's parent must hear of it
            subagents.report_ended(self.ctx, result.failed)
        for message_id in result.acked_by_marker:
            log.debug("acknowledged %s by its committed marker (no second turn)", message_id)
            self.ctx.emit("acked_by_marker", message_id=message_id)
        if self.slots.claimed(result, capacity):
            self.actor_ref.tell(ClaimNow())

    def _claim_rows(self, capacity: int, exclude: set[str], suspects: int
                    ) -> ClaimResult | None:
        ctx = self.ctx
        if ctx.closed.is_set():
            # Stopping: a row leased now could not run here, only be handed back (and
            # claimed again, round and round until the stop reaches the slots).
            return None
        try:
            return ctx.journal.claim(ctx.owner, ctx.now(), limit=capacity,
                                     lease=ctx.lease_seconds, exclude=exclude,
                                     suspects=suspects)
        except WriterClosed:
            return None
        except PersistenceError as exc:
            log_failure(log, "claim", exc, "the next tick claims again")
            return None
