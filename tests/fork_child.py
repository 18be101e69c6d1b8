"""A process that holds a runtime's proof of life and forks a child that outlives it.

Usage: python fork_child.py DB_URL [OWNER]
SQLite: takes the database's exclusive lock; PostgreSQL: holds OWNER's life lock. Then it
forks a child that does not exec (a brain's ``multiprocessing`` worker, say) and waits
on its stdin; prints "held <child pid>" and waits for ever, to be SIGKILLed. The child
prints "forked" once it runs (the two lines in either order).
"""

from __future__ import annotations

import os
import sys
import threading

from kinbox.persistence import ExclusiveLock, OwnerLiveness, is_sqlite, open_database


def main() -> None:
    db = open_database(sys.argv[1])
    held: ExclusiveLock | OwnerLiveness  # kept: a collected one lets its lock go
    if is_sqlite(db):
        held = ExclusiveLock(db)  # type: ignore[arg-type]
        held.acquire()
    else:
        held = OwnerLiveness(db, sys.argv[2])  # type: ignore[arg-type]
        held.hold()
    child = os.fork()
    if child == 0:  # lives on after its parent's death, until its stdin closes
        # The fork hooks have run (they run before fork() returns here): the test waits
        # for this line, since a parent killed before the child ran them left the lock
        # held by the child's copy.
        os.write(1, b"forked\n")  # one write each: a pipe keeps it whole
        sys.stdin.read()
        os._exit(0)
    os.write(1, f"held {child}\n".encode())
    threading.Event().wait()
    print(held)  # never reached


if __name__ == "__main__":
    main()
