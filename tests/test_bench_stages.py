"""CPU per message by stage (``actors/bench_stages``): roles, the arithmetic, real clocks."""

from __future__ import annotations

import threading
import time

import pytest

from kinbox.actors.bench_stages import STAGES, CpuSample, per_message, role_of, sample


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("name", "role"), [
    ("kinbox-writer", "writer"), ("bare-writer", "writer"), ("kinbox-session-17", "turns"),
    ("bare-worker-3", "turns"), ("Dispatcher", "other"), ("MainThread", "other"),
    ("kinbox-sessions", "other")])
def test_a_thread_counts_in_the_stage_its_name_gives(name: str, role: str) -> None:
    assert role_of(name) == role


@pytest.mark.timeout(10)
def test_per_message_splits_each_threads_cpu_since_the_first_sample_by_its_role() -> None:
    before = CpuSample({1: ("kinbox-writer", 1.0), 2: ("kinbox-session-0", 0.5),
                        3: ("Dispatcher", 2.0), 9: ("kinbox-session-1", 4.0)},
                       process=10.0, system=3.0, switches=100)
    # 9 ended between the samples (its CPU is in the process total only); 4 started.
    after = CpuSample({1: ("kinbox-writer", 1.3), 2: ("kinbox-session-0", 0.6),
                       3: ("Dispatcher", 2.0), 4: ("kinbox-session-2", 0.1)},
                      process=11.0, system=3.2, switches=1100)
    out = per_message(before, after, producers=0.2, messages=1000)
    assert out == {"producers": 200.0, "writer": 300.0, "turns": 200.0, "other": 0.0,
                   "process": 1000.0, "system": 200.0, "switches": 1.0}
    assert list(out)[:len(STAGES)] == list(STAGES)


@pytest.mark.timeout(10)
def test_per_message_refuses_a_run_without_messages() -> None:
    with pytest.raises(ValueError):
        per_message(CpuSample(), CpuSample(), 0.0, 0)


@pytest.mark.timeout(30)
def test_sample_reads_each_live_threads_own_clock() -> None:
    spin = threading.Event()
    done = threading.Event()

    def busy() -> None:
        until = time.thread_time() + 0.05
        while time.thread_time() < until:
            pass
        spin.set()
        done.wait(10)

    worker = threading.Thread(target=busy, name="kinbox-writer")
    worker.start()
    try:
        assert spin.wait(10)
        got = sample()
        assert worker.native_id is not None
        name, seconds = got.threads[worker.native_id]
        assert name == "kinbox-writer" and seconds >= 0.05
        assert got.process >= seconds and got.switches >= 0
    finally:
        done.set()
        worker.join(10)
