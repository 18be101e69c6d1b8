"""What a forked child must not keep of its parent's: the proofs that the parent lives.

A child forked without exec (a brain's ``multiprocessing`` pool on Linux, ``os.fork``)
gets a copy of every descriptor, the SQLite exclusive lock's file and the PostgreSQL life
lock's connection among them. Its copy keeps the lock when the parent dies: a restart
found the database in use, and other runtimes took the dead one for alive, for as long
as the child lived. Each holder registers here and lets go of its copy in the child
(never of the lock itself, which stays the parent's).
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class ForkAware(Protocol):
    """A holder of a descriptor that proves its process alive."""

    def drop_in_forked_child(self) -> None:
        """In a newly forked child (one thread): forget the descriptor, closing only the
        child's copy of it; the parent keeps its lock."""
        ...


_holders: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def watch(holder: ForkAware) -> None:
    """Have ``holder`` drop its copy in every child forked from now on."""
    _holders.add(holder)


def _after_fork_in_child() -> None:
    for holder in list(_holders):
        try:
            holder.drop_in_forked_child()
        except Exception:  # a child must not fail to start for this
            continue


def blank(fd: int) -> None:
    """Point the descriptor ``fd`` of this process at ``/dev/null``: its object may go on
    using (and one day close) the number, but no longer reaches what the parent shares."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


os.register_at_fork(after_in_child=_after_fork_in_child)
