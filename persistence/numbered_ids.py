"""Numbered message ids: ``base``, ``base-2``, ``base-3``... the ids messages of one kind
take in turn.

One scheme, read two ways: the actors layer takes the first free id of a chain (a child
task's result wake-ups and hand-backs, Focal's notices: ``subagents.next_free_id``), and
a prune (:mod:`.retention`) must know which ids follow a row so that it never deletes a
chain's start while a later member stays (the chain is walked from ``base`` to the
first id no row holds). Both use this module, so a change to the scheme changes both.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator

_NUMBERED = re.compile(r"^(?P<base>.+)-(?P<n>[0-9]+)$")


def numbered(base: str) -> Iterator[str]:
    """``base``, ``base-2``, ``base-3``...: the ids a message of one kind takes in turn."""
    yield base
    yield from (f"{base}-{n}" for n in itertools.count(2))


def successors(message_id: str) -> tuple[str, ...]:
    """The ids that would follow ``message_id`` in a chain: ``<id>-2`` (it may be a chain's
    base), and ``<base>-<n+1>`` when it is ``<base>-<n>``."""
    following = [f"{message_id}-2"]
    match = _NUMBERED.match(message_id)
    if match is not None:
        following.append(f"{match['base']}-{int(match['n']) + 1}")
    return tuple(following)


def is_numbered(message_id: str) -> bool:
    """``message_id`` has the form of a chain's later member (``<base>-<n>``): the only
    ids that can be another's successor."""
    return _NUMBERED.match(message_id) is not None


def chain_successors(ids: Iterable[str]) -> list[str]:
    """Every successor id of ``ids`` (for one query of which exist)."""
    return sorted({s for mid in ids for s in successors(mid)})
