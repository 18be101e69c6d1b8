"""Runtimes a program never stopped are stopped at interpreter exit.

Every kinbox thread is a daemon, its pools' workers too (:mod:`.daemon_pool`): none holds
the exit, whatever it waits for (a brain deaf to its stop, a server that stopped
answering). Python joins the workers of ``concurrent.futures`` pools (a program's own) at
exit before ``atexit`` hooks run, so a hook there came after that join. The hook is
therefore a threading exit hook, registered after ``concurrent.futures``' own so that it
runs before it (they run last registered first): each still-running runtime stops
cleanly there (running turns are asked to stop and finish or hand their rows back)
before anything is joined; one whose stop is under way (on another thread) is waited for.
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
        # A stop under way too (one a turn began runs on a daemon thread): it ends first.
        if rt.state in ("running", "stopped"):
            try:
                rt.stop()
            except Exception:
                log.exception("stopping runtime %s at exit failed", rt.owner)


# CPython's hook for exactly this (3.9 and newer); a Python without it gets the plain
# atexit hook, which a turn holding a pool thread delays as described above.
getattr(threading, "_register_atexit", atexit.register)(_stop_live_runtimes)
