"""A runtime's proof of life does not outlive it in a child it forked.

A brain that forks without exec (a ``multiprocessing`` pool on Linux, ``os.fork``) gives
the child a copy of every descriptor: the SQLite database's exclusive lock file and the
PostgreSQL life lock's connection. Once the runtime was SIGKILLed, the child's copy kept
the lock: a restart on SQLite failed with DatabaseInUse, and on PostgreSQL the dead
runtime looked alive, so its direct-turn marks (which have no lease) held its sessions
for as long as the child lived.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kinbox.persistence import ExclusiveLock, OwnerLiveness, open_database

from .helpers import wait_for

CHILD = Path(__file__).with_name("fork_child.py")


class Holder:
    """The process of ``fork_child.py`` and the child it forked."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(CHILD), *args], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        try:
            # Both, in either order: a parent killed before its child ran the fork hooks
            # (on a loaded machine) left the lock held by the child's copy.
            lines = sorted(self.proc.stdout.readline() for _ in range(2))
            assert lines[0] == "forked\n" and lines[1].startswith("held "), lines
        except BaseException:
            self.proc.kill()  # and its child: it reads its stdin's end and exits
            self.proc.wait(30)
            self.proc.stdin.close()
            raise
        self.child = int(lines[1].split()[1])

    def kill_parent(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(30)
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # the forked child reads its end and exits
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(self.child, signal.SIGKILL)


@pytest.mark.timeout(60)
def test_a_forked_child_does_not_keep_the_sqlite_database_locked(db_url: str) -> None:
    holder = Holder(db_url)
    db = open_database(db_url)
    lock = ExclusiveLock(db)  # type: ignore[arg-type]
    try:
        holder.kill_parent()
        os.kill(holder.child, 0)  # the forked child still lives
        lock.acquire()  # was DatabaseInUse: the child's copy of the lock file held it
    finally:
        lock.release()
        holder.close()
        db.close()


@pytest.mark.postgres
@pytest.mark.timeout(60)
def test_a_forked_child_does_not_keep_a_dead_runtime_alive_on_postgresql(pg_url: str) -> None:
    holder = Holder(pg_url, "forking-owner")
    db = open_database(pg_url)
    checker = OwnerLiveness(db, "checker")  # type: ignore[arg-type]
    try:
        checker.hold()
        assert checker.gone(["forking-owner"]) == set()  # alive: its lock is held
        holder.kill_parent()
        os.kill(holder.child, 0)  # the forked child still lives
        wait_for(lambda: checker.gone(["forking-owner"]) == {"forking-owner"}, timeout=20,
                 what="the dead owner's life lock to be free")
    finally:
        checker.release()
        holder.close()
        db.close()
