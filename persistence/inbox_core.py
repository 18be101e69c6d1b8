"""The inbox state machine, retry policy, fencing and idempotency rules (I2-I6).

Pure: no database, threads or clock. Times come in as arguments (epoch
seconds), so a 37-hour peer retry schedule is tested in microseconds.

States and legal transitions (anything else raises ``IllegalTransition``)::

    pending    --claim-->   processing
    processing --claim-->   processing   (lease expired: another worker takes over)
    processing --ack-->     delivered    (terminal)
    processing --retry-->   pending      (after backoff)
    processing --fail-->    failed       (terminal until an operator requeues)
    processing --release--> pending      (handed back unrun, no attempt counted)
    failed     --requeue--> pending      (attempts reset, history kept)
    pending    --cancel-->  cancelled    (an operator gives up on it; terminal)
    failed     --cancel-->  cancelled
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from .errors import IdempotencyConflict, IllegalTransition, LeaseLost


class State(StrEnum):
    """Where an inbox row is in its life."""

    PENDING = "pending"
    PROCESSING = "processing"
    DELIVERED = "delivered"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Event(StrEnum):
    """What can happen to an inbox row."""

    CLAIM = "claim"
    ACK = "ack"
    RETRY = "retry"
    FAIL = "fail"
    RELEASE = "release"
    REQUEUE = "requeue"
    CANCEL = "cancel"


TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.PENDING, Event.CLAIM): State.PROCESSING,
    (State.PROCESSING, Event.CLAIM): State.PROCESSING,
    (State.PROCESSING, Event.ACK): State.DELIVERED,
    (State.PROCESSING, Event.RETRY): State.PENDING,
    (State.PROCESSING, Event.FAIL): State.FAILED,
    (State.PROCESSING, Event.RELEASE): State.PENDING,
    (State.FAILED, Event.REQUEUE): State.PENDING,
    (State.PENDING, Event.CANCEL): State.CANCELLED,
    (State.FAILED, Event.CANCEL): State.CANCELLED,
}

PENDING, PROCESSING, DELIVERED, FAILED, CANCELLED = (
    State.PENDING.value,
    State.PROCESSING.value,
    State.DELIVERED.value,
    State.FAILED.value,
    State.CANCELLED.value,
)
"""The states as the rows store them (plain strings): what the hot path compares and
writes, without the enum's ``value`` property (a Python call) per use."""

OPEN_STATES = (PENDING, PROCESSING)
"""States of rows that still wait for delivery."""

TERMINAL_STATES = (DELIVERED, FAILED, CANCELLED)


def transition(message_id: str, state: State | str, event: Event) -> State:
    """Return the state after ``event``; raise :class:`IllegalTransition` if not allowed."""
    current = State(state)
    try:
        return TRANSITIONS[(current, event)]
    except KeyError:
        raise IllegalTransition(message_id, current.value, event.value) from None


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a transport retries.

    ``cap``: the longest delay between attempts, in seconds.
    ``max_attempts``: the failed attempt with this number makes the row ``failed``.
    """

    cap: float
    max_attempts: int


LOCAL = RetryPolicy(cap=60.0, max_attempts=5)
"""Local deliveries: 2, 4, 8, 16 s, then failed at the 5th failed attempt."""

PEER = RetryPolicy(cap=3600.0, max_attempts=48)
"""Outbound peer rows: 2, 4, ... 2048 s, then 3600 s, failed at the 48th."""

TRANSPORT_POLICIES = {"local": LOCAL, "suzent_peer": PEER}


def policy_for(transport: str) -> RetryPolicy:
    """The retry policy of a row of ``transport`` (an unknown one retries as a local row)."""
    return TRANSPORT_POLICIES.get(transport, LOCAL)


def backoff_delay(attempts: int, cap: float) -> float:
    """Seconds to wait after the failed attempt numbered ``attempts`` (1-based)."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    # 2**attempts overflows float range long before it matters; clamp the exponent.
    return float(min(cap, 2.0 ** min(attempts, 64)))


def retry_horizon(policy: RetryPolicy) -> float:
    """Seconds from a row's first attempt to its last under ``policy``: the sum of the
    backoffs between its ``max_attempts`` attempts (the attempts' own durations, and any
    time its process was down, come on top)."""
    return sum(backoff_delay(k, policy.cap) for k in range(1, policy.max_attempts))


@dataclass(frozen=True)
class FailureOutcome:
    """What a failed attempt does to its row."""

    state: State
    attempts: int
    available_at: float


def after_failure(
    attempts_before: int,
    max_attempts: int,
    cap: float,
    now: float,
    *,
    permanent: bool = False,
    retry_after: float | None = None,
) -> FailureOutcome:
    """Decide retry-with-backoff or ``failed`` for a row whose attempt just failed.

    ``permanent`` marks errors that cannot heal (revoked device, rejected
    payload, a brain's ``PermanentFailure``): they fail at once whatever the
    attempt count. ``retry_after`` (seconds, already capped by its caller) is
    the least wait a failure asked for (a brain's ``RetryLater``): the retry
    waits the longer of it and the backoff; the attempt still counts.
    """
    attempts = attempts_before + 1
    if permanent or attempts >= max_attempts:
        return FailureOutcome(State.FAILED, attempts, now)
    delay = backoff_delay(attempts, cap)
    if retry_after is not None and retry_after > delay:
        delay = retry_after
    return FailureOutcome(State.PENDING, attempts, now + delay)


def after_unrecorded_failure(attempts_before: int, cap: float, now: float) -> float:
    """When a row whose failed attempt could not be recorded (the database refused the
    record) is due again, handed back uncounted: after the backoff that attempt would
    have cost. Due at once, its next claim ran its brain again straight away, for as long
    as the record was refused."""
    return now + backoff_delay(attempts_before + 1, cap)


ERROR_LIMIT = 8000
"""Characters of an attempt's error (a traceback) a row keeps."""


def clip_error(text: str, limit: int = ERROR_LIMIT) -> str:
    """``text`` within ``limit`` characters, keeping its start and, above all, its end
    (a traceback ends with the exception and the frame that raised it)."""
    if len(text) <= limit:
        return text
    marker = "\n[... traceback clipped ...]\n"
    head = limit // 8
    return text[:head] + marker + text[-(limit - head - len(marker)) :]


def after_interrupted_turn(attempts_before: int, max_attempts: int, now: float) -> FailureOutcome:
    """A claim takes over a row whose lease ran out with no commit after its turn had
    started (the process died, or was paused past its lease, inside the turn). That counts
    as an attempt, so a message whose turn kills its process ends ``failed`` after
    ``max_attempts`` such crashes instead of being claimed again on every restart for ever.
    A takeover of a row whose turn never started (killed between claim and brain) counts
    nothing. ``PROCESSING`` means: claim it for this attempt (``available_at`` unused)."""
    attempts = attempts_before + 1
    if attempts >= max_attempts:
        return FailureOutcome(State.FAILED, attempts, now)
    return FailureOutcome(State.PROCESSING, attempts, now)


@dataclass(frozen=True)
class Takeover:
    """The failed attempt a claim counts for a row it took over from a worker that never
    answered for it: the row's outcome and its ``last_error``."""

    outcome: FailureOutcome
    error: str

    @property
    def failed(self) -> bool:
        """It reached its attempt limit: ``failed``, not claimed."""
        return self.outcome.state is State.FAILED

    @property
    def event(self) -> Event:
        """Its transition (from ``processing``)."""
        if self.failed:
            return Event.FAIL
        return Event.CLAIM if self.outcome.state is State.PROCESSING else Event.RETRY

    @property
    def history(self) -> str:
        """The history event it records (one the failed-attempt counts read)."""
        return "failed" if self.failed else "interrupted"


def after_takeover(
    attempts_before: int,
    max_attempts: int,
    owner: str | None,
    now: float,
    *,
    cap: float,
    runs_now: bool,
) -> Takeover:
    """A takeover's failed attempt, for both kinds of claim that make one.

    ``runs_now``: the claim runs the row itself at once, under its new lease (the
    dispatcher's, of a turn that was interrupted: :func:`after_interrupted_turn`). Else
    the row goes back to wait out its transport's backoff (``cap``) and is sent alone
    later (a peer link's, of a row a dead link never answered for: :func:`after_failure`).
    Either way a row whose handling kills its process every time ends ``failed``."""
    if runs_now:
        out = after_interrupted_turn(attempts_before, max_attempts, now)
        return Takeover(out, interrupted_error(out.attempts, max_attempts, owner))
    out = after_failure(attempts_before, max_attempts, cap, now)
    return Takeover(out, taken_over_error(out.attempts, max_attempts, owner))


def interrupted_error(attempts: int, max_attempts: int, owner: str | None) -> str:
    """``last_error`` of a row whose turns never finished ``attempts`` times."""
    return (
        f"Interrupted: the turn of this message never finished {attempts} time(s) "
        f"(last held by {owner or 'an unknown worker'}: the process died or lost its "
        f"lease mid-turn); attempt {attempts} of {max_attempts}. A message whose turn "
        "kills its process is a poison message: fix the brain, then requeue it."
    )


def taken_over_error(attempts: int, max_attempts: int, owner: str | None) -> str:
    """``last_error`` of an outbound peer row taken over from a link that never answered for
    it: its lease ran out while the row was being sent (its process died, or stalled past
    the lease). Counted as a failed attempt (:func:`after_failure`, the transport's backoff),
    so a row whose sending kills its process every time ends ``failed``."""
    return (
        f"Taken over: its sender ({owner or 'an unknown worker'}) died or stalled past "
        f"its lease while sending it, before the peer answered; attempt {attempts} of "
        f"{max_attempts}. A row taken over at every attempt kills the process that sends "
        "it (a poison message): find out why, then requeue it."
    )


def check_lease(message_id: str, state: str, lease_owner: str | None, worker: str) -> None:
    """Fencing: raise :class:`LeaseLost` unless ``worker`` holds the row's lease.

    A lease that expired but that nobody re-claimed still belongs to its
    worker: no one else can have run the message in between.
    """
    if state != PROCESSING or lease_owner != worker:
        raise LeaseLost(message_id, worker)


def is_claimable(state: str, available_at: float, lease_until: float | None, now: float) -> bool:
    """A head-of-queue row can be claimed when pending and due, or when its lease expired."""
    if state == PENDING:
        return available_at <= now
    if state == PROCESSING:
        return lease_until is None or lease_until <= now
    return False


def chains(
    state: str, available_at: float, lease_until: float | None, now: float, suspect: bool = False
) -> bool:
    """A session's next head may be leased in its turn's commit (chained delivery): only a
    due pending row that is not suspect; a dead worker's row (expired lease) and a suspect
    one go through the dispatcher's claim, which counts attempts and runs suspects alone."""
    return state == PENDING and not suspect and is_claimable(state, available_at, lease_until, now)


def is_suspect(state: str, suspect: bool) -> bool:
    """A head that may be the message that kills its process: one taken over now (its
    lease ran out mid-turn) or earlier (and not delivered since)."""
    return suspect or state == PROCESSING


def pick_heads(suspect: Iterable[bool], limit: int, suspects: int) -> tuple[list[int], bool]:
    """Which of a claim's candidate heads, oldest first (each flagged :func:`is_suspect`),
    it takes: up to ``limit``, at most ``suspects`` of them suspect (they run alone; the
    ones passed over leave their place to younger heads). Their positions, and whether a
    suspect was held back. The one rule of every claim, SQLite's and PostgreSQL's."""
    taken: list[int] = []
    held_back = False
    for i, flagged in enumerate(suspect):
        if len(taken) == limit:
            break
        if flagged:
            if suspects <= 0:
                held_back = True
                continue
            suspects -= 1
        taken.append(i)
    return taken, held_back


def stored_payload(payload: Mapping[str, Any]) -> str:
    """A payload as the inbox stores it: JSON, keys sorted (so a payload is one text
    whatever the order its keys were built in), ``{}`` for none."""
    return json.dumps(payload, sort_keys=True) if payload else "{}"


@dataclass(frozen=True)
class Fingerprint:
    """What makes two enqueues of the same id the same message: all a sender says in it.

    ``payload`` is the payload as stored (:func:`stored_payload`); a row's text written
    otherwise (its keys in another order, other spacing) is compared in that form."""

    target: str
    kind: str
    content: str
    sender: str | None
    payload: str


def enqueue_decision(message_id: str, existing: Fingerprint | None, new: Fingerprint) -> bool:
    """Return True when a row must be created, False for an idempotent repeat.

    Raises :class:`IdempotencyConflict` when the id exists as another message: another
    target, kind, content, sender or payload. A retry that differs in any of them is not
    the same message, and taking it for one would drop what differs without a word.
    """
    if existing is None:
        return True
    if existing != new and _as_stored(existing) != _as_stored(new):
        raise IdempotencyConflict(message_id)
    return False


def _as_stored(fp: Fingerprint) -> Fingerprint:
    """``fp`` with its payload text in :func:`stored_payload`'s form (a row written
    otherwise, by an older version, compares by its data)."""
    try:
        data = json.loads(fp.payload) if fp.payload else {}
    except ValueError:
        return fp  # not JSON: only the same text is the same payload
    return replace(fp, payload=stored_payload(data)) if isinstance(data, dict) else fp
