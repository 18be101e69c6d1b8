"""``kinbox cron`` against PostgreSQL from a machine whose clock is off the server's.

Every runtime on PostgreSQL tells the time by the database server's clock, and the
other operator commands (``inbox requeue``, ``prune``, ``peers``) stamp their changes
with it too. A ``cron trigger`` run from an operator's laptop whose clock read two
hours behind the server made the job due two hours ago: the runtime judged that
occurrence missed (past the grace time) and skipped it, and the command had said
"triggered"; two hours ahead, the job was left due two hours from now. The run asked
for never happened, or hours late (a clock minutes off: minutes late).
"""

from __future__ import annotations

import io
import json
import time

import pytest

from kinbox.actors import Runtime, Turn
from kinbox.actors.cli import main

from .conftest import Stores
from .helpers import wait_for


def cli(db: str, *args: str) -> dict:
    out = io.StringIO()
    assert main(["cron", *args, "--db", db, "--json"], out=out) == 0
    return json.loads(out.getvalue())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("skew", [-7200.0, 7200.0], ids=["behind", "ahead"])
def test_a_trigger_from_a_machine_whose_clock_is_off_runs_the_job_now(
        pg_url: str, skew: float, monkeypatch: pytest.MonkeyPatch) -> None:
    Stores(pg_url).close()
    job_id = cli(pg_url, "add", "yearly", "--cron", "0 0 1 1 *", "--prompt", "ping")["job_id"]
    regular = cli(pg_url, "list")["items"][0]["next_run_at"]
    real = time.time
    with monkeypatch.context() as m:  # only this command runs on the skewed machine
        m.setattr(time, "time", lambda: real() + skew)
        triggered = cli(pg_url, "trigger", job_id)["next_run_at"]
    # Stamped by the server's clock (this machine's, unskewed): a trigger runs however
    # late since it is marked as asked, so only the stamp tells the "behind" case apart.
    assert triggered != regular and abs(triggered - real()) < 600

    def brain(turn: Turn) -> str:
        return "pong"

    with Runtime(db=pg_url, brain=brain) as rt:  # on the server's clock
        # Run, or moved on to its regular time without a run (dropped); a trigger left
        # due at the skewed time would run hours from now: the wait fails first.
        wait_for(lambda: rt.cron.runs(job_id) != []
                 or rt.cron.job(job_id)["next_run_at"] == regular,
                 timeout=60, what="the triggered run (or the job moved on without it)")
        assert rt.cron.wait_idle(60)
        runs = rt.cron.runs(job_id)
    assert [(r["status"], r["result"]) for r in runs] == [("success", "pong")]
