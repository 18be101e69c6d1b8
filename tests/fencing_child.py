"""The two workers of the fencing test (a real SIGSTOP past the lease).

Usage: python fencing_child.py ROLE DB_URL LEASE_SECONDS

``paused``   a Runtime whose brain prints ``turn started MESSAGE_ID``, then holds
             the turn until stdin says ``go``; it replies ``late reply from A`` and
             exits when stdin says ``stop``. Its log (WARNING and up) goes to stderr.
``runtime``  a Runtime that runs until the first message is delivered (replying
             ``reply from B``), prints ``delivered`` and exits.
``journal``  the journal API, no Runtime (on SQLite a delivering Runtime holds the
             file's lock, so a second process meets the first here): claims the row
             once its lease ran out, commits the turn ``reply from B`` and exits.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

from kinbox.actors import Runtime, Turn
from kinbox.actors.crash_run import stores
from kinbox.persistence import TurnEntry

MESSAGE = "m00000"
SESSION = "s00"


def paused(url: str, lease: float) -> None:
    go = threading.Event()
    announced = threading.Event()  # "ready" comes first on stdout, however fast the claim

    def brain(turn: Turn) -> None:
        if not announced.wait(60):
            raise RuntimeError("the runtime never started")
        print(f"turn started {turn.row.message_id}", flush=True)
        if not go.wait(60):
            raise RuntimeError("never told to go on")
        turn.reply("late reply from A")

    with Runtime(db=url, brain=brain, lease_seconds=lease, tick_interval=0.05):
        print("ready", flush=True)
        announced.set()
        for line in sys.stdin:
            if line.strip() == "go":
                go.set()
            elif line.strip() == "stop":
                break


def runtime(url: str, lease: float) -> None:
    delivered = threading.Event()

    def observe(event: str, data: dict[str, object]) -> None:
        if event == "turn_committed":
            delivered.set()

    rt = Runtime(db=url, brain=lambda turn: turn.reply("reply from B"), lease_seconds=lease,
                 tick_interval=0.05)
    # Before start: on a loaded machine A's lease has run out by the time B starts, and B
    # claims and commits the row inside start(), before a subscription made after it.
    rt.subscribe(observe)
    with rt:
        print("ready", flush=True)
        if not delivered.wait(60):
            raise SystemExit("B never delivered the message")
    print("delivered", flush=True)


def journal(url: str, lease: float) -> None:
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    pause = threading.Event()
    with stores(url) as (j, _store):
        while True:  # the row is claimable once A's lease has run out
            got = j.claim("worker-B", time.time(), lease=lease).rows
            if got:
                break
            if time.monotonic() > deadline:
                raise SystemExit("B never got the row")
            pause.wait(0.02)
        assert [r.message_id for r in got] == [MESSAGE]
        j.complete_turn("worker-B", SESSION, [MESSAGE],
                        [TurnEntry("assistant", "reply from B", message_id=MESSAGE)],
                        time.time())
    print("delivered", flush=True)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s %(message)s")
    role, url, lease = sys.argv[1:]
    {"paused": paused, "runtime": runtime, "journal": journal}[role](url, float(lease))


if __name__ == "__main__":
    main()
