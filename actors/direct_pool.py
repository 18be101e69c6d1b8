"""Where direct turns (cron runs, social events) and the work around them run.

With a sync brain, on a small, bounded pool of threads owned here; with an async brain,
on the runtime's event loop (:meth:`.brain_tasks.BrainTasks.drive_direct`), where a turn
waiting on its model holds no thread (B1). Plain work (a social reply's send) runs on the
pool either way. Both count as in flight until they end: ``wait_idle`` and a stop wait
for them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..persistence import WriterClosed
from .context import RuntimeContext
from .daemon_pool import DaemonPool
from .steps import Steps, settle

log = logging.getLogger("kinbox.direct")


class DirectPool:
    """Runs direct turns' work on a bounded pool, or their steps on the event loop."""

    def __init__(self, ctx: RuntimeContext, workers: int = 4) -> None:
        self.ctx = ctx
        self._pool = DaemonPool(workers, "kinbox-direct")  # a deaf turn holds no exit
        self._cond = threading.Condition()
        self._in_flight = 0
        self._closed = False

    def submit(self, work: Callable[[], object]) -> Future[object] | None:
        """Run ``work`` on the pool; None once the runtime is stopping."""
        with self._cond:
            if self._closed:
                return None
            self._in_flight += 1
        try:
            future = self._pool.submit(self._tracked, work)
        except RuntimeError:  # the pool shut down under us
            self._done()
            return None
        future.add_done_callback(lambda _f: self._done())  # run, failed or cancelled
        return future

    def submit_steps(self, make: Callable[[], Steps[Any]]) -> Future[Any] | None:
        """Carry out the steps ``make`` builds (a turn, the caller's work around it):
        on the event loop of async brains, else on the pool; None once the runtime is
        stopping."""
        host = self.ctx.async_host
        if host is None:
            return self.submit(lambda: settle(make()))
        with self._cond:
            if self._closed:
                return None
            self._in_flight += 1
        future = host.drive_direct(make)
        if future is None:  # the loop has ended
            self._done()
            return None
        future.add_done_callback(lambda _f: self._done())  # run, failed or cancelled
        return future

    def _tracked(self, work: Callable[[], object]) -> object:
        try:
            return work()
        except WriterClosed:
            return None  # the runtime stopped or crashed: the tables keep the state
        except Exception:
            log.exception("a direct turn's work failed")
            return None

    def _done(self) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def is_idle(self) -> bool:
        """True when no direct turn is queued or running."""
        with self._cond:
            return self._in_flight == 0

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no direct turn is queued or running; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._in_flight == 0, timeout)

    def stop(self, *, wait: bool = True, timeout: float = 10.0) -> None:
        """Accept no more work; with ``wait``, give running turns ``timeout`` to finish."""
        with self._cond:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        if wait and not self.wait_idle(timeout):
            log.warning("direct turns still running after %.1fs at stop", timeout)
