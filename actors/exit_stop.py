"""Runtimes a program never stopped are stopped at interpreter exit.

Every kinbox thread is a daemon (direct turns, and what async brains hand to a thread, run
on :mod:`.daemon_pool`) but the workers of the ``concurrent.futures`` pools (the async
host's blocking workers, the scheduler's), which
Python joins at exit before ``atexit`` hooks run: a hook there came after the join, and a
program that ended while a social or cron turn ran waited for the brain to end on its own
(for ever, for one that waits for its stop). The hook is therefore a threading exit
hook, registered after ``concurrent.futures``' own so that it runs before it (they run
last registered first): each still-running runtime stops cleanly there (running turns
are asked to stop and finish or hand their rows back), and the pools' workers are idle
by the join.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401  (its exit hook first: ours runs before it)
import logging
import threading
import weakref
from typing import Protocol

log = logging.getLogger("kinbox.runtime")


class Stoppable(Protocol):
    """What the exit hook needs of a runtime."""

    owner: str

    @property
    def state(self) -> str: ...

    def stop(self) -> None: ...


_live: weakref.WeakSet[Stoppable] = weakref.WeakSet()


def stop_at_exit(rt: Stoppable) -> None:
    """Stop ``rt`` at interpreter exit if its program never did."""
    _live.add(rt)


def _stop_live_runtimes() -> None:
    for rt in list(_live):
        if rt.state == "running":
            try:
                rt.stop()
            except Exception:
                log.exception("stopping runtime %s at exit failed", rt.owner)


# CPython's hook for exactly this (3.9 and newer); a Python without it gets the plain
# atexit hook, which a turn holding a pool thread delays as described above.
getattr(threading, "_register_atexit", atexit.register)(_stop_live_runtimes)
