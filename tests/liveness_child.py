"""A runtime process whose turn hangs, so the liveness test can SIGKILL it mid-turn.

Usage: python liveness_child.py DB_URL
Prints "turn started" once the brain holds the row, then waits for ever.
"""

from __future__ import annotations

import sys
import threading

from kinbox.actors import Runtime, Turn


def main() -> None:
    url = sys.argv[1]
    never = threading.Event()

    def brain(turn: Turn) -> None:
        print("turn started", flush=True)
        never.wait()

    with Runtime(db=url, brain=brain):
        never.wait()


if __name__ == "__main__":
    main()
