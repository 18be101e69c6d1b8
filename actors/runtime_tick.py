"""The Runtime's tick: what a started runtime does on its own between the calls it gets.

A mixin of :class:`~.runtime.Runtime`. Each tick (the :class:`~.ticker.Ticker`'s, or an
injected clock's move) lets the services renew and fire their schedules, reports child
tasks another process ended, takes over (on PostgreSQL) the rows of runtimes that are
gone, prunes a batch of finished rows when a retention is set (:mod:`.pruning`), and
nudges the dispatcher; an alarm wakes the dispatcher for a row that came due. During a
graceful stop the tick does one thing only, until the turns the stop waits for have
ended: it keeps their leases, and those of running cron runs (:mod:`.lease_renewal`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..persistence import LifeLockLost, PersistenceError
from . import subagents
from .lease_renewal import log_failure
from .messages import Tick
from .takeover import TAKEOVER_INTERVAL, take_over_from_the_gone

if TYPE_CHECKING:
    from ..persistence import OwnerLiveness
    from .context import RuntimeContext
    from .lease_renewal import LeaseRenewal
    from .pruning import Retention
    from .services import Services
    from .shared_database import SharedDatabase
    from .ticker import Ticker

log = logging.getLogger("kinbox.runtime")


class TickApi:
    """The tick's work, on the state the runtime keeps."""

    _state: str
    _ctx: RuntimeContext | None
    _liveness: OwnerLiveness | None
    _services: Services | None
    _shared: SharedDatabase
    _ticker: Ticker
    _unsubscribe: Callable[[], None] | None
    _last_takeover: float
    _last_report: float
    _retention: Retention | None
    _renewal: LeaseRenewal | None
    crash: Callable[[], None]
    """The runtime's: a runtime that lost its life lock ends as if killed."""

    def _take_over_from_the_gone(self) -> None:
        """PostgreSQL: :func:`.takeover.take_over_from_the_gone`, at most each
        :data:`.takeover.TAKEOVER_INTERVAL`; a runtime that lost its own life lock ends
        as if killed."""
        ctx, liveness = self._ctx, self._liveness
        if ctx is None or liveness is None:
            return
        self._last_takeover = time.monotonic()
        try:
            services = self._services if self._state == "running" else None  # cron started
            take_over_from_the_gone(ctx, liveness, services)
        except LifeLockLost as exc:
            # To every other runtime this one is dead now, and they take its rows over:
            # go on delivering and its commits would all be refused. End as a kill would;
            # a supervisor (or the program) starts a new runtime, which replays at once.
            log.error("%s; this runtime stops as if killed: start it again", exc)
            if self._state == "running":
                self.crash()
        except PersistenceError as exc:  # the database's (a lost connection: one line)
            log_failure(log, "checking for runtimes that are gone", exc,
                        "their leases expire as usual, and the next tick checks again")
        except Exception:
            log.exception("checking for runtimes that are gone failed; their leases expire "
                          "as usual")

    def _report_ended_elsewhere(self, ctx: RuntimeContext) -> None:
        """Every :data:`.subagents.REPORT_INTERVAL` (on the runtime's clock): report the
        child tasks whose message another process ended (``kinbox inbox cancel``, another
        runtime's claim on PostgreSQL), which this runtime's own paths never see: the
        parent would hear only at the next start."""
        now = ctx.now()
        if now - self._last_report < subagents.REPORT_INTERVAL:
            return
        self._last_report = now
        try:
            if subagents.report_orphans(ctx):
                log.info("reported child tasks whose message another process ended")
        except Exception:
            log.exception("looking for child tasks ended elsewhere failed; the next "
                          "interval looks again")

    def _stop_ticker(self) -> None:
        self._ticker.stop()
        self._stop_listening()

    def _stop_listening(self) -> None:
        """No more nudges from other processes or from an injected clock's moves."""
        self._shared.stop_listening()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _keep_leases(self) -> None:
        """During a graceful stop, the ticker's only work: the leases of the turns it
        waits for (the dispatcher, stopping its session actors, takes no tick) and of
        the cron runs still running stay a lease ahead."""
        if self._renewal is not None:
            self._renewal.renew_if_due()
        if self._services is not None:
            self._services.cron.renew_leases()

    def _on_clock(self) -> None:
        # An injected clock moved: due schedules fire, due rows get claimed.
        if self._services is not None and self._state == "running":
            self._services.on_clock()
        self._tick()

    def _wake(self) -> None:
        # An alarm rang: a row a claim saw not yet due is due now.
        if self._ctx is not None and self._state == "running":
            self._ctx.wake_dispatcher()

    def _tick(self) -> None:
        if self._state == "stopped":  # a graceful stop under way (the ticker ends with it)
            self._keep_leases()
            return
        ctx = self._ctx
        if (self._liveness is not None and self._state == "running"
                and time.monotonic() - self._last_takeover >= TAKEOVER_INTERVAL):
            self._take_over_from_the_gone()
        if self._services is not None and self._state == "running":
            self._services.tick()
        if ctx is not None and ctx.dispatcher is not None and self._state == "running":
            self._report_ended_elsewhere(ctx)
            try:
                ctx.dispatcher.tell(Tick())
            except Exception:
                pass  # the dispatcher is stopping
            if ctx.peers is not None:  # devices paired by another process since the start
                ctx.peers.tick()
        # Last: a batch waits on the writer, and the dispatcher's tick (lease renewals,
        # due rows) must not wait behind it.
        if ctx is not None and self._retention is not None and self._state == "running":
            self._retention.tick(ctx)  # one bounded batch, when a pass is under way or due
