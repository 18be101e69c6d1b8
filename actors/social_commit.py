"""The commit of a social turn's events (SO1): their delivery markers, and what an
unknown outcome turned out to be.

A turn's commit writes its events' delivery markers and is refused
(:class:`DuplicateError`) when one has a marker already: a platform's retry
that reached another runtime sharing the database commits once. A commit whose
waiter gave up while the writer ran it (:class:`WriteTimeout`, not withdrawn)
may land after; :func:`resolve` reads the journal, after that commit's batch,
to say which it was, so a reply is neither lost nor sent twice.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace

from ..persistence import DuplicateError, PersistenceError, WriterClosed, WriteTimeout
from . import social_rules as rules
from .context import RuntimeContext
from .direct_turn import DirectOutcome

log = logging.getLogger("kinbox.social")


@dataclass
class CommitWatch:
    """What a social turn's commit wrote, as its writer ran it (read once its batch is
    over): the events whose markers it writes, and whether it wrote them."""

    event_ids: list[str] = field(default_factory=list)
    wrote: bool = False


def outcome_unknown(error: PersistenceError | None) -> bool:
    """A commit whose waiter gave up once the writer had taken it: it may yet land."""
    return isinstance(error, WriteTimeout) and not error.withdrawn


def record_events(ctx: RuntimeContext, sid: str, event_ids: list[str], now: float,
                  watch: CommitWatch) -> None:
    """Inside the turn's commit: its events' delivery markers, or :class:`DuplicateError`
    (undoing the commit) when one has a marker already. A platform's retry that reached
    another runtime sharing the database ran there too; one of the two commits, and
    only its replies are sent. ``watch`` learns that this commit wrote them."""
    done = ctx.journal.committed_of(event_ids)
    if done:
        raise DuplicateError("social event", "event_id", sorted(done)[0])
    ctx.journal.write_turn(sid, event_ids, [], now)
    watch.wrote = True


def resolve(ctx: RuntimeContext, stop: threading.Event, sid: str, done: DirectOutcome,
            watch: CommitWatch) -> DirectOutcome:
    """The outcome of a turn whose commit's waiter gave up while the writer ran it
    (:class:`WriteTimeout`, not withdrawn): it may have landed. (Merely run again, one
    that landed found its events' markers, was taken for another runtime's, and its reply
    was never sent.) The journal decides, read on the writer after that commit's
    batch: the markers there and written by this commit, it committed (its replies
    leave); there but not this commit's, another runtime's turn ran the events; absent,
    nothing landed (a refused commit: the events run again). A read that fails too is
    tried again, the chat waiting, until it answers or the runtime stops (the stop hands
    the events to the inbox, which skips them if the commit landed)."""
    journal, ids = ctx.journal, list(watch.event_ids)
    tries = 0
    while True:
        try:
            found = journal.writer.call(lambda: journal.committed_of(ids))
            break
        except WriterClosed:
            raise
        except PersistenceError as exc:
            tries += 1
            log.warning("the commit of a social turn in %s has an unknown outcome, and "
                        "reading the journal failed too (%s); trying again", sid, exc)
            if stop.wait(rules.stall_pause(tries)):
                raise WriterClosed("stopping before the outcome of a social turn's "
                                   "commit was known") from exc
    if ids and found == set(ids) and watch.wrote:
        log.info("the commit of a social turn in %s landed after its waiter gave up", sid)
        return replace(done, committed=True, error=None, commit_error=None)
    if found:  # another runtime's turn committed these events: concluded as such
        return replace(done, commit_error=None)
    return done  # nothing of it landed: a refused commit
