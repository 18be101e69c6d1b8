"""The observing half of the Runtime's API: observers, statistics, health, idleness.

A mixin of :class:`~.runtime.Runtime`, which supplies the running context
(``_running`` / ``_require``) and the parts these read: the writer, the shared
database's listener, the ticker, the services and the health checks.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, IdleTimeout, RuntimeStateError

if TYPE_CHECKING:
    from ..persistence import GroupCommitWriter
    from .context import Observer, RuntimeContext
    from .health import HealthChecks
    from .services import Services
    from .shared_database import SharedDatabase
    from .ticker import Ticker

IDLE_NUDGE_INTERVAL = 0.05
"""Seconds between the claims :meth:`WatchApi.run_until_idle` asks for while it waits."""


class WatchApi:
    """What a started runtime is doing, and waiting until it is done."""

    send_only: bool
    _state: str
    _observers: list[Observer]
    _writer: GroupCommitWriter | None
    _shared: SharedDatabase
    _ticker: Ticker
    _health: HealthChecks
    _services: Services | None
    _ctx: RuntimeContext | None

    def _running(self) -> RuntimeContext:
        raise NotImplementedError  # Runtime's

    def _require(self) -> RuntimeContext:
        raise NotImplementedError  # Runtime's

    def subscribe(self, observer: Observer) -> None:
        """Call ``observer(event, data)`` for sends, claims, turns, retries, crashes.

        Observers run on the thread where the event happens (a sender's, a session's, the
        dispatcher's, and the event loop for an async brain's turns): keep them quick and
        non-blocking; one that raises is logged and skipped."""
        self._observers.append(observer)

    @property
    def context(self) -> RuntimeContext:
        """The wiring shared by this runtime's actors (for extensions)."""
        return self._require()

    def statistics(self) -> dict[str, Any]:
        """A snapshot: dispatcher state, row counts per state, writer counters."""
        ctx = self._require()
        stats = ctx.activity.snapshot()
        stats["rows"] = ctx.journal.counts()
        stats["running"] = ctx.turns.running()
        if ctx.async_host is not None:
            stats.update(ctx.async_host.statistics())
        if self._writer is not None:
            w = self._writer.statistics()
            stats["writer"] = {"batches": w.batches, "operations": w.operations,
                               "largest_batch": w.largest_batch,
                               "retried_operations": w.retried_operations,
                               "retried_batches": w.retried_batches}
        if self._shared.listener is not None:
            stats["listener"] = self._shared.statistics()
        stats["alarms"] = self._ticker.alarms
        return stats

    def health(self, timeout: float = 2.0) -> dict[str, Any]:
        """Is this runtime fit to serve? ``{"healthy": bool, "checks": {name: {"ok": ...}}}``.

        ``runtime``: started and not stopped; ``database``: a read answers;
        ``writer``: an empty operation commits within ``timeout`` seconds (a
        writer that is alive but stuck is not healthy); ``dispatcher``: its
        actor is alive, or ``send-only`` when there is no brain. Never raises:
        a failing check says why in its ``error``.
        """
        return self._health.report(self._state, self._ctx, self._writer, self.send_only,
                                   timeout)

    def is_idle(self) -> bool:
        """True when no turn runs, no claim is scheduled and no row is due.

        The slot board and the journal are read one after the other, and a claim may
        begin between the two reads: one that failed a child's task row has committed
        that, but not yet the parent's wake-up (a transaction of its own, after it), so
        the journal shows nothing runnable. Idle only when the board did not move
        between the reads: a claim that begins moves it."""
        ctx = self._require()
        seen = ctx.activity.changes
        snap = ctx.activity.snapshot()
        if snap["busy"] or snap["claim_pending"]:
            return False
        if self._services is not None and not self._services.is_idle():
            return False
        return not ctx.journal.has_due(ctx.now()) and ctx.activity.changes == seen

    def run_until_idle(self, timeout: float = 10.0) -> None:
        """Wait until nothing can run before the next due time; :class:`IdleTimeout` after
        ``timeout``. A row in backoff, and the rows queued behind it, do not keep the
        runtime busy: move an injected clock (or wait) for them to come due.
        :class:`RuntimeStateError` (``state`` ``stopped`` or ``crashed``) as soon as the
        runtime stops under the wait (another thread's ``stop()``, a signal handler's):
        nothing more runs, and the wait would only run out its timeout."""
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError(f"timeout must be a positive number of seconds, not {timeout!r}",
                              field="timeout")
        ctx = self._running()
        if self.send_only:
            raise RuntimeStateError("a send-only runtime (no brain) runs no turns, so it is "
                                    "never busy delivering; give Runtime a brain to deliver",
                                    state="send-only")
        deadline = time.monotonic() + timeout
        nudged = -math.inf
        while not self.is_idle():
            if self._state != "running":
                raise RuntimeStateError(f"the runtime {self._state} while waiting for it to "
                                        "be idle", state=self._state)
            snap = ctx.activity.snapshot()
            if (not snap["busy"] and not snap["claim_pending"]
                    and time.monotonic() - nudged >= IDLE_NUDGE_INTERVAL):
                # Due rows and nothing on the way (a backoff ran out, say): nudge. Only
                # then: a nudge while a claim is pending would keep the dispatcher busy.
                # And not on every pass: a claim's end wakes the next one, and a row
                # another process runs keeps this one from idling without being claimable.
                ctx.wake_dispatcher()
                nudged = time.monotonic()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise IdleTimeout(timeout, self.statistics())
            ctx.activity.wait(min(remaining, 0.05))
