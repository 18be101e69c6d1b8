"""pykka's own test suite, run with our pooled actor as a second runtime beside ThreadingActor.

``.ci/run`` fetches the source distribution of the installed pykka into
``.ci/vendor/`` (git-ignored); this test runs its ``tests/`` in a pytest
subprocess with the ``kinbox_pooled_runtime`` plugin, which adds the pooled
runtime to pykka's ``runtime`` fixture and changes no test body. Every test
must pass on both runtimes, on a one-thread pool (where any wait of a pool
thread on itself deadlocks) and on a small shared one.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_DIR = Path(__file__).resolve().parent / "pykka_suite"
PYKKA_VERSION = importlib.metadata.version("pykka")
SDIST = ROOT / ".ci" / "vendor" / f"pykka-{PYKKA_VERSION}"


def sdist_tests() -> Path:
    """pykka's unpacked test suite; skip (fail in CI) where ``.ci/run`` has not fetched it."""
    if (SDIST / "tests" / "conftest.py").is_file():
        return SDIST
    reason = (f"pykka {PYKKA_VERSION}'s test suite is not in {SDIST}: .ci/run fetches it "
              f"(pip download --no-deps --no-binary :all: pykka=={PYKKA_VERSION})")
    if os.environ.get("CI"):
        pytest.fail(f"CI must run pykka's own suite on the pooled runtime: {reason}")
    pytest.skip(reason)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("threads", [1, 4])
def test_pykka_suite_passes_on_the_pooled_runtime(threads: int, tmp_path: Path) -> None:
    sdist = sdist_tests()
    report = tmp_path / "pykka.xml"
    env = {**os.environ, "PYTHONPATH": str(PLUGIN_DIR), "KINBOX_PYKKA_POOL_THREADS": str(threads)}
    # pykka's own pyproject is the config (ours, further up, must not apply).
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "kinbox_pooled_runtime",
         "-p", "no:cacheprovider", "-c", str(sdist / "pyproject.toml"), "--rootdir", str(sdist),
         "-o", "timeout=30", f"--junitxml={report}", f"--basetemp={tmp_path / 'tmp'}",
         "tests"],
        cwd=sdist, env=env, capture_output=True, text=True, timeout=170)
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    assert report.is_file(), tail
    cases = ET.parse(report).getroot().iter("testcase")
    outcome: dict[str, str] = {}
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        bad = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcome[name] = bad[0] if bad else "passed"
    pooled = {n: o for n, o in outcome.items() if n.endswith("[pooled]")}
    threading_ = {n: o for n, o in outcome.items() if n.endswith("[threading]")}
    assert len(pooled) > 100 and len(pooled) == len(threading_), tail
    not_passed = {n: o for n, o in outcome.items() if o != "passed"}
    assert not_passed == {}, tail
    assert done.returncode == 0, tail
