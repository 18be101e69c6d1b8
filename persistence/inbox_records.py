"""The values the inbox hands in and out: messages to enqueue, claimed rows, outcomes.

Plain dataclasses, shared by the journal and its set-wise writes, so neither
has to import the other. They are values: nothing assigns to a field once
one is built. The ones every message makes (``NewMessage``,
``EnqueueResult``, ``ClaimedRow``, ``TurnEntry``, ``TurnCommit``) have slots
and are not frozen: a frozen dataclass sets each field through
``object.__setattr__``, a call per field, and those calls were 13% of the
interpreter's instructions per message (callgrind, 523k against 455k
instructions a message on the throughput workload). Unhashable as a
result (``eq`` without ``frozen``): a record used as a key fails loudly.
The rest stay frozen.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import inbox_core as core
from .hot_path import Head

DEFAULT_KIND = "agent_message"
"""A message's kind unless its sender says otherwise."""


@dataclass(slots=True)
class NewMessage:
    """A message to enqueue. ``message_id`` is the idempotency key."""

    message_id: str
    target: str
    content: str
    kind: str = DEFAULT_KIND
    sender: str | None = None
    transport: str = "local"
    destination_peer_id: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    max_attempts: int | None = None


@dataclass(frozen=True)
class Lease:
    """Who leases a row, for how long: ``owner`` for ``seconds`` from the write's time."""

    owner: str
    seconds: float


@dataclass(slots=True)
class EnqueueResult:
    """What ``enqueue`` did: ``created`` is False for an idempotent repeat."""

    message_id: str
    target: str
    status: str
    created: bool
    created_at: float
    claimed: ClaimedRow | None = None
    """The new row, leased in the same transaction (the fast path), when it was its
    target's head and the enqueue asked for a lease."""


@dataclass(slots=True)
class ClaimedRow:
    """A row handed to a worker for delivery."""

    message_id: str
    seq: int
    target: str
    sender: str | None
    kind: str
    content: str
    payload: dict[str, Any]
    attempts: int
    created_at: float
    taken_over: bool = False
    """A suspect row (taken over from a worker that died mid-turn): record the turn's start
    before the brain runs (``Journal.mark_turn_started``), so a turn that kills its process
    is counted, and run it alone (one suspect in flight per runtime)."""

    @classmethod
    def from_head(cls, h: Head) -> ClaimedRow:
        """From an open row as the claims read it."""
        payload = {} if h.payload in (None, "", "{}") else json.loads(h.payload)  # most: none
        return cls(h.message_id, h.seq, h.target_chat_id, h.sender_chat_id, h.kind, h.content,
                   payload, h.attempts, h.created_at, bool(h.suspect))


@dataclass(frozen=True)
class ClaimResult:
    """Rows to deliver, and rows found already delivered by their marker (I6)."""

    rows: list[ClaimedRow]
    acked_by_marker: list[str]
    held_back: bool = False
    """Due suspect rows were left unclaimed because the claim's share of suspects was
    spent (they run one at a time): claim again when the running one is done."""
    next_due: float | None = None
    """PostgreSQL's claims: the earliest due time of a target's head this claim saw
    pending but not yet due (a retry's backoff; a send stamped by a process whose clock
    reads a little ahead): claim again then. None: it saw none, or SQLite's claim (the
    tick finds the rest)."""
    failed: tuple[str, ...] = ()
    """Rows this claim found ``processing`` under a dead owner one time too many and made
    ``failed`` (not claimed): they ended outside any turn, which the actors above may
    have to report (a sub-agent's parent)."""


@dataclass(frozen=True)
class TakenOver:
    """A row a claim took over from a worker that never answered for it, counted as a
    failed attempt: what a reported failure tells, for the actors to announce the same."""

    message_id: str
    attempts: int
    """Its attempts now, this one counted."""
    failed: bool
    """The takeover made it ``failed`` (its attempt limit): not claimed."""
    error: str
    """Its ``last_error`` now."""


@dataclass(frozen=True)
class WindowClaim:
    """A peer link's window claim: the rows leased to it, and the rows it took over
    (counted, not leased: they wait out their backoff, or failed)."""

    rows: list[ClaimedRow]
    taken_over: tuple[TakenOver, ...] = ()


@dataclass(slots=True)
class TurnEntry:
    """A transcript entry a turn commits."""

    role: str
    text: str
    visible: bool = True
    message_id: str | None = None
    sender_id: str | None = None
    """Who sent the message this entry records (None: the user, the runtime, a reply)."""
    kind: str | None = None
    """The kind of that message (``agent_message``, ``subagent_result``...)."""


@dataclass(frozen=True)
class FenceRow:
    """What fencing and retries read of a row."""

    message_id: str
    status: str
    lease_owner: str | None
    attempts: int
    max_attempts: int
    transport: str


@dataclass(slots=True)
class TurnCommit:
    """A plain successful turn to commit: entries, markers, acks, maybe the next lease."""

    owner: str
    session_id: str
    message_ids: list[str]
    entries: Sequence[TurnEntry]
    now: float
    next_lease: float | None


def insert_params(msg: NewMessage, now: float, lease: Lease | None = None) -> tuple[Any, ...]:
    """A new row's values for ``BulkSql.insert_inbox`` (all but ``seq``): pending, or
    with ``lease`` already processing, leased to its owner from ``now``."""
    policy = core.policy_for(msg.transport)
    status, owner, until = ((core.PENDING, None, None) if lease is None else
                            (core.PROCESSING, lease.owner, now + lease.seconds))
    return (msg.message_id, msg.transport, msg.destination_peer_id, msg.sender, msg.target,
            msg.kind, msg.content, stored_payload(msg.payload),
            msg.max_attempts or policy.max_attempts, now, now, now, status, owner, until)


stored_payload = core.stored_payload
"""A payload as the inbox stores it (and ``ClaimedRow.from_head`` reads it back)."""


def fingerprint(msg: NewMessage) -> core.Fingerprint:
    """What the idempotence rule compares of ``msg`` (``inbox_core.enqueue_decision``)."""
    return core.Fingerprint(msg.target, msg.kind, msg.content, msg.sender,
                            stored_payload(msg.payload))


def leased_new_row(msg: NewMessage, seq: int, now: float) -> ClaimedRow:
    """The row an enqueue inserted already leased, as a claim would have read it."""
    payload = json.loads(stored_payload(msg.payload)) if msg.payload else {}
    return ClaimedRow(msg.message_id, seq, msg.target, msg.sender, msg.kind, msg.content,
                      payload, 0, now)


def entry_row(session_id: str, entry: TurnEntry, now: float) -> tuple[Any, ...]:
    """A transcript entry's values for ``BulkSql.insert_entries``."""
    return (session_id, entry.role, entry.text, entry.visible, entry.message_id,
            entry.sender_id, entry.kind, now)
