"""Journal retention: which inbox rows (and cron runs) a prune may delete, given a cutoff.

The journal keeps every message forever unless a prune reclaims the finished ones. A row
(with its delivery markers and its history in ``agent_inbox_events``) may go only when
nothing that still runs reads it. The readers, and the rule each one forces:

1. **Terminal, and not failed** (:data:`PRUNABLE_STATES`: ``delivered``, ``cancelled``).
   ``pending`` and ``processing`` rows are the mailboxes: a restart replays them (I7),
   and the exactly-once path reads their markers (a marker found on a claim means "ack,
   do not run again", I6). A ``failed`` row waits for an operator (``inbox requeue``,
   ``inbox show`` with its history, the child-task report of ``subagents``).
2. **Last changed before the cutoff** (``updated_at``, which every transition stamps).
   A row that goes terminal during a prune is stamped then, after the cutoff, and stays.
   The cutoff is the de-duplication window too: a ``post`` or ``agent_send`` repeated
   with the ``message_id`` of a pruned row is a new message (I2 holds within it). So the
   age may not be shorter than :data:`MIN_RETENTION`, the longest a paired device keeps
   re-sending a message with its id (a row received from it and pruned before its last
   re-send would run a second turn).
3. **No lease** (``lease_owner`` empty). A terminal row never holds one; a row that does
   is in somebody's hands, whatever its state says.
4. **Its task is settled.** A row whose payload names a ``task_id`` (a child's task
   message, its result wake-ups, Focal's blocked and finished notices) stays while that
   task is open (``pending``, ``in_progress``, ``blocked``): an open child task is
   reported from its task message's row (``report_orphans`` after a crash or another
   process's cancel), a blocked one that settles later wakes its parent only if that
   row exists, and a parent waiting on a foreground child reads it.
5. **No later message of its chain is kept.** Ids of one kind numbered in turn
   (``base``, ``base-2``, ``base-3``...: a task's result wake-ups and hand-backs,
   Focal's notices) are read by walking from ``base`` to the first id no row holds.
   Only messages about a task are numbered so, and each names its task in its payload:
   a row that names none is in no chain (a product's own ``invoice-7`` is not kept by
   a recent ``invoice-8``, or a journal of consecutively numbered messages never
   shrank).
   A pruned ``base`` with ``base-2`` kept would end that walk early (the parent would
   not take a foreground child's later result; a closing Focal heard would be told
   again), so a member goes only with, or after, the members that follow it. Deleting
   newest first (:func:`prunable` per batch, batches newest first) lets a whole old
   chain go in one prune; a chain cut short at its end is walked correctly, and its
   next message takes a freed id, which is unique again (its markers went with it).

The transcript (``transcript_entries``) is the conversation itself and is never pruned
here; nor is a marker whose message id has no inbox row (a direct turn's).

**Cron runs** (``cron_runs``) are pruned by the same cutoff, by rules of their own (an
every-minute job adds 525,600 a year): a run goes when it **finished** (``success`` or
``error``; a ``running`` one is leased, or waits to be taken over), **before the cutoff**
(``finished_at``, and ``started_at``: a clock set back between the two can only delay
it), and is **not among its job's** :data:`KEPT_CRON_RUNS` **newest**
(``started_at``, then id: the order a run reads its job's last runs in, for the "Last
run" of its reminder, and the job's listing). A run's record keeps its occurrence from
running twice only while that occurrence is due (a second trigger at one clock reading);
its job's ``next_run_at`` moved past it as it fired, long before any cutoff.

Pure: no database, no clock; the caller gives the rows' facts, the cutoff and which chain
successors exist.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

from .inbox_core import CANCELLED, DELIVERED, PEER, retry_horizon
from .numbered_ids import successors

PRUNABLE_STATES = (DELIVERED, CANCELLED)
"""The states a prune may delete (rule 1): terminal, and no operator waits on them."""

DEFAULT_BATCH = 200
"""Rows a prune deletes per transaction: the writer is held for one batch at a time, so
senders wait at most one batch's deletes behind it."""

MAX_BATCH = 10_000
"""The largest batch a caller may ask for."""

MIN_RETENTION = math.ceil(retry_horizon(PEER) / 3600) * 3600
"""The shortest age a prune takes, in seconds (38 h): a paired device re-sends a row it
has no ack for (the receiver committed it, the ack was lost) with the same id until its
last attempt, :func:`~.inbox_core.retry_horizon` of the peer policy (37.1 h) after its
first; the receiver de-duplicates it only while its row is kept. Rounded up to the hour
for the attempts' own durations (a minute each, on average, over 48). Local retries are
the row itself (nothing re-sends a finished one); a social event's direct turn keeps a
once-only record no prune deletes (a marker with no inbox row), a cron occurrence is
not due again once its job's next time moved past it (its run's record may go), while an
event a stop handed to the inbox is de-duplicated by its row like any message, for at
least this long (a platform's own retry window is not known here). Not covered: a sender
that was down longer than the margin (its schedule resumes where it stopped) or an
operator's requeue of a failed row."""

KEPT_CRON_RUNS = 5
"""The newest runs of each job a prune keeps, however old: the runs a run reads of its
job's last ones, for the "Last run" of its reminder (``CronStore.last_runs``)."""


class Keep(StrEnum):
    """Why a row stays (each a rule of the module docstring)."""

    NOT_TERMINAL = "not_terminal"
    """Rule 1: pending, processing or failed."""
    RECENT = "recent"
    """Rule 2: changed at or after the cutoff."""
    LEASED = "leased"
    """Rule 3: someone holds its lease."""
    TASK_OPEN = "task_open"
    """Rule 4: the task its payload names is still open."""
    CHAIN = "chain"
    """Rule 5: a later message of its chain is kept."""


@dataclass(frozen=True, slots=True)
class RowFacts:
    """What the rules read of one inbox row."""

    message_id: str
    """The row's id (its chain is read from it)."""
    status: str
    """Its state (``inbox_core.State``)."""
    updated_at: float
    """When it last changed (epoch seconds, the runtime's clock)."""
    leased: bool
    """A lease owner is set."""
    task_open: bool = False
    """Its payload names a task, and that task exists and is open."""
    chained: bool = False
    """Its payload names a task: it may be a member of a numbered chain (rule 5)."""


def keep_reason(row: RowFacts, cutoff: float) -> Keep | None:
    """Why ``row`` stays by rules 1 to 4 (its own facts), or None if they let it go."""
    if row.status not in PRUNABLE_STATES:
        return Keep.NOT_TERMINAL
    if row.updated_at >= cutoff:
        return Keep.RECENT
    if row.leased:
        return Keep.LEASED
    if row.task_open:
        return Keep.TASK_OPEN
    return None



def prunable(rows: Sequence[RowFacts], cutoff: float,
             kept_elsewhere: Collection[str]) -> list[str]:
    """The ids of ``rows`` a prune may delete now, in the order given.

    ``kept_elsewhere``: the successors (:func:`successors`) of these rows that exist in
    the journal and are not among ``rows``. A row whose successor stays, here or there,
    stays too (rule 5), and so, in turn, does its own predecessor; a row that is in no
    chain (:attr:`RowFacts.chained`) is not kept by the ids that would follow it."""
    going = {r.message_id for r in rows if keep_reason(r, cutoff) is None}
    chained = {r.message_id for r in rows if r.chained}
    staying = set(kept_elsewhere) | {r.message_id for r in rows} - going
    changed = True
    while changed:  # a kept successor keeps its predecessor, and so on down the chain
        changed = False
        for mid in list(going & chained):
            if any(s in staying for s in successors(mid)):
                going.discard(mid)
                staying.add(mid)
                changed = True
    return [r.message_id for r in rows if r.message_id in going]
