"""A stop from a signal handler that interrupted the main thread inside the runtime.

A signal handler runs on the main thread, between two bytecodes of whatever it was doing:
a program's status loop calling ``rt.statistics()`` may be inside the running-turn
board's lock when its SIGTERM handler calls ``rt.stop()``. The stop ran on that thread and
took the same lock first thing: the process hung for good (the lock is not reentrant, and
its holder is the frame the handler interrupted). The stop now runs on a thread of its
own; the main thread waits for it a bounded time, so a handler stuck so returns, the
interrupted frame lets go of the lock, and the stop ends.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kinbox.actors import Runtime
from kinbox.actors import runtime_life as runtime_module

from .helpers import quiet_brain, wait_for

pytestmark = pytest.mark.timeout(90)


def test_a_stop_on_a_main_thread_holding_the_turn_board_lock_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert threading.current_thread() is threading.main_thread()
    monkeypatch.setattr(runtime_module, "STOP_SETTLE", 1.0)
    url = f"sqlite:///{tmp_path / 'k.db'}"
    rt = Runtime(db=url, brain=quiet_brain, data_dir=tmp_path / "data").start()
    with rt.context.turns._lock:  # where rt.statistics() was when the signal came
        rt.stop(timeout=2.0)  # what the handler calls
    wait_for(lambda: rt._stop_done.is_set(), timeout=30, what="the stop to end")
    with Runtime(db=url, brain=quiet_brain, data_dir=tmp_path / "data") as again:
        assert again.state == "running"
