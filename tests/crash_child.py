"""A runtime process for the crash tests: delivers what the journal holds until idle.

Usage: python crash_child.py DB_URL LOG_PATH LIFE [async] [FAULT]

FAULT names a deliberately broken journal of ``broken_journals.py``, put in
place of the runtime's own (the crash checker must catch it).

Every turn start is appended to LOG_PATH as "LIFE MESSAGE_ID" before the
brain does anything, so the parent can prove which lives ran which message.
Prints "ready" once started and "done" once idle, then exits.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import kinbox.actors.runtime as runtime_module
from kinbox.actors import Runtime, Turn

sys.path.insert(0, str(Path(__file__).parent))
from broken_journals import BROKEN


def main() -> None:
    url, log_path, life, *faults = sys.argv[1:]
    run_async = "async" in faults
    for fault in faults:
        if fault != "async":
            runtime_module.Journal = BROKEN[fault]  # type: ignore[misc]
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
