"""The process the recovery benchmark kills: it enqueues messages and never acks them.

Usage: python -m kinbox.actors.bench_child DB_URL MESSAGES SESSIONS
Prints "enqueued" once every message is committed, then waits to be killed.
"""

from __future__ import annotations

import sys
import threading

from ..persistence import NewMessage
from .runtime import Runtime


def main() -> None:
    url, messages, sessions = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    hang = threading.Event()
    rt = Runtime(db=url, brain=lambda turn: hang.wait()).start()  # turns never commit
    project = rt.create_project("recovery")
    ids = [f"r{i:06d}" for i in range(sessions)]
    rt.context.store.create_many([(sid, project.id, sid, "interactive") for sid in ids],
                                 rt.clock.now())
    batch = [NewMessage(f"m{k:07d}", ids[k % sessions], f"message {k}")
             for k in range(messages)]
    for first in range(0, messages, 2000):
        rt.context.journal.enqueue_many(batch[first:first + 2000], rt.clock.now())
    rt.context.wake_dispatcher()
    print("enqueued", flush=True)
    hang.wait()


if __name__ == "__main__":
    main()
