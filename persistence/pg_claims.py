"""PostgreSQL's head reads: the claim's walk and the commit's next-head lookup.

Only the oldest open row of a target (its *head*) may be claimed. The
statement SQLite runs for that (:meth:`.hot_path.HotPath.due_heads`: the due
rows in ``seq`` order, filtered by a correlated "is it its target's head"
subquery, under a ``LIMIT``) leaves PostgreSQL's planner a choice, and on a
large backlog it chose badly: a walk of the whole table, or a scan and sort
of every pending row with the subquery run for each (seconds per claim).

Here the statements run over the partial indexes of :mod:`.open_indexes`,
and the head probe sits outside the ``LIMIT``, so whatever plan the
planner picks it runs only on the rows of one window (with statistics the
window is an ordered index walk and the lock goes by primary key; on a
table never analyzed the planner reads the partial indexes whole, linear
in the backlog, see ``tests/test_scaleout_open_indexes.py``):

* a *window*: the next pending (or processing) rows after a ``seq`` cursor,
  ``ORDER BY seq LIMIT n`` on the index of that state alone, each marked
  a head this claim may take or not by a one-row probe of its target's
  head. Both states' first windows go in one round trip; the walk goes
  on, a larger window each time, until it has enough heads or no rows are
  left, so no due head is ever out of reach. Ids and due times come back:
  a pending head not yet due (a backoff; a send stamped by a process whose
  clock reads a little ahead) gives the claim's ``next_due``;
* a *lock*: the chosen rows by primary key, ``FOR UPDATE SKIP LOCKED``,
  with their state, due time and headship checked again in the lock's own
  (newer) snapshot, so a row another process took or finished meanwhile is
  dropped, and rows others hold are skipped, never waited for; it also
  reads whether a turn of each row has already committed (its marker).

The usual claim (:meth:`PgClaims.claim_plain`) is two statements and no
transaction block: the window read (all an empty claim costs: with several
workers, every send wakes each of them and all but one find nothing), then
one statement that locks the candidates and leases, in the same statement,
those that need nothing but a lease (pending, not suspect, no marker). It
was five round trips (``BEGIN``, window, lock, lease, ``COMMIT``), each a
wait for the interpreter lock on a busy worker. A
locked head that needs more (a takeover, a suspect, a committed turn) is
reported, and the journal claims it by the full rules in a transaction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import peewee as pw

from .hot_path import (
    CLAIM_COLUMNS,
    INBOX,
    PENDING,
    PROCESSING,
    Head,
    direct_turn_marked,
    head_probe,
)
from .inbox_core import is_claimable, is_suspect, pick_heads
from .pg_params import text_array
from .pg_prepared import PreparedStatement

FIRST_WINDOW, LAST_WINDOW = 32, 4096
"""Rows in the walk's first window, and the most in one: each next window is eight times
the last (a claim of a few rows, the usual case, reads a few dozen; a walk past a deep
backlog of busy sessions takes a few round trips)."""

DEEP_WALK_SECONDS = 1.0
"""How often (on the claims' clock) the common claim, already full of pending heads,
walks on past the first window of processing rows, for a dead worker's row older than
those heads: at every claim under a backlog it read every turn running anywhere (1.3 ms
more a claim with 500 running), and a row taken over a second late is still taken over.
The full rules' read (:meth:`PgClaims.due_heads`, rare) always walks so."""


def marker_probe(message_id: str) -> str:
    """SQL for "the row ``message_id`` names already has a committed turn" (its delivery
    marker), as one probe of the markers' index per row.

    Not ``EXISTS``: the planner may make that a hashed subplan that reads the whole
    markers table once per statement, and does while it believes the table small, as one
    analyzed empty looks while a drain fills it (seen in the fused commit of
    :mod:`.pg_commits`: every marker read for a batch's few next heads). A scalar subquery
    is never hashed, so each row costs one probe of the markers' index."""
    return (f"((SELECT 1 FROM delivery_markers d WHERE d.message_id = {message_id} "
            f"LIMIT 1) IS NOT NULL)")


def no_turn_running(target: str) -> str:
    """SQL for "no turn of ``target`` runs anywhere": none of its rows is processing and no
    direct turn (a cron run, a social event) marks its session; what a pending head must
    also be to be claimed here, as two probes (the partial index of processing rows, the
    sessions' key).

    The head rule (the oldest open row) keeps one row of a target in flight only where
    ``seq`` order is commit order. PostgreSQL numbers a row when it is written, not when
    it commits: a send numbered 10 that commits after one numbered 11 (two processes
    sending to one session; a batch that waits on its disk) became the head while 11's
    turn ran, and another worker ran 10 beside it. A direct turn's exclusion was the
    memory of the process running it, so another process claimed its session's rows.
    A target with a turn running is skipped; its row is chained or claimed once the turn
    ends (:meth:`.sessions.SessionStore.take_direct_turn` is the direct turns' side)."""
    return (f"((SELECT 1 FROM {INBOX} r WHERE r.target_chat_id = {target} "
            f"AND r.status = '{PROCESSING}' LIMIT 1) IS NULL "
            f"AND NOT {direct_turn_marked(target)})")


def processing_head(target: str) -> str:
    """SQL for the ``seq`` of ``target``'s oldest processing row: the one a claim takes
    over when its lease ran out. Not the target's head (its oldest open row): a row
    numbered first and committed after the turn of a later one began is pending below
    it, and waits for that turn (:func:`no_turn_running`), so a takeover that waited for
    it to go first would wait for ever once the owner died."""
    return (f"(SELECT r.seq FROM {INBOX} r WHERE r.target_chat_id = {target} "
            f"AND r.status = '{PROCESSING}' ORDER BY r.seq LIMIT 1)")


def _takes(state: str, row: str) -> str:
    """SQL for "the inbox row ``row`` (an alias) is the row of its target a claim takes in
    ``state``, when due": a pending head of a target with no turn running, or the oldest
    processing row of its target (a takeover)."""
    target = f"{row}.target_chat_id"
    if state == PENDING:
        return f"{row}.seq = {head_probe(target)} AND {no_turn_running(target)}"
    return f"{row}.seq = {processing_head(target)}"


def _claimable(now: str) -> str:
    """SQL for "the inbox row ``m`` may be claimed at ``now``" (a placeholder, once per
    state), as the lock checks it again on the row's newest version."""
    return " OR ".join(f"(m.status = '{state}' AND m.{due} <= {now} AND {_takes(state, 'm')})"
                       for state, due in _DUE.items())


_DUE = {PENDING: "available_at", PROCESSING: "lease_until"}
"""The column that says when a row of each open state may be claimed."""


class PlainClaim(NamedTuple):
    """What :meth:`PgClaims.claim_plain` leased, and whether it left heads that need more."""

    rows: list[Head]
    special: bool
    """It leased fewer than its limit and locked heads it did not lease: ones that need the
    full claim (a takeover, a suspect, a committed turn), or plain ones it left for them."""
    next_due: float | None
    """The earliest due time of a pending head it saw not yet due (None: none)."""


class PgClaims:
    """A claim's head reads on one PostgreSQL database, on its caller's connection (a
    commit's next heads are :class:`.pg_commits.PgTurnSql`'s)."""

    def __init__(self, db: pw.Database) -> None:
        self.db = db
        self._deep_walked_at = -math.inf
        """When a full claim last walked the processing rows past their first window."""
        cols = ", ".join(CLAIM_COLUMNS)
        # Each row: its id, seq, due time, and whether it is a head this claim may take.
        # A pending row's due time is compared by the caller, so a head not yet due says
        # when it will be (``next_due``); a processing row's lease is tested here first,
        # and the head probe runs only for the rare one that ran out (most are live).
        self.sql_window = {
            state: (f"SELECT w.message_id, w.seq, w.{due}, "
                    + ("" if state == PENDING else f"w.{due} <= %(now)s AND ")
                    + "w.transport = %(transport)s "
                    "AND NOT (w.target_chat_id = ANY(%(skip)s)) "
                    + f"AND {_takes(state, 'w')}, w.suspect IS TRUE "
                    f"FROM (SELECT message_id, seq, target_chat_id, transport, {due}, "
                    f"suspect FROM {INBOX} WHERE status = '{state}' AND seq > %(after)s "
                    f"ORDER BY seq LIMIT %(window)s) w ORDER BY w.seq")
            for state, due in _DUE.items()}
        # Both states' first windows in one round trip (the processing one is nearly
        # always empty: only rows whose owner died or overran their lease).
        self.sql_first = " UNION ALL ".join(
            f"(SELECT '{state}', q.* FROM ({self.sql_window[state]}) q)" for state in _DUE)
        self.first = PreparedStatement(db, "kinbox_claim_window", self.sql_first, [
            ("now", "float8"), ("transport", "text"), ("skip", "text[]"), ("after", "bigint"),
            ("window", "integer")])
        self.sql_lock = (f"SELECT {cols}, {marker_probe('m.message_id')} FROM {INBOX} m "
                         f"WHERE m.message_id = ANY(%s) "
                         f"AND ({_claimable('%s')}) "
                         f"ORDER BY m.seq FOR UPDATE OF m SKIP LOCKED")
        # The lock above, then the lease of its plain rows, in one statement.
        self.sql_lease_plain = (
            f"WITH c AS (SELECT {cols}, {marker_probe('m.message_id')} AS done "
            f"FROM {INBOX} m WHERE m.message_id = ANY(%(ids)s) "
            f"AND ({_claimable('%(now)s')}) "
            f"ORDER BY m.seq FOR UPDATE OF m SKIP LOCKED), "
            f"p AS (SELECT message_id, target_chat_id FROM c WHERE status = '{PENDING}' "
            f"AND suspect IS NOT TRUE AND NOT done ORDER BY seq LIMIT %(limit)s), "
            f"leased AS (UPDATE {INBOX} u SET status = '{PROCESSING}', "
            f"lease_owner = %(owner)s, lease_until = %(until)s, updated_at = %(now)s "
            f"FROM p WHERE u.message_id = p.message_id RETURNING u.message_id) "
            f"SELECT c.*, c.message_id IN (SELECT message_id FROM leased) FROM c "
            f"ORDER BY c.seq")
        self.sql_stand_back = (
            f"WITH c AS (SELECT m.message_id FROM {INBOX} m "
            f"WHERE m.message_id = ANY(%(ids)s) AND m.status = '{PROCESSING}' "
            f"AND m.lease_owner = %(owner)s AND ("
            f"(SELECT 1 FROM {INBOX} r WHERE r.target_chat_id = m.target_chat_id "
            f"AND r.status = '{PROCESSING}' AND r.lease_owner <> %(owner)s "
            f"AND r.lease_until > %(now)s LIMIT 1) IS NOT NULL "
            f"OR {direct_turn_marked('m.target_chat_id')})) "
            f"UPDATE {INBOX} u SET status = '{PENDING}', lease_owner = NULL, "
            f"lease_until = NULL, turn_started_at = NULL, updated_at = %(now)s FROM c "
            f"WHERE u.message_id = c.message_id RETURNING u.message_id")
        self.lease_plain = PreparedStatement(db, "kinbox_claim_lease", self.sql_lease_plain, [
            ("ids", "text[]"), ("now", "float8"), ("owner", "text"), ("until", "float8"),
            ("limit", "integer")])

    def stand_back(self, owner: str, ids: Sequence[str], now: float) -> set[str]:
        """Hand back, unrun, the rows of ``ids`` just leased to ``owner`` whose session turns
        out to have a turn running elsewhere; their ids.

        A claim checks "no turn of the session runs" in its statement's snapshot, and so
        do the others (a claim of the session's other row, a direct turn marking it): two
        that run at once each miss the other's write, not yet committed. Read again after
        the claim committed, in a snapshot of its own, the later of the two sees the
        other's, and stands back (both may: the rows are claimed again at the next try).
        Another owner's processing row counts while its lease is live; a dead owner's
        rows (their leases run out) are what a takeover takes."""
        if not ids:
            return set()
        return {r[0] for r in self.db.execute_sql(self.sql_stand_back, {
            "ids": text_array(ids), "owner": owner, "now": now})}

    def claim_plain(self, owner: str, transport: str, now: float, until: float, limit: int,
                    exclude: Sequence[str] = (), suspects: int = 1) -> PlainClaim:
        """Lease to ``owner`` until ``until`` due heads of targets not in ``exclude`` that
        need nothing but their lease (pending, not suspect, no committed turn), oldest
        first: the common claim, in two statements and no transaction block (each
        statement is its own transaction).

        One read finds the candidates (no write, nothing locked: an empty claim is that
        read alone); one statement locks them (``FOR UPDATE SKIP LOCKED``, every check
        made again on each row's newest version) and leases the plain ones. Whether a
        locked head needs more (a takeover, a suspect row, a committed turn) comes back
        as ``special``: the caller claims those by the full rules.

        Of the ``limit`` places, the plain heads get those the oldest-first order leaves
        them (:meth:`_Found.plain_room`): up to ``suspects`` older suspect heads (a dead
        worker's row taken over among them) keep theirs for the caller. Given every
        place, the plain heads filled each claim while other sessions kept a backlog,
        and a dead worker's session waited for all of it to drain."""
        found = self._candidates(transport, now, limit, exclude, self._deep_walk(now))
        ids = found.ids
        if not ids:
            return PlainClaim([], False, found.next_due)
        rows = self.lease_plain.run(
            {"ids": text_array(ids), "now": now, "owner": owner, "until": until,
             "limit": found.plain_room(suspects)})
        leased = [Head._make(r[:-2]) for r in rows if r[-1]]
        # A plain head left for a suspect's place counts too: the suspect may be gone
        # (another claim took it), and the full rules then fill its place.
        special = len(leased) < limit and any(not r[-1] for r in rows)
        return PlainClaim(leased, special, found.next_due)

    def _deep_walk(self, now: float) -> bool:
        """May this claim walk deep (see :meth:`_candidates`)? At most once each
        :data:`DEEP_WALK_SECONDS` (a clock set back walks at once)."""
        if 0.0 <= now - self._deep_walked_at < DEEP_WALK_SECONDS:
            return False
        self._deep_walked_at = now
        return True

    def due_heads(self, transport: str, now: float, limit: int,
                  exclude: Sequence[str] = ()) -> tuple[list[Head], set[str]]:
        """Up to ``limit`` due heads of targets not in ``exclude``, oldest first, locked;
        and the ids among them that already have a committed turn (their marker)."""
        ids = self._candidates(transport, now, limit, exclude).ids
        if not ids:
            return [], set()
        heads: list[Head] = []
        committed: set[str] = set()
        for r in self.db.execute_sql(self.sql_lock, (text_array(ids), now, now)):
            heads.append(Head._make(r[:-1]))
            if r[-1]:
                committed.add(r[0])
        return heads[:limit], committed

    def _candidates(self, transport: str, now: float, limit: int,
                    exclude: Sequence[str], deep: bool = True) -> _Found:
        """Up to ``limit`` due heads per open state, oldest first (unlocked), and the
        earliest due time of a pending head it saw not yet due. ``deep``: a state walks
        on past its first window even when ``limit`` heads were found, while a head there
        could still be among the ``limit`` oldest (a dead worker's row behind the turns
        running elsewhere, older than the pending heads found)."""
        skip = text_array(exclude)  # a literal: see .pg_params
        window = max(FIRST_WINDOW, 4 * limit)
        rows = self.first.run(
            {"now": now, "transport": transport, "skip": skip, "after": 0, "window": window})
        found = _Found(now, limit)
        for state in _DUE:
            mine = [r[1:] for r in rows if r[0] == state]
            found.add(state, mine)
            if len(mine) == window and found.room_after(mine[-1][1]):  # more rows: walk on
                if found.heads >= limit and not deep:
                    continue
                self._walk(state, transport, skip, mine[-1][1], window, found)
        return found

    def _walk(self, state: str, transport: str, skip: str, after: int, window: int,
              found: _Found) -> None:
        """Add the claimable heads in ``state`` after ``after`` to ``found``, in order,
        until no head past the rows read could be among a claim's ``limit`` oldest, or no
        rows are left."""
        while found.room_after(after):
            window = min(LAST_WINDOW, window * 8)
            rows: list[Any] = self.db.execute_sql(self.sql_window[state], {
                "now": found.now, "transport": transport, "skip": skip, "after": after,
                "window": window}).fetchall()
            found.add(state, rows)
            if len(rows) < window:
                break
            after = rows[-1][1]


class _Found:
    """What a claim's window reads found: the claimable heads of each state (at most
    ``limit`` a state, and apart from them at most ``limit`` pending suspects), and the
    earliest due time of a pending head not yet due.

    Pending suspects (rows handed back unrun after a takeover) are kept apart: a claim
    runs few of them (one at a time a runtime), and counted with the plain heads, older
    ones filled the claim's room and the plain heads behind them were never read, so
    they waited until the suspects had run one by one."""

    __slots__ = ("by_state", "counted", "limit", "next_due", "now", "order", "suspects")

    def __init__(self, now: float, limit: int) -> None:
        self.now = now
        self.limit = limit
        self.by_state: dict[str, list[str]] = {state: [] for state in _DUE}
        self.suspects: list[str] = []
        self.next_due: float | None = None
        self.order: list[tuple[int, bool]] = []
        """``(seq, suspect)`` of every head kept; suspect: taken over or marked so."""
        self.counted: list[int] = []
        """The ``seq`` of every head :attr:`heads` counts."""

    def add(self, state: str, rows: Sequence[Sequence[Any]]) -> None:
        """Take window rows ``(message_id, seq, due, is a head this claim may take,
        suspect)``."""
        for message_id, seq, due, head, suspect in rows:
            if not head:  # a processing row is a head here only once its lease ran out
                continue
            if is_claimable(state, due, due, self.now):
                ids = self.suspects if suspect and state == PENDING else self.by_state[state]
                if len(ids) < self.limit:
                    ids.append(message_id)
                    self.order.append((seq, is_suspect(state, bool(suspect))))
                    if ids is not self.suspects:
                        self.counted.append(seq)
            elif self.next_due is None or due < self.next_due:
                self.next_due = due

    def room_after(self, seq: int) -> bool:
        """Could a head numbered past ``seq`` be among the ``limit`` oldest a claim takes
        (fewer than ``limit`` heads, pending suspects left out, are numbered up to it)?
        Else no need to walk further. Asked of the processing rows too once the pending
        ones filled the claim: a dead worker's row behind the first window of others'
        running turns, and older than the pending heads, was never read."""
        return sum(1 for s in self.counted if s <= seq) < self.limit

    def plain_room(self, suspects: int) -> int:
        """How many plain heads a claim of ``limit`` rows takes by the claims' one rule
        (:func:`.inbox_core.pick_heads`: oldest first, at most ``suspects`` of them
        suspect, the suspects it passes over leaving their place to younger heads)."""
        flags = [suspect for _seq, suspect in sorted(self.order)]
        taken, _ = pick_heads(flags, self.limit, suspects)
        return sum(1 for i in taken if not flags[i])

    @property
    def heads(self) -> int:
        """How many heads it holds, pending suspects left out."""
        return sum(len(ids) for ids in self.by_state.values())

    @property
    def ids(self) -> list[str]:
        """The heads found: plain pending ones first, then the processing ones, then the
        pending suspects, each oldest first."""
        return [*(i for state in _DUE for i in self.by_state[state]), *self.suspects]
