"""``kinbox --cpus``: the flag's syntax and checks, and a process really pinned, threads too."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kinbox.actors import cpu_pinning
from kinbox.actors.cpu_pinning import parse_cpus
from kinbox.actors.errors import ConfigError

from .test_cli import kinbox

ALLOWED = {0, 1, 2, 3}


def one_of_several_cpus() -> int:
    """A CPU this process may use, one of at least two (else pinned equals unpinned and a
    test of pinning could not fail): skip where there is no such CPU."""
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("pinning is Linux's (sched_setaffinity)")
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to tell pinned from unpinned")
    return max(cpus)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("spec", "cpus"), [
    ("1", {1}), ("0,2", {0, 2}), ("1-3", {1, 2, 3}), (" 3 , 0-1 ", {0, 1, 3}), ("2-2", {2})])
def test_a_list_names_single_cpus_and_ranges(spec: str, cpus: set[int]) -> None:
    assert parse_cpus(spec, ALLOWED) == cpus


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("spec", "says"), [
    ("", "is not a CPU number"), ("x", "is not a CPU number"), ("1,,2", "is not a CPU number"),
    ("2-1", "low <= high"), ("-1", "is not a CPU number"), ("+1", "is not a CPU number"),
    ("1_0", "is not a CPU number"), ("\u0661", "is not a CPU number"),
    ("4", "CPU 4 is not one"), ("0-999999999", "CPU 4-999999999 is not one"),
    ("1-5", "CPU 4-5 is not one"), ("4,6", "CPU 4, 6 is not one")])
def test_a_bad_list_is_refused_by_name_without_pinning_anything(spec: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_cpus(spec, ALLOWED)
    assert caught.value.field == "cpus"
    assert says in str(caught.value)


@pytest.mark.timeout(10)
def test_a_cpu_missing_inside_a_range_is_named() -> None:
    with pytest.raises(ConfigError, match=r"CPU 1 is not one this process may use \(0, 2, 3\)"):
        parse_cpus("0-3", {0, 2, 3})


@pytest.mark.timeout(10)
def test_a_platform_that_cannot_pin_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    with pytest.raises(ConfigError, match="cannot pin a process") as caught:
        cpu_pinning.allowed_cpus()
    assert caught.value.field == "cpus"


@pytest.mark.timeout(10)
def test_a_cpu_the_system_refuses_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def refuse(tid: int, cpus: object) -> None:
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    with pytest.raises(ConfigError, match="the system refused CPUs 1: Invalid argument"):
        cpu_pinning.pin_process(frozenset({1}))


@pytest.mark.timeout(60)
def test_pinning_moves_every_running_thread_and_the_ones_started_later() -> None:
    mine = one_of_several_cpus()
    code = textwrap.dedent(f"""
        import os, threading
        from kinbox.actors.cpu_pinning import pin_process
        gate = threading.Event()
        early = threading.Thread(target=gate.wait)
        early.start()
        pin_process(frozenset({{{mine}}}))
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
    assert "".join(affinities) == f"[({mine},)]"  # one affinity for all: the chosen CPU
    assert threads >= 3  # the main thread, the one running before, the one started after


@pytest.mark.timeout(120)
def test_the_command_line_runs_pinned_and_refuses_a_cpu_it_may_not_use(tmp_path: Path) -> None:
    mine = one_of_several_cpus()
    out = tmp_path / "affinity.txt"
    script = tmp_path / "where.py"
    script.write_text("import os\n\n\ndef run(sc):\n    sc.start()\n"
                      f"    open({str(out)!r}, 'w').write(repr(sorted(os.sched_getaffinity(0))))\n"
                      "    sc.expect(True, 'it ran')\n")
    result = kinbox("--cpus", str(mine), "scenario", "run", str(script))
    assert result.returncode == 0, result.stderr
    assert out.read_text() == f"[{mine}]"
    refused = kinbox("--cpus", "4096", "scenario", "run", str(script))
    assert refused.returncode == 2
    assert "--cpus '4096': CPU 4096 is not one this process may use" in refused.stderr
