"""A token bucket per sender -> target pair (F6). Pure: time comes in as ``now``.

Capacity 3, one token back per second; a send that fails after taking a
token gets it refunded, so only accepted messages count against the rate (a
send of a turn's attempt that fails, too).
"""

from __future__ import annotations

from dataclasses import dataclass

CAPACITY = 3.0
REFILL_PER_SECOND = 1.0


@dataclass(frozen=True)
class Bucket:
    """The tokens a pair has at ``updated_at``."""

    tokens: float
    updated_at: float


def refill(bucket: Bucket | None, now: float, capacity: float = CAPACITY,
           rate: float = REFILL_PER_SECOND) -> Bucket:
    """The bucket as of ``now``. A ``now`` before the bucket's time (the bucket is shared
    by processes whose clocks differ by a little) refills nothing and keeps the later
    time, so no interval is counted twice."""
    if bucket is None:
        return Bucket(capacity, now)
    elapsed = max(0.0, now - bucket.updated_at)
    return Bucket(min(capacity, bucket.tokens + elapsed * rate), max(now, bucket.updated_at))


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
