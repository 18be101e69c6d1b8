"""A cron run's lease renewal the database refused is tried again at the next tick.

The same rule as the inbox rows' (:mod:`kinbox.actors.lease_renewal`): a cron run's lease is
renewed once a third of a lease, and a failed renewal (a database blip) was noted as done
before it ran, so the next try came a third of a lease later. A blip over two tries (10 s to
20 s of a 30 s lease) let the run's lease run out although the database was back well
before: another runtime then took the run over and ran the job's turn a second time while
the first still ran.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.persistence import DatabaseFailed

from .helpers import counting, wait_for

pytestmark = pytest.mark.timeout(120)


def test_a_cron_renewal_a_database_blip_refused_is_tried_again_before_the_lease_runs_out(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    running, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def brain_of(name: str) -> Any:
        def brain(turn: Turn) -> str:
            runs.append(name)
            running.set()
            assert release.wait(60)
            return "done"
        return brain

    a = Runtime(db=pg_url, brain=brain_of("a"), clock=clock, lease_seconds=30)
    b = Runtime(db=pg_url, brain=brain_of("b"), clock=clock, lease_seconds=30)
    a.start()
    try:
        job = a.cron.add("digest", "0 9 * * *", "Summarize")
        a.cron.trigger(job["job_id"])
        assert running.wait(30)
        b.start()  # another worker on the database, started after a took the run
        outage, renewals, ticks = threading.Event(), [], []
        cron = a.cron
        monkeypatch.setattr(cron.store, "renew", counting(cron.store.renew, renewals, outage))
        monkeypatch.setattr(cron, "renew_leases",
                            counting(cron.renew_leases, ticks))

        def advance(seconds: float) -> None:
            try:
                clock.advance(seconds)  # its listeners fire cron at once: they renew too
            except DatabaseFailed:
                pass  # in the outage that renewal fails as well

        def renewed_by_the_tick(what: str) -> None:
            seen = len(ticks)
            wait_for(lambda: len(ticks) >= seen + 3, timeout=30, what=what)

        outage.set()  # the database goes away for a while
        advance(11)
        renewed_by_the_tick("the tick's renewal during the outage")
        advance(10)
        renewed_by_the_tick("another renewal during the outage")
        outage.clear()  # back, 9 s before the lease runs out: the next tick renews
        renewed_by_the_tick("ticks with the database back")
        outage.set()  # and gone again for a moment as the first lease's end passes
        advance(10)
        outage.clear()
        assert b.cron.tick() == [], "another runtime took over a live run"
        assert runs == ["a"]
        release.set()
        wait_for(lambda: a.cron.runs(job["job_id"])[0]["status"] == "success", 30,
                 what="the run's own commit")
        assert runs == ["a"]
    finally:
        release.set()
        b.stop()
        a.stop()
