"""Firing due schedules once across processes: the compare-and-set both schedule tables use.

A schedule row (a Focal wake-up in ``scheduled_jobs``, a user job in
``cron_jobs``) is due when it is active and its ``next_run_at`` has come.
Whoever moves ``next_run_at`` on, with an UPDATE that matches the value it
read, owns that occurrence: a second process that read the same row matches
nothing and skips it. The UPDATE matches an active row only: a Focal
wake-up's cancel leaves ``next_run_at`` as it is, and a cancel committed by
another process between the read and the UPDATE was undone by it (the
wake-up set active again, firing for good). The caller's ``on_fire`` runs in the same transaction
(on the writer thread), so the occurrence and what it causes commit
together or not at all.

``move_due`` moves rows' next runs the same way (a clock set back: the
caller decides which and where): a row another process fired or moved
meanwhile is left to it. ``has_due`` and ``has_due_moves`` ask the same
questions with a read alone, so that a look finding nothing queues no
transaction: almost every look at a schedule table finds nothing due, and a
row written by a clock that read ahead stays "written late" until this clock
catches up (days, maybe), moved or not; every such look that queued a
transaction held the writer (and SQLite's write lock) for nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import peewee as pw

R = TypeVar("R")


def fire_due(model: type[pw.Model], now: float, to_record: Callable[[Any], R],
             advance: Callable[[R], dict[str, Any]],
             on_fire: Callable[[R], None], ready: Any = None) -> list[R]:
    """Fire every due row of ``model`` once; call inside a writer operation.

    ``advance(record)`` gives the columns an occurrence sets (at least the new
    ``next_run_at``); ``on_fire(record)`` runs only for the rows this caller
    won, in the same transaction. ``ready``: a condition a due row must meet as well
    (a row failing it waits, due, until it does). Returns the records fired, soonest
    first.
    """
    m: Any = model
    due = [to_record(r) for r in m.select().where(*_due(m, now, ready)).order_by(
        m.next_run_at, m.id)]
    fired: list[R] = []
    for record in due:
        changes = advance(record)
        won = m.update(**changes).where(
            m.id == record.id, m.next_run_at == record.next_run_at,  # type: ignore[attr-defined]
            m.active == True).execute()  # noqa: E712
        if won:
            on_fire(record)
            fired.append(record)
    return fired


def has_due(model: type[pw.Model], now: float, ready: Any = None) -> bool:
    """Would :func:`fire_due` (given the same ``ready``) find a due row now? A read,
    outside any transaction of the writer's: every look at a schedule table (each tick,
    each poll) found nothing due almost always, and queued a transaction for it all the
    same."""
    m: Any = model
    return bool(m.select().where(*_due(m, now, ready)).exists())


def _due(m: Any, now: float, ready: Any) -> list[Any]:
    """The conditions of a due row (``ready``: one more, if any)."""
    due = [m.active == True, m.next_run_at <= now]  # noqa: E712
    return due if ready is None else [*due, ready]


def _to_move(model: type[pw.Model], written_late: Any, to_record: Callable[[Any], R],
             moved_to: Callable[[R], float | None]) -> Iterator[tuple[R, float]]:
    m: Any = model
    for record in [to_record(r) for r in m.select().where(
            m.active == True, written_late)]:  # noqa: E712
        upcoming = moved_to(record)
        if upcoming is not None:
            yield record, upcoming


def has_due_moves(model: type[pw.Model], written_late: Any, to_record: Callable[[Any], R],
                  moved_to: Callable[[R], float | None]) -> bool:
    """Would :func:`move_due` move a row now? A read, outside any transaction of the
    writer's: only a yes is worth one (which decides again on the rows as it reads them)."""
    return next(_to_move(model, written_late, to_record, moved_to), None) is not None


def move_due(model: type[pw.Model], written_late: Any, to_record: Callable[[Any], R],
             moved_to: Callable[[R], float | None], changes: dict[str, Any]) -> list[R]:
    """Move the next run of each active row matching ``written_late`` to
    ``moved_to(record)`` (None: keep it), with ``changes``; call inside a writer
    operation. Returns the records moved (as they were)."""
    m: Any = model
    moved: list[R] = []
    for record, upcoming in list(_to_move(model, written_late, to_record, moved_to)):
        if m.update(next_run_at=upcoming, **changes).where(
                m.id == record.id, m.next_run_at == record.next_run_at,  # type: ignore[attr-defined]
                m.active == True).execute():  # noqa: E712
            moved.append(record)
    return moved
