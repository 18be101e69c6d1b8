"""A runtime process whose brain kills the process on the poison message.

Usage: python poison_child.py DB_URL
Delivers until idle (exit 0, prints "idle"), or dies with status 9 inside the poison turn.
"""

from __future__ import annotations

import os
import sys

from kinbox.actors import Runtime, Turn


def main() -> None:
    def brain(turn: Turn) -> None:
        if turn.messages[0].content == "poison":
            os._exit(9)  # the turn takes the whole process down, every time
        turn.reply("ok")

    with Runtime(db=sys.argv[1], brain=brain, max_active_sessions=1) as rt:
        rt.run_until_idle(timeout=60)
    print("idle", flush=True)


if __name__ == "__main__":
    main()
