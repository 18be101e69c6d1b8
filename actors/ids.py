"""New message ids: time-ordered, so B-trees append.

A message id is the inbox's primary key and is indexed again by the delivery
markers and the transcript. Random ids (uuid4) land each new row on a random
leaf page of those indexes, so every group commit dirties, and writes to the
write-ahead log, about one page per message per index; ids that grow with
time land on the rightmost leaf, so a batch of a thousand dirties a handful
(the UUIDv7 idea, RFC 9562: a millisecond timestamp, then random bits).

The id is 32 lowercase hex digits like ``uuid4().hex``: 12 of milliseconds
since the epoch, 20 of randomness (80 bits, so two ids of one millisecond
collide with odds of 2**-80). Nothing relies on the order: it only makes
writes cheap. The shorter ids of sessions, projects, tasks and jobs are cut
from its tail (:func:`short`), the random part, so those are not
ordered (their head would be the clock, the same for all of a millisecond).

:func:`time_ordered_id` is a pure function of its inputs; :func:`new_id`
feeds it the wall clock, not the runtime's injected clock (an id's order only
serves the indexes; tests that need repeatable ids pass their own source,
``Runtime(ids=...)``), and bits of a generator seeded from the operating
system's randomness, not the operating system's randomness itself. An id is
an address, never a secret (tokens, nonces and pairing codes take
``os.urandom`` directly), so it needs uniqueness, not unpredictability (ids
are predictable from earlier ones: never let one grant access); and
``os.urandom`` is a system call that lets go of the interpreter lock, so
every send paid one more hand-off of the lock (a thread switch, under load)
for its id. The generator is seeded again in a forked child, so a parent
and its child never draw the same bits.
"""

from __future__ import annotations

import os
import random
import time

RANDOM_BYTES = 10

_bits = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _bits.seed(os.urandom(32)))


def time_ordered_id(millis: int, random: bytes) -> str:
    """The id for ``millis`` ms since the epoch and ``RANDOM_BYTES`` of ``random``."""
    if len(random) != RANDOM_BYTES:
        raise ValueError(f"a time-ordered id takes {RANDOM_BYTES} random bytes, "
                         f"not {len(random)}")
    if not 0 <= millis < 1 << 48:
        raise ValueError(f"milliseconds out of range for a time-ordered id: {millis}")
    return f"{millis:012x}{random.hex()}"


def new_id() -> str:
    """A fresh time-ordered id (wall clock, seeded random bits: see the module)."""
    return time_ordered_id(time.time_ns() // 1_000_000,
                           _bits.getrandbits(8 * RANDOM_BYTES).to_bytes(RANDOM_BYTES, "big"))


def short(full: str, length: int) -> str:
    """The last ``length`` characters of an id from :func:`new_id` (or a runtime's own id
    source): its random part, for the short ids of sessions, projects, tasks and jobs."""
    return full[-length:]
