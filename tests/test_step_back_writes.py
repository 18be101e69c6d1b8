"""A clock set back moves the schedules it must, once; a look with nothing left to move
writes nothing (C1, C2, FO6, FO7).

A schedule written by a clock that read ahead stays "written late" until this clock
catches up with it (days, maybe): its creation time does not change, and a job whose due
time needs no move keeps its last write. Every look at the tables (each tick, each poll)
asks which schedules to move; one that then queued a writer transaction to move nothing
held the writer (and, on SQLite, the database's write lock) for nothing, every time.
"""

from __future__ import annotations

from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime
from kinbox.actors.cron_rules import CLOCK_STEP_TOLERANCE, after_clock_step_back
from kinbox.actors.focal_schedule import after_step_back
from kinbox.actors.triggers import next_fire
from kinbox.persistence import CronJobRecord, CronStore, JobRecord, JobStore, firing

from .conftest import Stores

pytestmark = pytest.mark.timeout(60)

NOW = 1_700_000_040.0
"""2023-11-14 22:14:00 UTC."""
AHEAD = NOW + 3 * 86400
"""Where a clock three days ahead read."""
YEARLY = "0 0 1 1 *"


def operations(stores: Stores) -> int:
    return stores.writer.statistics().operations


def test_a_focal_schedule_moved_back_once_is_not_written_again(stores: Stores) -> None:
    jobs = JobStore(stores.tables, stores.writer)
    heartbeat = JobRecord("focal-heartbeat", "focal-suzent", "heartbeat", "", None, 1800.0,
                          None, AHEAD + 1800, None, True, AHEAD)
    # A one-shot wake-up keeps the time it was given: written late, it never moves.
    once = JobRecord("wake-once", "focal-suzent", "reminder", "n", None, None, AHEAD + 60,
                     AHEAD + 60, None, True, AHEAD)
    jobs.create(heartbeat)
    jobs.create(once)

    def move(now: float) -> list[JobRecord]:
        return jobs.move_due(now + CLOCK_STEP_TOLERANCE, lambda job: after_step_back(job, now))

    assert [j.id for j in move(NOW)] == ["focal-heartbeat"]
    assert jobs.get("focal-heartbeat").next_run_at == NOW + 1800  # type: ignore[union-attr]
    before = operations(stores)
    for later in (NOW, NOW + 1, NOW + 60):
        assert move(later) == []
    assert operations(stores) == before  # no writer transaction at all


def test_a_cron_job_that_needs_no_move_is_not_written_at_every_look(stores: Stores) -> None:
    crons = CronStore(stores.tables, stores.writer)
    crons.create(CronJobRecord("yearly", "y", YEARLY, "UTC", "p", True, "none", 0,
                               next_fire(YEARLY, AHEAD), None, None, None, AHEAD, AHEAD))

    def move(now: float) -> list[CronJobRecord]:
        def moved_to(job: CronJobRecord) -> float | None:
            return after_clock_step_back(job.updated_at, job.next_run_at, now,
                                         next_fire(job.cron, now, job.timezone))
        return crons.move_due(now, now + CLOCK_STEP_TOLERANCE, moved_to)

    before = operations(stores)
    for later in (NOW, NOW + 1, NOW + 60):
        assert move(later) == []  # its next 1 January is the same from either clock
    assert operations(stores) == before


def test_a_runtime_s_ticks_after_a_set_back_move_once_then_write_nothing(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the runtime (Focal's heartbeat and a user cron job, each tick on the
    injected clock): the first tick after the set-back moves the heartbeat, and no tick
    after it queues a move."""
    ahead = ManualClock(AHEAD)
    with Runtime(db=db_url, brain=lambda turn: "ok", clock=ahead) as rt:
        rt.get_or_create_focal_chat()
        rt.cron.add("yearly", YEARLY, "Sum up the year.")
    moves: list[int] = []
    real_move = firing.move_due

    def counted(*args: Any, **kwargs: Any) -> list[Any]:
        moved = real_move(*args, **kwargs)
        moves.append(len(moved))
        return moved
    monkeypatch.setattr(firing, "move_due", counted)
    clock = ManualClock(NOW)
    with Runtime(db=db_url, brain=lambda turn: "ok", clock=clock) as rt:
        clock.advance(1)
        rt.run_until_idle()
        assert moves == [1]  # the heartbeat, once
        for _ in range(5):
            clock.advance(1)
            rt.run_until_idle()
        assert moves == [1]
