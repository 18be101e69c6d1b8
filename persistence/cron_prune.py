"""Pruning cron runs: deleting finished runs older than a cutoff, each job's newest kept.

The rule is :mod:`.retention`'s (a run ``success`` or ``error`` that finished before the
cutoff, and not among its job's :data:`~.retention.KEPT_CRON_RUNS` newest); this module
applies it one job at a time, in bounded batches (oldest runs first), each read off the
``(job_id, started_at, id)`` index and deleted in one short writer transaction. A run's
facts never change once it finished, and a job's newest runs only ever get newer, so a
run judged prunable stays so; the delete repeats the conditions all the same. On
PostgreSQL a batch first locks its runs ``FOR UPDATE SKIP LOCKED``, in one order: a run
another transaction holds (a job's removal deleting it) stays this time, and a prune never
waits for a lock. A part of :class:`~.inbox_prune.InboxPrune`, which runs it after the
inbox rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import retention
from .cron_store import RUN_STATES
from .database import is_postgres
from .hot_path import chunks
from .models import Tables
from .writer import GroupCommitWriter

FINISHED = RUN_STATES[1:]
"""The states of a run that ended (a ``running`` one is leased, or waits for a takeover)."""


@dataclass(frozen=True, slots=True)
class CronPruneBatch:
    """One batch's outcome, and where the next one starts."""

    runs: int
    """Runs this batch deleted (or, dry, would delete)."""
    from_job: str | None
    """The job the next batch starts at (this one again when it may have more); None when
    every job was looked at."""


def prune_batch(t: Tables, writer: GroupCommitWriter, cutoff: float, *,
                from_job: str | None = None, batch: int = retention.DEFAULT_BATCH,
                dry_run: bool = False) -> CronPruneBatch:
    """One batch: up to ``batch`` prunable runs of the first job at or after ``from_job``
    (in id order; all jobs when None), deleted in one transaction; a dry run counts all of
    that job's."""
    batch = max(1, min(batch, retention.MAX_BATCH))
    j = t.cron_job
    query = j.select(j.id).order_by(j.id).limit(2)
    if from_job is not None:
        query = query.where(j.id >= from_job)
    jobs = [job_id for (job_id,) in query.tuples()]
    if not jobs:
        return CronPruneBatch(0, None)
    job_id, following = jobs[0], (jobs[1] if len(jobs) > 1 else None)
    query = _prunable(t, job_id, cutoff)
    if query is None:
        return CronPruneBatch(0, following)
    if dry_run:
        return CronPruneBatch(query.count(), following)
    r = t.cron_run
    ids = [run_id for (run_id,) in query.order_by(r.started_at, r.id).limit(batch).tuples()]
    if not ids:
        return CronPruneBatch(0, following)
    deleted = writer.call(lambda: _delete(t, job_id, ids, cutoff))
    # A full batch that deleted something may have left more of this job's runs.
    return CronPruneBatch(deleted, job_id if len(ids) == batch and deleted else following)


def _prunable(t: Tables, job_id: str, cutoff: float) -> Any:
    """The query of ``job_id``'s runs the rule lets go; None when it has no more runs than
    it keeps."""
    r = t.cron_run
    kept = list(r.select(r.started_at, r.id).where(r.job_id == job_id).order_by(
        r.started_at.desc(), r.id.desc()).offset(retention.KEPT_CRON_RUNS - 1).limit(
        1).tuples())
    if not kept:
        return None
    started, run_id = kept[0]  # the oldest of the newest kept: the prunable are below it
    older = (r.started_at < started) | ((r.started_at == started) & (r.id < run_id))
    # Started before the cutoff too (as a run that finished before it did): the walk of
    # the job's index stops at the cutoff, not at its newest kept runs, across a history
    # of recent runs.
    return r.select(r.id).where(r.job_id == job_id, older, r.started_at < cutoff,
                                r.status.in_(FINISHED), r.finished_at < cutoff)


def _delete(t: Tables, job_id: str, ids: Sequence[str], cutoff: float) -> int:
    """Inside the writer's transaction: delete the runs of ``ids`` still prunable."""
    r = t.cron_run
    if is_postgres(t.db):  # those no other transaction holds, locked in one order
        ids = [run_id for part in chunks(sorted(ids)) for (run_id,) in r.select(r.id).where(
            r.id.in_(part)).order_by(r.id).for_update(skip_locked=True).tuples()]
    query = _prunable(t, job_id, cutoff)
    if query is None or not ids:
        return 0
    going = [run_id for part in chunks(list(ids))
             for (run_id,) in query.where(r.id.in_(part)).tuples()]
    return sum(r.delete().where(r.id.in_(part)).execute() for part in chunks(going))
