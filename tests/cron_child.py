"""A runtime process for the cross-process cron test, driven line by line on stdin.

Usage: python cron_child.py DB_URL START NAME HOLD_FILE

Runs a runtime with a brain on an injected clock starting at START. Commands:
``add`` (create the every-minute job, print its id), ``advance SECONDS``
(move the clock, wait until idle, print ``ok``), ``quit``. While HOLD_FILE
exists, the next turn prints ``holding`` and blocks until the process is
killed: that is how the parent SIGKILLs it in the middle of a turn.
"""

from __future__ import annotations

import os
import sys
import threading

from kinbox.actors import ManualClock, Runtime, Turn


def main() -> None:
    url, start, name, hold_file = sys.argv[1:]
    clock = ManualClock(float(start))
    forever = threading.Event()

    def brain(turn: Turn) -> str:
        if os.path.exists(hold_file):
            os.unlink(hold_file)
            print("holding", flush=True)
            forever.wait()  # until SIGKILL
        return f"{name} ran {turn.messages[0].message_id}"

    with Runtime(db=url, brain=brain, clock=clock) as rt:
        print("ready", flush=True)
        for line in sys.stdin:
            command, *args = line.split()
            if command == "add":
                print(rt.cron.add("tick", "* * * * *", "tick")["job_id"], flush=True)
            elif command == "advance":
                clock.advance(float(args[0]))
                rt.run_until_idle(timeout=30)
                print("ok", flush=True)
            elif command == "quit":
                break


if __name__ == "__main__":
    main()
