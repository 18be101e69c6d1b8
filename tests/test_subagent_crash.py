"""A SIGKILL between a child's end and its parent's turn loses no wake-up (A1)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import Stores
from .helpers import wait_for

CHILD = Path(__file__).with_name("subagent_child.py")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_parent_gets_exactly_one_wakeup_turn_after_a_kill(tmp_path: Path) -> None:
    url, log = f"sqlite:///{tmp_path / 'sub.db'}", tmp_path / "turns.log"
    log.touch()
    first = subprocess.Popen([sys.executable, str(CHILD), url, str(log), "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: "parent-woken" in log.read_text(), timeout=30,
                 what="the parent's wake-up turn in life 1")
    finally:
        first.kill()
        first.wait(10)
    second = subprocess.run([sys.executable, str(CHILD), url, str(log), "2"],
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr[-3000:]

    lines = [line.split() for line in log.read_text().splitlines()]
    assert [(life, who) for life, who, _ in lines] == [
        ("1", "parent-start"), ("1", "child"), ("1", "parent-woken"), ("2", "parent-woken")]
    result_id = lines[-1][2]
    assert result_id.startswith("subagent-result-task-")
    s = Stores(url)
    try:
        markers = s.store.marker_counts()
        assert markers[result_id] == 1
        assert sum(1 for mid in markers if mid.startswith("subagent-task-")) == 1
        assert set(markers.values()) == {1}
        parent_lines = [e.text for e in s.store.transcript("parent") if e.role == "assistant"]
        assert parent_lines == ["thanks for: child result: 7 files cleaned"]
        assert s.journal.counts() == {"delivered": 3}
    finally:
        s.close()
