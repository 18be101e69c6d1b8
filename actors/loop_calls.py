"""Calls onto an event loop from threads that may outlive it.

The async host closes its loop when the runtime stops. A thread that answers a
turn on that loop afterwards (the writer settling a write a stop gave up on, a
flag raised late, an observer of a turn that ended) finds nobody awaiting there
any more: its call is dropped, not raised into the thread that made it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVarTuple, Unpack

Ts = TypeVarTuple("Ts")


def call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[Unpack[Ts]], object],
              *args: *Ts) -> bool:
    """Run ``callback(*args)`` on ``loop`` soon (any thread); False if the loop has closed."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # asyncio's answer for a closed loop: nobody waits there any more
        return False
    return True
