"""Family messaging (F1-F7): list the roster, send by role, broadcast to all.

The rules live in :mod:`.roster` (who is family, how a name resolves) and
:mod:`.rate_limit` (the token bucket); this module applies them and sends
through the durable inbox like ``agent_send`` (F7), so a restart between
send and delivery loses nothing. The sender is always the calling session:
there is no ``from`` argument (F5).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, TypeVar

from ..persistence import (
    OPEN_TASK_STATES,
    BucketState,
    NewMessage,
    RateBuckets,
    SessionRecord,
    WriterClosed,
)
from . import access, rate_limit, roster
from .context import RuntimeContext
from .errors import ToolError
from .outbox import Writes
from .validation import require_message, require_str

FAMILY_LIMIT = 16_384
"""Longest family message, in characters."""
PENDING_LIMIT = 20
"""Most pending messages (waiting, not being delivered) a target may have before family
sends are refused (F6)."""
FAMILY_KIND = "family_message"
BROADCAST_TEXT = "receiver_role (the text to broadcast with message='all')"
"""How an error names the text of ``send("all", text)``, which is in ``receiver_role``."""

T = TypeVar("T")


class Buckets:
    """The family token buckets (F6) of every runtime on this database: the rule is
    :mod:`.rate_limit`'s, the state is the journal's (``RateBuckets``), so a pair has one
    bucket however many processes its sender's turns run in."""

    def __init__(self, store: RateBuckets) -> None:
        self._store = store

    def take(self, pair: tuple[str, str], now: float) -> float:
        """Take a token; return 0 if allowed, else the seconds until one is back."""
        def rule(state: BucketState | None) -> tuple[BucketState, float]:
            bucket, wait = rate_limit.take(_bucket(state), now)
            return (bucket.tokens, bucket.updated_at), wait
        return self._store.change(*pair, rule)

    def refund(self, pair: tuple[str, str]) -> None:
        """Give back the token of a send that failed after taking it (without waiting:
        an attempt may be discarded on the event loop)."""
        def rule(state: BucketState | None) -> tuple[BucketState | None, None]:
            if state is None:
                return None, None
            bucket = rate_limit.refund(rate_limit.Bucket(*state))
            return (bucket.tokens, bucket.updated_at), None
        try:
            self._store.change_later(*pair, rule)
        except WriterClosed:
            pass  # the runtime stopped: the token comes back by itself within a second

    def tokens(self, pair: tuple[str, str]) -> float | None:
        """The pair's tokens as last counted (None: no send yet), for operators and tests."""
        state = self._store.state(*pair)
        return None if state is None else state[0]


def _bucket(state: BucketState | None) -> rate_limit.Bucket | None:
    return None if state is None else rate_limit.Bucket(*state)


def iso(ts: float) -> str:
    """An epoch time as an ISO 8601 UTC string."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


def subject(s: SessionRecord) -> access.Subject:
    """The authorization rules' view of a session."""
    return access.Subject(s.id, s.project_id, s.kind, s.platform)


def member(s: SessionRecord) -> roster.Member:
    """The roster rules' view of a session."""
    worker = s.config.get("worker")
    return roster.Member(s.id, s.title, s.parent_id, str(worker) if worker else None, s.status,
                         access.is_hidden(subject(s)))


class FamilyTools:
    """``list_agents``, ``send`` and ``broadcast`` for the calling session."""

    # Provided by the tool class this mixes into (TaskTools).
    _ctx: RuntimeContext
    _caller: Callable[[], SessionRecord]
    _writes: Writes

    def _family(self) -> tuple[SessionRecord, list[roster.Entry], list[SessionRecord]]:
        caller = self._caller()
        # Kinship never crosses the project boundary (S2): sessions Focal dispatched
        # into different projects share a parent, yet must not reach each other.
        me = subject(caller)
        stored = self._ctx.store.family(
            caller, roots="workers" if roster.shares_a_worker(member(caller)) else "none")
        known = {s.id for s in stored}
        new = [s for s in self._writes.children_of(caller.id) if s.id not in known]
        related = [s for s in [*stored, *new]
                   if access.can_reach(me, subject(s), allow_self=True)]
        return caller, roster.roster(member(caller), [member(s) for s in related]), related

    def list_agents(self) -> dict[str, Any]:
        """The roster: parent, siblings by name, children by name; active or not."""
        _, entries, _ = self._family()
        return {"agents": [e.to_dict() for e in entries]}

    def send(self, message: Any, receiver_role: Any = None,
             receiver_name: Any = None) -> dict[str, Any]:
        """Send to one family member, or ``send("all", message)`` to the whole roster."""
        if message == "all" and isinstance(receiver_role, str) \
                and receiver_role not in roster.ROLES and receiver_name is None:
            # The text is in receiver_role: its errors name that argument, not ``message``.
            return self.broadcast(require_message(receiver_role, FAMILY_LIMIT,
                                                  name=BROADCAST_TEXT))
        if not isinstance(receiver_role, str):
            raise ToolError("invalid_argument",
                            "receiver_role must be 'parent', 'sibling' or 'child'.")
        if receiver_name is not None:
            # Storable text, as every id a tool looks up: a name may reach a query (the
            # out-of-reach look), where a lone surrogate or (on PostgreSQL) a NUL failed
            # in the driver, and the tool raised a database error, not a ToolError.
            require_str("receiver_name", receiver_name)
        text = require_message(message, FAMILY_LIMIT)
        caller, entries, related = self._family()
        try:
            entry = roster.resolve(entries, receiver_role, receiver_name)
        except roster.ResolveError as exc:
            missing = exc.reason in (roster.Unresolved.NO_MATCH, roster.Unresolved.NO_PARENT)
            key = receiver_name.strip() if receiver_name else ""
            # A relative the roster holds under another role is in reach (the error says
            # which role); only a name beyond the roster is "out of reach".
            if key and missing and not roster.named(entries, key) and self._beyond_reach(
                    caller, related, key):
                raise ToolError("not_found", roster.REACH_ERROR) from exc
            code = "not_found" if missing else "invalid_argument"
            raise ToolError(code, f"{exc}.") from exc
        return self._writes.together(lambda writes: self._deliver(caller, entry, text, writes))

    def _beyond_reach(self, caller: SessionRecord, related: list[SessionRecord],
                      name: str) -> bool:
        """Does ``name`` designate a relative farther than the roster (a grandchild, cousin)?"""
        pool = (self._ctx.store.sessions_named(caller.project_id, name,
                                               hide=access.HIDDEN_KINDS)
                if caller.project_id is not None else related)
        # Hidden sessions are never named: "out of reach" would tell that one exists (S3).
        return any(roster.designates(name, s.title, s.id) for s in pool
                   if s.id != caller.id and not access.is_hidden(subject(s)))

    def broadcast(self, message: Any) -> dict[str, Any]:
        """Send to everyone on the roster; a refused target does not cancel the others.

        A target the rules refuse (the rate or pending limit, a closed parent's child)
        gets ``{target, error}`` and costs nothing. The sends let through are one write
        (:meth:`.outbox.Writes.together`): all of them land, or none, and a database
        error on the way (a read, a bucket, the commit) raises with nothing sent and
        nothing taken. Not per-target database results: a caller told "root and alice
        have it, carl not" must retry carl alone, and a target whose row may or may not
        have landed could not be reported truthfully; with one write, the answer is the
        receipts, or an error after which the same broadcast again sends each target its
        message once.
        """
        text = require_message(message, FAMILY_LIMIT)
        caller, entries, _ = self._family()

        def build(writes: Writes) -> dict[str, Any]:
            receipts: list[dict[str, Any]] = []
            for entry in entries:
                try:
                    receipts.append(self._deliver(caller, entry, text, writes))
                except ToolError as exc:
                    receipts.append({"target": entry.id, "error": exc.message})
            return {"receipts": receipts}
        return self._writes.together(build)

    def _parent_closed(self, caller: SessionRecord) -> bool:
        tasks = self._writes.tasks_of(caller.id)  # a task it closed in this turn counts
        return bool(tasks) and not any(t.status in OPEN_TASK_STATES for t in tasks)

    def _deliver(self, caller: SessionRecord, entry: roster.Entry, text: str,
                 writes: Writes) -> dict[str, Any]:
        ctx = self._ctx
        if entry.relationship == "child" and self._parent_closed(caller):
            raise ToolError("execution_failed",
                            f"Child '{entry.id}' is no longer reachable: children are reachable "
                            "only until their parent session closes, and this one has.")
        # Counted from here until its row is durable (or never will be), so that sends
        # of turns running at once cannot all take the last place (F6).
        queued = ctx.queued_sends
        if not queued.reserve(entry.id, PENDING_LIMIT,
                              lambda: ctx.journal.pending_count(entry.id)):
            raise ToolError("execution_failed",
                            f"Pending limit: '{entry.id}' already has {PENDING_LIMIT} messages "
                            "waiting; wait until it catches up.")
        pair = (caller.id, entry.id)
        try:
            wait = ctx.buckets.take(pair, ctx.now())
        except BaseException:
            queued.release(entry.id)
            raise
        if wait > 0:
            queued.release(entry.id)
            told = rate_limit.told_wait(wait)
            raise ToolError("execution_failed",
                            f"Rate limit: at most 3 messages in a burst to '{entry.id}', one more "
                            f"each second; retry in {told:.1f}s.", retry_after=told)
        busy = ctx.turns.is_running(entry.id) or entry.status == "active"
        now = ctx.now()
        try:
            [result] = writes.send([NewMessage(
                f"fam-{ctx.new_id()}", entry.id, text, kind=FAMILY_KIND, sender=caller.id,
                payload={"relationship": entry.relationship, "sender_name": caller.title})],
                after=lambda: queued.release(entry.id))
        except BaseException:
            queued.release(entry.id)
            ctx.buckets.refund(pair)
            raise

        def dropped() -> None:  # the write (the turn's commit, or the call's) never landed
            queued.release(entry.id)
            ctx.buckets.refund(pair)
        writes.on_discard(dropped)
        if busy:
            return {"id": result.message_id, "target": entry.id, "deliveryStatus": "queued",
                    "queuedAt": iso(now)}
        return {"id": result.message_id, "target": entry.id, "deliveryStatus": "delivered",
                "deliveredAt": iso(now)}
