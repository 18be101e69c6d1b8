"""A cron run its runtime's graceful stop cut short is handed back, not counted as a death.

A runtime stopping (a deploy) ends a cron turn that did nothing yet, as it ends an inbox
turn: unrun, not failed. The inbox hands such a turn's rows back; the cron run was left
``running``, leased to the stopped runtime, and the next start took it over as a dead
runtime's: each deploy during a run counted as a death of its runtime (``takeovers``),
the fifth ended the run as ``Taken over 5 times: its runtime died each time`` (a failure
of its job, retried, then deactivated), and on PostgreSQL a live runtime beside it waited
out the whole lease before running it. It is handed back now: due at once, its next
takeover counts no death.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from kinbox.actors import ManualClock, Runtime, Turn

MakeRuntime = Callable[..., Runtime]


class UntilStopped:
    """A brain whose first turn waits for the runtime's stop and ends on it, unanswered."""

    def __init__(self) -> None:
        self.holding = threading.Event()
        self.turns = 0

    def __call__(self, turn: Turn) -> str | None:
        self.turns += 1
        if self.turns == 1:
            self.holding.set()
            turn.wait_stop_requested(30)
            return None
        return "ran after the deploy"


@pytest.mark.timeout(90)
def test_a_run_cut_short_by_a_graceful_stop_runs_again_with_no_death_counted(
        any_db_url: str, clock: ManualClock) -> None:
    brain = UntilStopped()
    rt = Runtime(db=any_db_url, brain=brain, clock=clock).start()
    try:
        job_id = str(rt.cron.add("digest", "0 0 1 1 *", "Summarize")["job_id"])
        rt.cron.trigger(job_id)
        assert brain.holding.wait(30)
    finally:
        rt.stop()
    with Runtime(db=any_db_url, clock=clock) as reader:  # send-only: runs nothing
        [run] = reader.cron.store.runs(job_id)
        assert (run.status, run.owner, run.takeovers) == ("running", None, 0)
    with Runtime(db=any_db_url, brain=brain, clock=clock) as rt2:
        rt2.run_until_idle()
        assert rt2.cron.wait_idle(30)
        [run] = rt2.cron.store.runs(job_id)
        assert (run.status, run.result, run.takeovers) == ("success", "ran after the deploy", 0)
