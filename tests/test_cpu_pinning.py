"""``kinbox --cpus``: the flag's syntax and checks, and a process really pinned, threads too."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kinbox.actors.cpu_pinning import parse_cpus
from kinbox.actors.errors import ConfigError

from .test_cli import kinbox

ALLOWED = {0, 1, 2, 3}
MINE = max(os.sched_getaffinity(0))
"""A CPU this test process may use (CI machines differ)."""


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("spec", "cpus"), [
    ("1", {1}), ("0,2", {0, 2}), ("1-3", {1, 2, 3}), (" 3 , 0-1 ", {0, 1, 3}), ("2-2", {2})])
def test_a_list_names_single_cpus_and_ranges(spec: str, cpus: set[int]) -> None:
    assert parse_cpus(spec, ALLOWED) == cpus


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("spec", "says"), [
    ("", "is not a CPU number"), ("x", "is not a CPU number"), ("1,,2", "is not a CPU number"),
    ("2-1", "low <= high"), ("-1", "is not a CPU number"), ("4", "CPU 4 is not one"),
    ("0-999999999", "CPU 999999999 is not one"), ("1-5", "CPU 5 is not one"),
    ("4,6", "CPU 4, 6 is not one")])
def test_a_bad_list_is_refused_by_name_without_pinning_anything(spec: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_cpus(spec, ALLOWED)
    assert caught.value.field == "cpus"
    assert says in str(caught.value)


@pytest.mark.timeout(60)
def test_pinning_moves_every_running_thread_and_the_ones_started_later() -> None:
    code = textwrap.dedent(f"""
        import os, threading
        from kinbox.actors.cpu_pinning import pin_process
        gate = threading.Event()
        early = threading.Thread(target=gate.wait)
        early.start()
        pin_process(frozenset({{{MINE}}}))
        late = threading.Thread(target=gate.wait)
        late.start()
        tasks = [int(t) for t in os.listdir("/proc/self/task")]
        print(sorted({{tuple(sorted(os.sched_getaffinity(t))) for t in tasks}}), len(tasks))
        gate.set()
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    affinities, threads = result.stdout.split()[:-1], int(result.stdout.split()[-1])
    assert "".join(affinities) == f"[({MINE},)]"  # one affinity for all: the chosen CPU
    assert threads >= 3  # the main thread, the one running before, the one started after


@pytest.mark.timeout(120)
def test_the_command_line_runs_pinned_and_refuses_a_cpu_it_may_not_use(tmp_path: Path) -> None:
    out = tmp_path / "affinity.txt"
    script = tmp_path / "where.py"
    script.write_text("import os\n\n\ndef run(sc):\n    sc.start()\n"
                      f"    open({str(out)!r}, 'w').write(repr(sorted(os.sched_getaffinity(0))))\n"
                      "    sc.expect(True, 'it ran')\n")
    result = kinbox("--cpus", str(MINE), "scenario", "run", str(script))
    assert result.returncode == 0, result.stderr
    assert out.read_text() == f"[{MINE}]"
    refused = kinbox("--cpus", "4096", "scenario", "run", str(script))
    assert refused.returncode == 2
    assert "--cpus '4096': CPU 4096 is not one this process may use" in refused.stderr
