"""A ``kinbox`` command starts without the parts only some commands use.

Every command imported the HTTP stack (Starlette, through the Host check and the cron
API's page limit) and the scheduler (APScheduler, through the cron listing's clock):
with the key file's cryptography for ``db upgrade``, 80-90 ms of every command's 0.3-0.4
s start, and a third of the test suite's CPU is its 440 command processes. They are
imported where they are used now; this keeps them there. (The peers commands still
import cryptography at the start: their module uses it throughout.)
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .test_cli import ROOT

LATER = ("starlette", "apscheduler", "uvicorn", "websockets")
"""What no command needs just to start: the commands that use them import them."""


@pytest.mark.timeout(60)
def test_the_command_line_starts_without_the_http_stack_or_the_scheduler() -> None:
    probe = ("import json, sys, kinbox.actors.cli; print(json.dumps(sorted(m for m in "
             f"{LATER!r} if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [], "imported at the command line's start"


@pytest.mark.timeout(60)
def test_a_command_that_needs_them_still_gets_them(tmp_path: object) -> None:
    """The lazy imports are imports, not omissions: the cron listing (the scheduler's
    clock) and db upgrade (the key file's folder helper) still run."""
    url = f"sqlite:///{tmp_path}/k.db"
    for args in (("db", "upgrade", "--db", url), ("cron", "list", "--db", url)):
        done = subprocess.run([sys.executable, "-m", "kinbox.actors", *args],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
