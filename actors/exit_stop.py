"""Runtimes a program never stopped are stopped at interpreter exit.

Every kinbox thread is a daemon, so the interpreter reaches ``atexit`` even
while runtimes run; there each still-running runtime stops cleanly (running
turns are asked to stop and finish or hand their rows back).
"""

from __future__ import annotations

import atexit
import logging
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


@atexit.register
def _stop_live_runtimes() -> None:
    for rt in list(_live):
        if rt.state == "running":
            try:
                rt.stop()
            except Exception:
                log.exception("stopping runtime %s at exit failed", rt.owner)
