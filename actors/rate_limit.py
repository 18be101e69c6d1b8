"""A token bucket per sender -> target pair (F6). Pure: time comes in as ``now``.

Capacity 3, one token back per second; a send that fails after taking a
token gets it refunded, so only accepted messages count against the rate (a
send of a turn's attempt that fails, too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CAPACITY = 3.0
REFILL_PER_SECOND = 1.0
AHEAD_TOLERANCE = 1.0
"""Seconds a bucket's time may be ahead of a process's clock and still be believed."""


@dataclass(frozen=True)
class Bucket:
    """The tokens a pair has at ``updated_at``."""

    tokens: float
    updated_at: float


def refill(bucket: Bucket | None, now: float, capacity: float = CAPACITY,
           rate: float = REFILL_PER_SECOND) -> Bucket:
    """The bucket as of ``now``.

    The bucket is shared by processes whose clocks differ a little: a ``now`` up to
    :data:`AHEAD_TOLERANCE` before the bucket's time refills nothing and keeps the later
    time, so no interval is counted twice. A bucket time further ahead is a clock that
    was wrong (a host skewed by minutes, a clock stepped back): kept, it would refill
    nothing for that long, so the bucket's time starts again from ``now``."""
    if bucket is None:
        return Bucket(capacity, now)
    elapsed = max(0.0, now - bucket.updated_at)
    ahead = bucket.updated_at - now
    stamp = bucket.updated_at if 0.0 < ahead <= AHEAD_TOLERANCE else now
    return Bucket(min(capacity, bucket.tokens + elapsed * rate), stamp)


def take(bucket: Bucket | None, now: float, capacity: float = CAPACITY,
         rate: float = REFILL_PER_SECOND) -> tuple[Bucket, float]:
    """Take one token: (new bucket, 0) if allowed, (unchanged bucket, seconds to wait) if not."""
    current = refill(bucket, now, capacity, rate)
    if current.tokens >= 1.0:
        return Bucket(current.tokens - 1.0, current.updated_at), 0.0
    return current, (1.0 - current.tokens) / rate


def refund(bucket: Bucket, capacity: float = CAPACITY) -> Bucket:
    """Give back a token taken by a send that then failed."""
    return Bucket(min(capacity, bucket.tokens + 1.0), bucket.updated_at)


def told_wait(wait: float) -> float:
    """``wait`` as a caller is told it, in tenths of a second rounded up: rounded to the
    nearest, a token 0.04 s away was "retry in 0.0s", and the retry made at once, as
    told, was refused again. (A hair over a tenth from float arithmetic is not one more.)"""
    return math.ceil(wait * 10 - 1e-9) / 10
