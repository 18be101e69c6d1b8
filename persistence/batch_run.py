"""How one writer batch runs inside its transaction: the units, their savepoints, the fallbacks.

The group-commit writer (:mod:`.writer`) owns the thread, the transaction, the
commit and the answers; this module owns what happens between begin and commit.
Each plain operation runs under a savepoint of its own, so one that raises
undoes only itself. Every :class:`~.bulk.Bulk` kind of the batch runs set-wise
under one shared savepoint (none when it comes first in a SQLite transaction:
:attr:`Control.restartable`); if that raises, it is undone and each kind runs
under its own: the others set-wise again, the one that raised one operation at
a time, so the outcome is exactly what one-by-one execution gives. A kind a
deadlock or a serialization failure aborted is not run again here (each item
would wait for the same locks): its items are answered with that error, for
the writer to run again in its next transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import peewee as pw

from .bulk import Bulk, all_of, plan
from .errors import DatabaseFailed
from .savepoints import Control, undo_step

if TYPE_CHECKING:
    from .writer import WriterStatistics

log = logging.getLogger("kinbox.writer")

Outcomes = dict[int, tuple[bool, Any]]
"""Batch index -> (True, result) or (False, the exception it raised)."""


CONFLICT_RETRIES = 3
"""How many times an operation (or a batch, or a claim) that a deadlock or a serialization
failure aborted runs again before its caller gets that error. Each retry runs in a new
transaction after the other side's went on, so one is nearly always enough; a bound keeps a
conflict that comes back every time from holding the writer."""


def conflict(error: BaseException) -> bool:
    """A deadlock or a serialization failure: the work was undone whole and may run again."""
    return isinstance(error, DatabaseFailed) and error.retryable


def may_run_again(error: BaseException, conflicts: int) -> bool:
    """Run again what ``error`` undid, which conflicts undid ``conflicts`` times before? The
    one rule for the writer's operations and batches and for a claim on PostgreSQL."""
    return conflict(error) and conflicts < CONFLICT_RETRIES


def run_batch(db: pw.Database, batch: list[tuple[Any, ...]], outcomes: Outcomes,
              stats: WriterStatistics) -> None:
    """Run every entry of ``batch`` in the open transaction, each outcome into ``outcomes``;
    raises only what fails the whole batch (an undo that failed in the database)."""
    control = Control(db)
    for unit in plan(batch):
        if isinstance(unit, int):
            outcomes[unit] = run_one(control, batch[unit][0])
        elif (failed := run_groups(control, batch, unit, outcomes, stats)) is not None:
            raised, error = failed
            for group in unit:  # the one that raised goes straight one by one
                if group is raised and conflict(error):
                    # Not one by one: each would wait for the same locks. In
                    # the next transaction, set-wise again (see the module).
                    outcomes.update((i, (False, error)) for i in group)
                    continue
                run_bulk(control, batch, group, outcomes, stats, set_wise=group is not raised)
        control.fresh = False


def run_one(control: Control, op: Callable[[], Any]) -> tuple[bool, Any]:
    """Run ``op`` under a savepoint of its own: if it raises, only its writes are undone."""
    # Plain statements: peewee's nested atomic() costs more than the op itself.
    name = control.savepoint("kinbox_op")
    try:
        outcome: tuple[bool, Any] = (True, op())
    except Exception as exc:
        undo_step(lambda: control.now(f"ROLLBACK TO SAVEPOINT {name}"), exc)
        outcome = (False, exc)
    control.later(f"RELEASE SAVEPOINT {name}")
    return outcome


def run_groups(control: Control, batch: list[tuple[Any, ...]], groups: list[list[int]],
               outcomes: Outcomes, stats: WriterStatistics
               ) -> tuple[list[int], Exception] | None:
    """Run every bulk kind's items set-wise under one savepoint; the group of the kind
    that raised (all of it undone) and its error, for the caller to run each kind on
    its own, or None.

    Every statement hands the interpreter lock over and waits to get it back, and
    under load that wait, not the statement, is most of the writer's time: one
    savepoint for all kinds instead of one each saves three of the dozen or so
    statements of a typical batch. There is no release: the commit releases it.
    On SQLite, when nothing ran before them in the transaction (the usual batch: all
    sends and turn commits), they take no savepoint at all: undoing them is rolling
    the transaction back and beginning it again (:meth:`Control.undo`).
    """
    name = control.savepoint("kinbox_bulk") if not control.restartable else None
    answers: list[tuple[list[int], list[Any]]] = []
    for group in groups:
        kind: Bulk[Any, Any] = batch[group[0]][0]
        try:
            answers.append((group, all_of(kind, [batch[i][1] for i in group])))
        except Exception as exc:
            undo_step(lambda: control.undo(name), exc)
            stats.shared_fallbacks += 1
            log.debug("a batch's bulk kinds run one kind at a time: %s",
                      type(exc).__name__)
            return group, exc
    for group, results in answers:
        if len(group) > 1:
            stats.bulk_runs += 1
        for i, result in zip(group, results, strict=True):
            outcomes[i] = (True, result)
    return None


def run_bulk(control: Control, batch: list[tuple[Any, ...]], indexes: list[int],
             outcomes: Outcomes, stats: WriterStatistics, *, set_wise: bool = True) -> None:
    """One kind's items under their own savepoint: set-wise (unless ``set_wise`` is
    False: it just failed that way), else one by one."""
    kind: Bulk[Any, Any] = batch[indexes[0]][0]
    items = [batch[i][1] for i in indexes]
    if len(items) > 1:
        if set_wise:
            ok, results = run_one(control, lambda: all_of(kind, items))
            if ok:
                stats.bulk_runs += 1
                for i, result in zip(indexes, results, strict=True):
                    outcomes[i] = (True, result)
                return
        stats.bulk_fallbacks += 1
    for i, item in zip(indexes, items, strict=True):
        outcomes[i] = run_one(control, lambda item=item: kind.one(item))
