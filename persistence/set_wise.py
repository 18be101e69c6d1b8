"""Set-wise enqueues and turn commits: the two writes every message makes, done in bulk.

Under load the writer drains tens of enqueues and turn commits per batch.
Run one by one, each costs a handful of statements (and the savepoint
around it); run as a set, a batch of them costs about as many statements
as one (see :mod:`.bulk_sql`). Updates of many rows carry the batch's
latest time (``delivered_at``, ``updated_at``, lease expiry): the batch
commits after all of its members asked, so no stamp is early.

These functions are the ``many`` side of the writer's :class:`~.writer.Bulk`
kinds: they handle the common case and raise :class:`OneByOne` for anything
unusual (an idempotent repeat, a lost lease, a head whose turn already
committed), so the writer undoes their work (back to their savepoint, or by
beginning the transaction again) and runs the items through the ordinary
one-at-a-time path, which applies every rule and gives each caller its own
answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from . import inbox_core as core
from .bulk_sql import BulkSql
from .hot_path import Head
from .inbox_records import (
    ClaimedRow,
    EnqueueResult,
    Lease,
    NewMessage,
    TurnCommit,
    entry_row,
    insert_params,
    leased_new_row,
)
from .peer_outbox import NEW_ROW_LOCK
from .peers import PEER_TRANSPORT
from .pg_commits import PgTurnSql


class OneByOne(Exception):
    """The set-wise path does not handle this batch; run its items one at a time."""


Enqueue = tuple[NewMessage, float, Lease | None]
"""An enqueue: the message, the time, and the lease to take if it is its target's head."""


def enqueue_all(sql: BulkSql, items: Sequence[Enqueue]) -> list[EnqueueResult]:
    """Insert new messages in one statement; any repeated id sends the batch one by one."""
    ids = [msg.message_id for msg, _, _ in items]
    if len(set(ids)) < len(ids):
        raise OneByOne("an id repeated in the batch")
    return insert_new(sql, items)


def insert_new(sql: BulkSql, items: Sequence[Enqueue]) -> list[EnqueueResult]:
    """Insert new messages, each new head that asked for a lease already leased (the fast
    path: :func:`heads_to_lease`). A row not written (its id has one already) raises
    :class:`OneByOne`: the caller runs the idempotence rule."""
    # The fast path is SQLite's.
    asking = sorted({msg.target for msg, _, lease in items
                     if _asks_fast_path(msg, lease)}) if not sql.postgres else []
    first, leases = None, {}
    if asking:
        first, busy = sql.next_seq(asking)
        leases = heads_to_lease(items, busy)
    if sql.postgres:  # a device's rows commit in the order its link's claims see them
        for device in sorted({msg.target for msg, _, _ in items
                              if msg.transport == PEER_TRANSPORT}):
            sql.db.execute_sql(NEW_ROW_LOCK, (device,))
    written, first = sql.insert_inbox([insert_params(msg, now, leases.get(msg.message_id))
                                       for msg, now, _ in items], first)
    sql.sent_until = max(sql.sent_until, max(now for _, now, _ in items))
    if written < len(items):
        raise OneByOne("an idempotent repeat of an earlier message")
    claimed: dict[str, ClaimedRow] = {}
    if leases:
        assert first is not None  # SQLite's numbering
        claimed = {msg.message_id: leased_new_row(msg, first + i, now)
                   for i, (msg, now, _) in enumerate(items) if msg.message_id in leases}
    pending = core.PENDING
    return [EnqueueResult(msg.message_id, msg.target, pending, True, now,
                          claimed.get(msg.message_id)) for msg, now, _ in items]


def heads_to_lease(items: Sequence[Enqueue], busy: set[str]) -> dict[str, Lease]:
    """The fast path: which new rows to insert already leased (message id -> its lease):
    each that asked for a lease and will be its target's head (its target is not in
    ``busy``, those with an open row, and it comes first of the batch's rows for it), so it
    goes straight to its session without a claim or a second write.

    SQLite only, and only for a process that provably owns every target it leases: the
    caller's business (an exclusive SQLite runtime; write transactions there are serial
    across processes, so ``busy``, read in this transaction, stays true until the commit).
    PostgreSQL rows always go through a claim."""
    busy = set(busy)
    leases: dict[str, Lease] = {}
    for msg, _, lease in items:  # in order: a target's first new row is its head
        if msg.target not in busy:
            busy.add(msg.target)
            if lease is not None and _asks_fast_path(msg, lease):
                leases[msg.message_id] = lease
    return leases


def _asks_fast_path(msg: NewMessage, lease: Lease | None) -> bool:
    """The enqueue asked for a lease, and its row is one a session's turn delivers (a peer
    row's link sends it)."""
    return lease is not None and msg.transport == "local"


Release = tuple[str, list[str], float]
"""A release: the owner, the rows it hands back unrun, the time."""


def release_all(sql: BulkSql, items: Sequence[Release]) -> list[None]:
    """Hand back every item's rows in one statement per owner, fenced by the update's
    condition (processing, leased by that owner); any row short sends the batch one by
    one, where its release gets ``LeaseLost`` and the others go through."""
    ids = [mid for _, group, _ in items for mid in group]
    if len(set(ids)) < len(ids):
        raise OneByOne("a row appears twice in the batch")
    now = max(t for _, _, t in items)
    _fenced_by_owner([(owner, group) for owner, group, _ in items],
                     lambda group, owner: sql.hot.release_fenced(group, owner, now),
                     "a release lost a lease")
    sql.announce()  # other processes may claim them now
    return [None] * len(items)


def _ack_fenced(sql: BulkSql, commits: Sequence[TurnCommit], now: float) -> None:
    """Acknowledge every commit's rows where its owner holds their lease (the fence of
    ``inbox_core.check_lease`` as the update's condition); any row short sends the batch
    one by one, where its commit gets ``LeaseLost`` and the others commit."""
    _fenced_by_owner([(c.owner, c.message_ids) for c in commits],
                     lambda ids, owner: sql.hot.deliver_fenced(ids, owner, now),
                     "a commit lost a lease")


def _fenced_by_owner(groups: Sequence[tuple[str, Sequence[str]]],
                     update: Callable[[list[str], str], int], lost: str) -> None:
    """Run a fenced ``update(ids, owner)`` once per owner over its rows; a row it did not
    change (a lease that owner lost) sends the batch one by one (``OneByOne(lost)``)."""
    by_owner: dict[str, list[str]] = {}
    for owner, ids in groups:
        by_owner.setdefault(owner, []).extend(ids)
    for owner, ids in by_owner.items():
        if update(ids, owner) < len(ids):
            raise OneByOne(lost)


def _next_heads(sql: BulkSql, commits: Sequence[TurnCommit], now: float) -> dict[str, ClaimedRow]:
    """SQLite: lease each chaining session's next head when it may chain (due at its
    commit's ``BulkSql.chain_time``, pending, not suspect: ``inbox_core.chains``), in one
    statement per (owner, lease length); session -> leased row. A leased head that
    already has a committed turn undoes the lot (:class:`OneByOne`). PostgreSQL's are in
    :func:`_commit_all_pg`."""
    chaining = [c for c in commits if c.next_lease is not None]
    if not chaining:
        return {}
    by_lease: dict[tuple[str, float], list[TurnCommit]] = {}
    for c in chaining:
        by_lease.setdefault((c.owner, c.next_lease or 0.0), []).append(c)
    taken: dict[str, ClaimedRow] = {}
    for (owner, lease), group in by_lease.items():
        heads, committed = sql.lease_heads(
            [(c.session_id, sql.chain_time(c.now)) for c in group], owner, now + lease, now)
        if committed:
            raise OneByOne("a head's turn has already committed")
        for c in group:
            head = heads.get(c.session_id)
            if head is None:
                continue
            # The statement leased only what the rule allows; should the two ever drift
            # apart, go one by one rather than chain into a row the rule refuses. (The
            # row was pending: the statement's condition; its lease is the new one.)
            if not _due(head._replace(status=core.PENDING), sql.chain_time(c.now)):
                raise OneByOne("a head leased that its commit may not chain into")
            taken[c.session_id] = ClaimedRow.from_head(head)
    return taken


def _due(head: Head, now: float) -> bool:
    """The head may be leased in a write's transaction (``inbox_core.chains``)."""
    return core.chains(head.status, head.available_at, head.lease_until, now, bool(head.suspect))


def commit_all(sql: BulkSql, commits: Sequence[TurnCommit]) -> list[ClaimedRow | None]:
    """Commit plain turns together: fence, entries, markers, acks, next leases.

    Same writes and answers as committing each on its own (times aside, see
    above); a session appearing twice, or a fence that fails, sends the
    batch one by one.
    """
    ids = [mid for c in commits for mid in c.message_ids]
    sessions = {c.session_id for c in commits}
    if len(set(ids)) < len(ids) or len(sessions) < len(commits):
        raise OneByOne("a message or a session appears twice in the batch")
    now = max(c.now for c in commits)
    if sql.pg_turns is not None:
        if len({c.owner for c in commits}) > 1:  # one runtime's writer: one owner, always
            raise OneByOne("commits of several owners in one PostgreSQL batch")
        return _commit_all_pg(sql.pg_turns, commits, now, sql.chain_time)
    _ack_fenced(sql, commits, now)
    sql.insert_entries([entry_row(c.session_id, e, c.now) for c in commits for e in c.entries])
    sql.insert_markers([(c.session_id, mid, c.now) for c in commits for mid in c.message_ids])
    following = _next_heads(sql, commits, now)
    return [following.get(c.session_id) for c in commits]


def _commit_all_pg(pg: PgTurnSql, commits: Sequence[TurnCommit], now: float,
                   chain_time: Callable[[float], float]) -> list[ClaimedRow | None]:
    """``commit_all`` on PostgreSQL for one owner's commits: the same writes and answers in
    one statement (see :mod:`.pg_commits`)."""
    chaining = [c for c in commits if c.next_lease is not None]
    lengths = {c.next_lease for c in chaining}
    if len(lengths) > 1:
        raise OneByOne("chaining commits with different lease lengths")
    out = pg.commit_batch(
        commits[0].owner, [mid for c in commits for mid in c.message_ids],
        [entry_row(c.session_id, e, c.now) for c in commits for e in c.entries],
        [(c.session_id, mid, c.now) for c in commits for mid in c.message_ids],
        [(c.session_id, chain_time(c.now)) for c in chaining],
        now + (lengths.pop() if lengths else 0.0),
        now)
    if out.acked < sum(len(c.message_ids) for c in commits):
        raise OneByOne("a commit lost a lease")
    if out.committed_heads:
        raise OneByOne("a head's turn has already committed")
    return [ClaimedRow.from_head(out.leased[c.session_id]) if c.session_id in out.leased
            else None for c in commits]
