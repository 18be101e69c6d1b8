"""``run_until_idle`` returns when the runtime stops under it.

A program waiting in ``rt.run_until_idle(timeout)`` while another thread (a signal
handler's, a shutdown hook) stopped the runtime went on waiting: the stopped runtime's
board still showed the turn it had given back, so the wait ran to its timeout (an hour,
for a batch job) and then raised ``IdleTimeout`` as if the runtime were still busy. It now
raises ``RuntimeStateError`` (``state`` ``stopped``) once the runtime has stopped.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kinbox.actors import Runtime, RuntimeStateError, Turn

pytestmark = pytest.mark.timeout(90)


def test_run_until_idle_ends_when_another_thread_stops_the_runtime(tmp_path: Path) -> None:
    started = threading.Event()

    def brain(turn: Turn) -> None:
        started.set()
        turn.wait_stop_requested(60)  # ends on the stop, having said nothing: handed back

    rt = Runtime(db=f"sqlite:///{tmp_path / 'k.db'}", brain=brain,
                 data_dir=tmp_path / "data").start()
    waiting = threading.Event()
    real_is_idle = rt.is_idle

    def is_idle() -> bool:
        waiting.set()  # run_until_idle waits: now the stop comes
        return real_is_idle()

    rt.is_idle = is_idle  # type: ignore[method-assign]

    def stop_once_waiting() -> None:
        assert waiting.wait(30)
        rt.stop()
    stopper = threading.Thread(target=stop_once_waiting)
    try:
        rt.post(rt.create_session(rt.create_project("p").id, "A").id, "work")
        assert started.wait(30)
        stopper.start()
        began = time.monotonic()
        with pytest.raises(RuntimeStateError) as raised:
            rt.run_until_idle(timeout=60)
        assert raised.value.state == "stopped"
        assert time.monotonic() - began < 30
    finally:
        waiting.set()
        stopper.join(30)
        rt.stop()
