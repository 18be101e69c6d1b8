"""Bulk kinds of write and where a batch runs them: the writer's set-wise planning.

A :class:`Bulk` kind names an operation the group-commit writer
(:mod:`.writer`) may run many of with a few set-wise statements instead of a
few per operation. :func:`plan` orders a drained batch into execution units and
:func:`all_of` checks a kind's set-wise answer. These are rules only (no
threads, no database): how the units run in the transaction is
:mod:`.batch_run`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
A = TypeVar("A")


@dataclass(frozen=True, eq=False)
class Bulk(Generic[A, T]):
    """A kind of operation the writer may run many of at once.

    ``one`` runs a single item; ``many`` runs several and returns their
    results in order, or raises to have them run one by one (a rare case it
    does not handle, such as an idempotent repeat or a lost lease). Every kind
    of a batch shares one savepoint (or, first in a SQLite transaction, none: the
    transaction begins again), so when one kind raises the others' work
    is undone too and their ``many`` runs again on the same items: ``many``
    must do nothing but its database writes (no effect outside the
    transaction, nothing it would be wrong to do twice).
    """

    name: str
    one: Callable[[A], T]
    many: Callable[[list[A]], list[T]]


def all_of(kind: Bulk[Any, Any], items: list[Any]) -> list[Any]:
    """``kind.many(items)``; raises when it did not answer every item (the caller undoes
    it by its savepoint, then runs the items one by one)."""
    results = kind.many(items)
    if len(results) != len(items):  # undone by the savepoint, then run one by one
        raise ValueError(f"bulk {kind.name!r} returned {len(results)} results "
                         f"for {len(items)} items")
    return results


def plan(batch: list[tuple[Any, ...]]) -> list[int | list[list[int]]]:
    """Execution units in arrival order: a plain operation's index, or, where the batch's
    first bulk item stands, every bulk kind's items (a group per kind, in the order the
    kinds first appear), which run together.

    ``batch`` holds the writer's queue entries: ``(op, reply)`` for a plain operation,
    ``(bulk kind, item, reply)`` for a bulk item."""
    units: list[int | list[list[int]]] = []
    groups: dict[int, list[int]] = {}
    for i, item in enumerate(batch):
        if len(item) == 2:
            units.append(i)
            continue
        if not groups:
            units.append([])  # the bulk unit's place; filled in below
        groups.setdefault(id(item[0]), []).append(i)
    return [list(groups.values()) if isinstance(u, list) else u for u in units]
