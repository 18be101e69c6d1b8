"""The runtime's timed and direct-turn services, started, ticked and stopped as one.

Focal's wake-up schedule, user cron jobs, social ingress and the bounded
pool their direct turns run on (cron runs and social events run turns only
where there is a brain). The order of a stop is theirs to know: the schedule
stops before the runtime's ticker; cron and social stop taking work before
the pool; a graceful stop gives the pool's running turns the stop's time,
then hands the social events no turn committed to the durable inbox; a
crash waits for nothing and hands nothing over. Either way the loop of the
async channel sends ends with the pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..persistence import CronStore, JobStore
from .channel_loop import CANCEL_GRACE
from .context import RuntimeContext
from .cron import CronService
from .direct_turn import DirectTurns
from .focal import Focal
from .focal_schedule import FocalSchedule
from .social import SocialService


class Services:
    """Focal's schedule, cron, social ingress and their direct-turn pool, of one runtime."""

    def __init__(self, ctx: RuntimeContext, focal: Focal, jobs: JobStore, *,
                 delivering: bool, real_time: bool,
                 gone: Callable[[Iterable[str]], set[str]] | None) -> None:
        """``real_time``: schedules fire on APScheduler's timers; otherwise (an injected
        clock moved by hand) on :meth:`on_clock`. ``gone``: which runtimes sharing the
        database are dead (PostgreSQL), for cron runs left behind."""
        self.schedule = FocalSchedule(ctx, focal, jobs, use_apscheduler=real_time)
        focal.schedule = self.schedule
        self.direct = DirectTurns(ctx) if delivering else None
        self.cron = CronService(ctx, CronStore(jobs.t, jobs.writer), self.direct,
                                use_apscheduler=real_time, gone=gone)
        self.social = SocialService(ctx, self.direct)
        self.social.channels.gone = gone
        ctx.outbox_hooks.append(self.social.outbox)

    def start_schedule(self) -> None:
        """Start Focal's wake-ups (a delivering runtime's, once its dispatcher runs)."""
        self.schedule.start()

    def stop_schedule(self) -> None:
        """Stop Focal's wake-ups (first in a stop: nothing new is to fire)."""
        self.schedule.stop()

    def start(self, *, exclusive: bool) -> None:
        """Start cron (definitions work everywhere; firing needs a brain) and social
        ingress; ``exclusive``: this runtime alone delivers on the database."""
        self.cron.start(exclusive=exclusive)
        self.social.start()

    def stop(self, *, wait: bool, timeout: float = 0.0) -> None:
        """Stop cron and social, then the pool; with ``wait``, give its running turns
        ``timeout`` to end, then hand the social events they have not committed to the
        inbox."""
        self.cron.stop()
        self.social.stop()
        if self.direct is not None:
            self.direct.stop(wait=wait, timeout=timeout)
        # The replies' sends run on the pool: ended now, or past the wait (then cancelled).
        self.social.channels.close(CANCEL_GRACE if wait else 0.5)
        if wait:  # a graceful stop keeps what no turn committed
            self.social.hand_over()

    def on_clock(self) -> None:
        """An injected clock moved: due wake-ups and cron jobs fire."""
        self.schedule.fire_due()
        self.cron.tick()

    def tick(self) -> None:
        """The runtime's periodic tick: running cron runs keep their leases, and the
        schedules' polls go on after a wall clock set back (APScheduler's stall)."""
        self.cron.renew_leases()
        self.schedule.keep_polling()
        self.cron.keep_polling()

    def is_idle(self) -> bool:
        """True when no direct turn runs or waits for the pool."""
        return self.direct is None or self.direct.is_idle()
