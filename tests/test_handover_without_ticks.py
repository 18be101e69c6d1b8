"""Every message of a busy closed loop reaches its turn without the dispatcher's tick.

On SQLite a send to a session whose older row is in flight leases nothing and
nudges no one: the commit of that older row chains into it. If the commit
judged it not yet due (stamped before the send, written after it), the row
waited for the next tick: 3% of a closed loop's messages did. With the tick
set past the test's timeout, such a row would never run here; and the clock
the runtime is given reads 50 ms behind on its session threads, so every
commit's time is older than the sends that race it (the race, every time).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kinbox.actors import Runtime, Turn

from .helpers import wait_for

NO_TICK = 600.0
PRODUCERS, SESSIONS, PER_PRODUCER = 16, 8, 40


class LateOnSessionThreads:
    """The wall clock, read 50 ms behind on the session threads (where turns commit)."""

    def now(self) -> float:
        late = threading.current_thread().name.startswith("kinbox-session")
        return time.time() - (0.05 if late else 0.0)


@pytest.mark.timeout(60)
def test_a_closed_loop_of_sends_to_busy_sessions_needs_no_tick(tmp_path: Path) -> None:
    handled: list[str] = []
    lock = threading.Lock()

    def brain(turn: Turn) -> None:
        with lock:
            handled.extend(m.message_id for m in turn.messages)

    rt = Runtime(db=f"sqlite:///{tmp_path / 'k.db'}", brain=brain, tick_interval=NO_TICK,
                 lease_seconds=4 * NO_TICK,
                 clock=LateOnSessionThreads()).start()
    try:
        project = rt.create_project("loop").id
        sids = [rt.create_session(project, f"S{i}").id for i in range(SESSIONS)]

        def produce(p: int) -> list[str]:
            return [rt.post(sids[(p + n) % SESSIONS], f"{p}/{n}").message_id
                    for n in range(PER_PRODUCER)]

        with ThreadPoolExecutor(PRODUCERS) as pool:
            sent = [mid for ids in pool.map(produce, range(PRODUCERS)) for mid in ids]
        wait_for(lambda: len(handled) >= len(sent), timeout=20,
                 what=f"every turn without a tick ({len(handled)} of {len(sent)} ran)")
        assert sorted(handled) == sorted(sent)
        # The brain records a turn before its commit: the last rows settle just after.
        wait_for(lambda: rt.inbox("pending") == [] and rt.inbox("processing") == [],
                 timeout=20, what="every row delivered")
    finally:
        rt.stop()
