"""Pruning the journal: deleting finished inbox rows with their markers and history, then
the finished cron runs (:mod:`.cron_prune`, which has its own rules and locking).

The rules (what may go) are :mod:`.retention`'s; this module applies them in bounded
batches, newest candidates first. Each batch reads its candidates on the caller's
connection (a read that waits for no writer), then decides and deletes in one writer
operation: the facts (state, lease, task, chain) are read again inside that transaction,
so a row that changed since the read is judged as it is now, and a batch is one short
transaction, so senders queue behind at most one batch. A part of
:class:`~.journal.Journal`.

The judgement must still hold when the rows go. SQLite's writer holds the file's lock
for the whole transaction, so no other process writes between the two. PostgreSQL runs
it at READ COMMITTED beside other processes' writers, and the facts a row is judged by
could change in between: its task reopened, its chain's next member committed (a
terminal row's own state and lease never change again). So, before judging, a batch
locks its candidates (``FOR UPDATE``) and the settled tasks they name (``FOR SHARE``),
and a chain's next member is written only by a walk that holds the members before it
(:meth:`~.hot_path.HotPath.first_free`, ``FOR KEY SHARE``): a write that comes after
waits for the batch's commit, one that came before is read. Every lock is taken
``SKIP LOCKED``: a row or task another transaction holds is being written, and stays
this time (the next pass judges it). A prune therefore never waits for a lock, so it
can be in no deadlock with the delivery path whatever that locks, and in what order.

On SQLite the freed pages stay in the file and are reused by later writes; only
``VACUUM`` gives them back to the file system (never run here: it rewrites the whole
file and holds the database while it does).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

from . import cron_prune, retention
from .database import is_postgres
from .hot_path import chunks
from .models import Tables
from .numbered_ids import chain_successors, is_numbered
from .seq_mark import hold_mark
from .tasks import OPEN_TASK_STATES
from .writer import GroupCommitWriter


@dataclass(frozen=True, slots=True)
class PruneCounts:
    """What a prune deleted (or, in a dry run, would delete)."""

    rows: int = 0
    """Inbox rows."""
    markers: int = 0
    """Their delivery markers."""
    events: int = 0
    """Their history rows (``agent_inbox_events``)."""
    cron_runs: int = 0
    """Finished cron runs (:mod:`.cron_prune`)."""

    def __add__(self, other: PruneCounts) -> PruneCounts:
        return PruneCounts(self.rows + other.rows, self.markers + other.markers,
                           self.events + other.events, self.cron_runs + other.cron_runs)

    def as_dict(self) -> dict[str, int]:
        """The counts as a plain dict."""
        return {"rows": self.rows, "markers": self.markers, "events": self.events,
                "cron_runs": self.cron_runs}


@dataclass(frozen=True, slots=True)
class PruneBatch:
    """One batch's outcome, and where the next one starts."""

    counts: PruneCounts
    """What this batch deleted (or would)."""
    before_seq: int | None
    """The next batch's bound (candidates below this ``seq``); None when none are left."""


SCAN_FACTOR = 20
"""How many rows of the journal's order a batch looks through, per row it may delete."""


class InboxPrune:
    """Delete prunable rows (:mod:`.retention`) in bounded batches."""

    t: Tables
    writer: GroupCommitWriter

    def prune(self, cutoff: float, *, batch: int = retention.DEFAULT_BATCH,
              dry_run: bool = False) -> PruneCounts:
        """Delete every prunable row last changed before ``cutoff`` (epoch seconds), with
        its markers and history, then the prunable cron runs (:mod:`.cron_prune`),
        ``batch`` rows per transaction; what went. With ``dry_run``, nothing is deleted
        and the counts say what would go."""
        return sum(self.prune_steps(cutoff, batch=batch, dry_run=dry_run), PruneCounts())

    def prune_steps(self, cutoff: float, *, batch: int = retention.DEFAULT_BATCH,
                    dry_run: bool = False) -> Iterator[PruneCounts]:
        """:meth:`prune` one batch at a time, the inbox rows' then the cron runs': each
        batch's counts once it committed (or, dry, was counted), so a caller that stops
        between two (an operator's Ctrl-C) knows what went."""
        before = None
        # A dry run deletes nothing, so a chain member judged in a later batch would see
        # its successor still there: it is told which numbered ids would have gone.
        would_go: set[str] = set()
        while True:
            step = self._batch(cutoff, before, batch, dry_run, would_go)
            yield step.counts
            if step.before_seq is None:
                break
            before = step.before_seq
        from_job = None
        while True:
            runs = self.prune_cron_batch(cutoff, from_job=from_job, batch=batch,
                                         dry_run=dry_run)
            yield PruneCounts(cron_runs=runs.runs)
            if runs.from_job is None:
                return
            from_job = runs.from_job

    def prune_cron_batch(self, cutoff: float, *, from_job: str | None = None,
                         batch: int = retention.DEFAULT_BATCH, dry_run: bool = False
                         ) -> cron_prune.CronPruneBatch:
        """One batch of the cron runs :meth:`prune` deletes: of the first job at or after
        ``from_job`` (all jobs when None), see :func:`.cron_prune.prune_batch`."""
        return cron_prune.prune_batch(self.t, self.writer, cutoff, from_job=from_job,
                                      batch=batch, dry_run=dry_run)

    def prune_batch(self, cutoff: float, *, before_seq: int | None = None,
                    batch: int = retention.DEFAULT_BATCH, dry_run: bool = False
                    ) -> PruneBatch:
        """One batch of :meth:`prune`: the newest ``batch`` candidates below ``before_seq``
        (all rows when None), judged and deleted in one transaction.

        The candidates are looked for in a window of the journal's order (the
        :data:`SCAN_FACTOR` x ``batch`` rows below ``before_seq``, read off the ``seq``
        index), so that every batch reads a bounded range whatever the journal's size
        and whatever a planner thinks of the state and age conditions (without it,
        PostgreSQL read the whole table for each batch). A window with no candidate (the
        newest rows, all recent) is a batch that deletes nothing and moves on."""
        return self._batch(cutoff, before_seq, batch, dry_run, set())

    def _batch(self, cutoff: float, before_seq: int | None, batch: int, dry_run: bool,
               would_go: set[str]) -> PruneBatch:
        batch = max(1, min(batch, retention.MAX_BATCH))
        m = self.t.inbox
        window = m.select(m.seq).order_by(m.seq.desc()).limit(batch * SCAN_FACTOR)
        if before_seq is not None:
            window = window.where(m.seq < before_seq)
        seqs = [seq for (seq,) in window.tuples()]
        if not seqs:
            return PruneBatch(PruneCounts(), None)
        q = m.select(m.message_id, m.seq).where(
            (m.seq >= seqs[-1]) & m.status.in_(retention.PRUNABLE_STATES)
            & (m.updated_at < cutoff))
        if before_seq is not None:
            q = q.where(m.seq < before_seq)
        found = list(q.order_by(m.seq.desc()).limit(batch).tuples())
        if len(found) == batch:
            after = found[-1][1]  # the window may hold more: the next batch goes on below
        else:
            after = seqs[-1] if len(seqs) == batch * SCAN_FACTOR else None
        if not found:
            return PruneBatch(PruneCounts(), after)
        ids = [mid for mid, _ in found]
        if not dry_run:
            return PruneBatch(self.writer.call(lambda: self._judge_and_delete(ids, cutoff)),
                              after)
        going = self._going(ids, cutoff, would_go)
        would_go.update(mid for mid in going if is_numbered(mid))
        return PruneBatch(self._count(going), after)

    # -- inside a transaction (or, for a dry run, on the caller's connection) ---------------

    def _going(self, ids: Sequence[str], cutoff: float,
               gone: Collection[str] = (), *, hold: bool = False) -> list[str]:
        """The rows of ``ids`` the rules let go, read as they are now (the rows of
        ``gone`` counted as deleted already). With ``hold`` (PostgreSQL, deleting), the
        settled tasks they name are locked first (a task another transaction holds
        counts as open)."""
        m, task = self.t.inbox, self.t.task
        rows: list[tuple[str, str, float, str | None, str | None]] = []
        for part in chunks(list(ids)):
            rows.extend(m.select(m.message_id, m.status, m.updated_at, m.lease_owner,
                                 m.payload).where(m.message_id.in_(part)).tuples())
        tasks = {mid: _task_id(payload) for mid, _, _, _, payload in rows}
        named = sorted({t for t in tasks.values() if t is not None})
        if hold:
            settled = {tid for part in chunks(named) for (tid,) in task.select(task.id).where(
                task.id.in_(part) & task.status.not_in(OPEN_TASK_STATES)).order_by(
                task.id).for_update("FOR SHARE", skip_locked=True).tuples()}
            open_tasks = {tid for part in chunks(named) for (tid,) in task.select(
                task.id).where(task.id.in_(part)).tuples()} - settled
        else:
            open_tasks = {tid for part in chunks(named) for (tid,) in task.select(
                task.id).where(task.id.in_(part) & task.status.in_(OPEN_TASK_STATES)).tuples()}
        facts = [retention.RowFacts(mid, status, updated_at, owner is not None,
                                    tasks[mid] in open_tasks, tasks[mid] is not None)
                 for mid, status, updated_at, owner, _ in rows]
        ours = {f.message_id for f in facts}
        chained = [f.message_id for f in facts if f.chained]
        following = [s for s in chain_successors(chained)
                     if s not in ours and s not in gone]
        kept = {mid for part in chunks(following)
                for (mid,) in m.select(m.message_id).where(m.message_id.in_(part)).tuples()}
        return retention.prunable(facts, cutoff, kept)

    def _count(self, going: Sequence[str]) -> PruneCounts:
        """What deleting the rows ``going`` would delete."""
        mk, e = self.t.marker, self.t.event
        return PruneCounts(
            len(going),
            sum(mk.select().where(mk.message_id.in_(part)).count() for part in chunks(going)),
            sum(e.select().where(e.message_id.in_(part)).count() for part in chunks(going)))

    def _judge_and_delete(self, ids: Sequence[str], cutoff: float) -> PruneCounts:
        hold = is_postgres(self.t.db)
        if hold:  # the candidates no other transaction holds, locked in one order
            m = self.t.inbox
            ids = [mid for part in chunks(sorted(ids)) for (mid,) in m.select(
                m.message_id).where(m.message_id.in_(part)).order_by(m.message_id).for_update(
                skip_locked=True).tuples()]
        going = self._going(ids, cutoff, hold=hold)
        m, mk, e = self.t.inbox, self.t.marker, self.t.event
        total = PruneCounts()
        if going:
            hold_mark(self.t.db)  # SQLite: no later send is numbered as a row deleted here
        for part in chunks(going):
            total += PruneCounts(m.delete().where(m.message_id.in_(part)).execute(),
                                 mk.delete().where(mk.message_id.in_(part)).execute(),
                                 e.delete().where(e.message_id.in_(part)).execute())
        return total


def _task_id(payload: str | None) -> str | None:
    """The task a row's payload names (a child's task, its result, a Focal notice)."""
    if not payload or "task_id" not in payload:
        return None  # most rows: no JSON to decode
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    task = data.get("task_id") if isinstance(data, dict) else None
    return task if isinstance(task, str) and task else None
