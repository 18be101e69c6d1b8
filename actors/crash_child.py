"""A runtime process for the crash harness: delivers what the journal holds until idle.

Usage: python -m kinbox.actors.crash_child DB_URL LOG_PATH LIFE [async]

(The crash tests run the same child on deliberately broken journals through
``tests/broken_child.py``: production code has no switch for them.)

Every turn start is appended to LOG_PATH as "LIFE MESSAGE_ID" before the
brain does anything, so the parent can prove which lives ran which message.
Prints "ready" once started and "done" once idle, then exits.
"""

from __future__ import annotations

import asyncio
import sys
import threading

from .runtime import Runtime
from .turn import Turn


def main() -> None:
    url, log_path, life, *flavour = sys.argv[1:]
    run_async = flavour == ["async"]
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    lock = threading.Lock()

    def brain(turn: Turn) -> None:
        message = turn.messages[0]
        with lock:
            log.write(f"{life} {message.message_id}\n")
        # A little work so kills land inside turns as well as between them.
        digest = sum(ord(c) for c in message.content * 50)
        turn.reply(f"processed {message.message_id} ({digest})")

    async def async_brain(turn: Turn) -> None:
        await asyncio.sleep(0)  # yield to the loop, as a model call would
        brain(turn)

    with Runtime(db=url, brain=async_brain if run_async else brain,
                 tick_interval=0.05) as rt:
        print("ready", flush=True)
        rt.run_until_idle(timeout=120)
    print("done", flush=True)


if __name__ == "__main__":
    main()
