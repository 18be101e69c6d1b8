"""How a brain's exception asks its failed attempt to be retried (pure).

A brain's exception is one failed attempt, retried with its backoff, unless it says
otherwise by its type (never by its text):

- :class:`~.errors.PermanentFailure`: no further attempt (the row ends ``failed``);
- :class:`~.errors.RetryLater`: the next attempt no sooner than ``retry_after`` seconds
  (capped at :data:`RETRY_AFTER_MAX`), still counted as an attempt. So does a
  :class:`~.errors.ToolError` with a ``retry_after`` (a family send's rate limit) that the
  brain let escape: its retry repeats the send, which the limit would refuse sooner.

An exception raised ``from`` one of them (its ``__cause__``, followed down the chain)
counts as it: a brain that wraps a model client's error keeps its meaning. An implicit
``__context__`` does not (an error while handling another may be unrelated). An
exception group (a ``TaskGroup``'s) is permanent if any exception in it is (that part
fails the same way at every attempt), else it waits for the longest ``retry_after``
among them. The outermost classified exception wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import PermanentFailure, RetryLater, ToolError

RETRY_AFTER_MAX = 3600.0
"""The longest wait a ``retry_after`` gets, in seconds: a server asking for a day does not
park a message for a day (the row's attempts still run out as usual)."""

_CHAIN_LIMIT = 32
"""``__cause__`` links followed at most (a chain with a cycle ends)."""


@dataclass(frozen=True)
class FailureKind:
    """A failed attempt's classification, as data for the delivery core."""

    permanent: bool = False
    """No further attempt."""
    retry_after: float | None = None
    """Seconds the next attempt waits at least (within ``[0, RETRY_AFTER_MAX]``)."""


ORDINARY = FailureKind()
"""A failed attempt as any: the usual backoff."""


def clamp_retry_after(value: float | None) -> float | None:
    """``value`` within ``[0, RETRY_AFTER_MAX]``; None for none or not a number."""
    if value is None or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(min(max(value, 0.0), RETRY_AFTER_MAX))


def classify(error: BaseException | None) -> FailureKind:
    """The classification of a brain's exception (None, or an unclassified one: ORDINARY)."""
    return _classify(error, 0) or ORDINARY


def _classify(error: BaseException | None, depth: int) -> FailureKind | None:
    for _ in range(_CHAIN_LIMIT):
        if error is None or depth > _CHAIN_LIMIT:
            return None
        if isinstance(error, PermanentFailure):
            return FailureKind(permanent=True)
        if isinstance(error, RetryLater) or (
            isinstance(error, ToolError) and error.retry_after is not None
        ):
            return FailureKind(retry_after=clamp_retry_after(error.retry_after))
        if isinstance(error, BaseExceptionGroup):
            return _of_group(error, depth + 1)
        error = error.__cause__
    return None


def _of_group(group: BaseExceptionGroup[BaseException], depth: int) -> FailureKind | None:
    kinds = [k for k in (_classify(e, depth) for e in group.exceptions) if k is not None]
    if not kinds:
        return _classify(group.__cause__, depth)
    if any(k.permanent for k in kinds):
        return FailureKind(permanent=True)
    waits = [k.retry_after for k in kinds if k.retry_after is not None]
    return FailureKind(retry_after=max(waits) if waits else None)
