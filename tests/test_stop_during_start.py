"""A ``stop()`` that comes while the runtime is still starting is not lost.

A SIGTERM whose handler calls ``rt.stop()`` (as the README allows) while ``start()`` was
still at work (a PostgreSQL start connects, upgrades and takes over: seconds) found the
runtime ``new`` and did nothing: the start went on, and the program ran a runtime it had
been told to stop. From another thread, a stop in the last steps of the start ran beside
them: the start then started the ticker the stop had already stopped, a thread left
ticking a stopped runtime. The start now ends by carrying out such a stop.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import Runtime
from kinbox.actors.services import Services

from .helpers import quiet_brain, wait_for

pytestmark = pytest.mark.timeout(60)


def test_a_stop_asked_on_the_starting_thread_stops_the_runtime_once_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    rt = Runtime(db=url, brain=quiet_brain, data_dir=tmp_path / "data")
    real_start = Services.start

    def signalled(self: Services, *args: Any, **kwargs: Any) -> None:
        rt.stop()  # what a SIGTERM handler does, on the thread that runs start()
        real_start(self, *args, **kwargs)

    monkeypatch.setattr(Services, "start", signalled)
    before = set(threading.enumerate())
    assert rt.start() is rt
    assert rt.state == "stopped"
    wait_for(lambda: not [t for t in threading.enumerate() if t not in before and t.is_alive()],
             timeout=20, what="the runtime's threads to end")
    monkeypatch.undo()
    with Runtime(db=url, brain=quiet_brain, data_dir=tmp_path / "data") as again:
        assert again.state == "running"


def test_a_stop_from_another_thread_during_the_start_leaves_no_ticker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    rt = Runtime(db=url, brain=quiet_brain, data_dir=tmp_path / "data")
    real_start = rt._ticker.start
    stopped = threading.Event()

    def late_ticker() -> None:
        # The start's last step: another thread's stop came (and, unguarded, ended) first.
        stopper = threading.Thread(target=lambda: (rt.stop(), stopped.set()))
        stopper.start()
        # Unguarded, the stop ran to its end here; deferred, it waits for the start's end.
        wait_for(lambda: stopped.is_set() or getattr(rt, "_stop_asked", None) is not None,
                 timeout=20,
                 what="the other thread's stop to be asked")
        real_start()

    monkeypatch.setattr(rt._ticker, "start", late_ticker)
    rt.start()
    assert stopped.wait(30)
    assert rt.state == "stopped"
    assert not rt._ticker.running, "the start left a ticker running on a stopped runtime"
    with Runtime(db=url, brain=quiet_brain, data_dir=tmp_path / "data") as again:
        assert again.state == "running"
