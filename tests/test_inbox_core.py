"""The pure inbox rules: transitions, backoff, failure outcomes, fencing, idempotency."""

from __future__ import annotations

import itertools

import pytest

from kinbox.persistence import IdempotencyConflict, IllegalTransition, LeaseLost
from kinbox.persistence.inbox_core import (
    LOCAL,
    PEER,
    TRANSITIONS,
    Event,
    Fingerprint,
    RetryPolicy,
    State,
    after_failure,
    after_takeover,
    backoff_delay,
    check_lease,
    enqueue_decision,
    is_claimable,
    pick_heads,
    stored_payload,
    transition,
)

LEGAL = [
    (State.PENDING, Event.CLAIM, State.PROCESSING),
    (State.PROCESSING, Event.CLAIM, State.PROCESSING),
    (State.PROCESSING, Event.ACK, State.DELIVERED),
    (State.PROCESSING, Event.RETRY, State.PENDING),
    (State.PROCESSING, Event.FAIL, State.FAILED),
    (State.PROCESSING, Event.RELEASE, State.PENDING),
    (State.FAILED, Event.REQUEUE, State.PENDING),
    (State.PENDING, Event.CANCEL, State.CANCELLED),
    (State.FAILED, Event.CANCEL, State.CANCELLED),
]


@pytest.mark.parametrize(("state", "event", "after"), LEGAL)
def test_every_legal_transition_reaches_its_state(state: State, event: Event,
                                                   after: State) -> None:
    assert transition("m", state, event) is after


def test_the_legal_table_is_exactly_the_documented_one() -> None:
    assert {(s, e): a for s, e, a in LEGAL} == TRANSITIONS


ILLEGAL = [(s, e) for s, e in itertools.product(State, Event) if (s, e) not in TRANSITIONS]


@pytest.mark.parametrize(("state", "event"), ILLEGAL)
def test_illegal_transitions_raise_with_the_state_and_event(state: State, event: Event) -> None:
    with pytest.raises(IllegalTransition) as info:
        transition("m-1", state, event)
    assert info.value.current == state.value
    assert info.value.event == event.value
    assert "m-1" in str(info.value)


@pytest.mark.parametrize("terminal", [State.DELIVERED, State.CANCELLED])
def test_delivered_and_cancelled_are_terminal_for_every_event(terminal: State) -> None:
    for event in Event:
        with pytest.raises(IllegalTransition):
            transition("m", terminal, event)


def delays_until_failed(policy: RetryPolicy) -> tuple[list[float], int]:
    """Fail a row again and again from t=1000: the delays seen and the final attempt count."""
    now, attempts, delays = 1000.0, 0, []
    while True:
        out = after_failure(attempts, policy.max_attempts, policy.cap, now)
        attempts = out.attempts
        if out.state is State.FAILED:
            return delays, attempts
        delays.append(out.available_at - now)


def test_local_backoff_is_2_4_8_16_then_failed_at_attempt_5() -> None:
    assert delays_until_failed(LOCAL) == ([2, 4, 8, 16], 5)


def test_peer_backoff_doubles_to_2048_then_caps_at_3600_and_fails_at_48() -> None:
    delays, attempts = delays_until_failed(PEER)
    assert delays[:11] == [2 ** n for n in range(1, 12)]
    assert delays[10] == 2048
    assert set(delays[11:]) == {3600}
    assert attempts == 48
    assert len(delays) == 47


@pytest.mark.parametrize(("attempts", "cap", "delay"),
                         [(1, 60, 2), (5, 60, 32), (6, 60, 60), (40, 60, 60), (1000, 3600, 3600)])
def test_backoff_is_min_of_cap_and_two_to_the_attempts(attempts: int, cap: float,
                                                       delay: float) -> None:
    assert backoff_delay(attempts, cap) == delay


def test_backoff_rejects_attempt_zero() -> None:
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        backoff_delay(0, 60)


def test_permanent_errors_fail_at_once_whatever_the_count() -> None:
    out = after_failure(0, PEER.max_attempts, PEER.cap, 5.0, permanent=True)
    assert out.state is State.FAILED
    assert out.attempts == 1


@pytest.mark.parametrize(("runs_now", "before", "state", "event", "history", "available"), [
    (True, 0, State.PROCESSING, Event.CLAIM, "interrupted", 100.0),  # the claim runs it
    (True, LOCAL.max_attempts - 1, State.FAILED, Event.FAIL, "failed", 100.0),
    (False, 0, State.PENDING, Event.RETRY, "interrupted", 102.0),  # waits out 2 s, alone
    (False, 2, State.PENDING, Event.RETRY, "interrupted", 108.0),
    (False, PEER.max_attempts - 1, State.FAILED, Event.FAIL, "failed", 100.0),
])
def test_a_takeover_counts_one_attempt_and_says_where_the_row_goes(
        runs_now: bool, before: int, state: State, event: Event, history: str,
        available: float) -> None:
    policy = LOCAL if runs_now else PEER
    t = after_takeover(before, policy.max_attempts, "w-dead", 100.0, cap=policy.cap,
                       runs_now=runs_now)
    assert (t.outcome.state, t.outcome.attempts, t.outcome.available_at) == (
        state, before + 1, available)
    assert (t.event, t.history, t.failed) == (event, history, state is State.FAILED)
    assert transition("m", State.PROCESSING, t.event) is state
    assert "w-dead" in t.error and f"attempt {before + 1} of {policy.max_attempts}" in t.error


def test_fencing_refuses_another_worker_and_non_processing_rows() -> None:
    check_lease("m", "processing", "w1", "w1")
    with pytest.raises(LeaseLost):
        check_lease("m", "processing", "w2", "w1")
    for state in ("pending", "delivered", "failed"):
        with pytest.raises(LeaseLost):
            check_lease("m", state, "w1", "w1")


@pytest.mark.parametrize(("state", "available_at", "lease_until", "now", "claimable"), [
    ("pending", 10, None, 10, True),
    ("pending", 11, None, 10, False),
    ("processing", 0, 20, 10, False),
    ("processing", 0, 10, 10, True),
    ("delivered", 0, None, 10, False),
    ("failed", 0, None, 10, False),
])
def test_claimable_rows_are_due_pending_or_expired_processing(
        state: str, available_at: float, lease_until: float | None, now: float,
        claimable: bool) -> None:
    assert is_claimable(state, available_at, lease_until, now) is claimable


@pytest.mark.timeout(60)
def test_enqueue_is_idempotent_for_the_same_message_and_refuses_any_other() -> None:
    """Target, kind, content, sender and payload make the message: the same id with any
    of them changed is a conflict, not a repeat that silently drops what changed."""
    fp = Fingerprint("s1", "agent_message", "hello", "s0", '{"a": 1}')
    assert enqueue_decision("m", None, fp) is True
    assert enqueue_decision("m", fp, Fingerprint("s1", "agent_message", "hello", "s0",
                                                 '{"a": 1}')) is False
    for other in (Fingerprint("s1", "agent_message", "bye", "s0", '{"a": 1}'),
                  Fingerprint("s2", "agent_message", "hello", "s0", '{"a": 1}'),
                  Fingerprint("s1", "subagent_result", "hello", "s0", '{"a": 1}'),
                  Fingerprint("s1", "agent_message", "hello", "s9", '{"a": 1}'),
                  Fingerprint("s1", "agent_message", "hello", None, '{"a": 1}'),
                  Fingerprint("s1", "agent_message", "hello", "s0", '{"a": 2}'),
                  Fingerprint("s1", "agent_message", "hello", "s0", '{"a": true}'),
                  Fingerprint("s1", "agent_message", "hello", "s0", "{}")):
        with pytest.raises(IdempotencyConflict):
            enqueue_decision("m", fp, other)


@pytest.mark.timeout(60)
def test_payloads_are_compared_as_stored_whatever_the_order_of_their_keys() -> None:
    """A payload is compared as the inbox stores it (JSON, keys sorted): a row written with
    its keys in another order, or spaced otherwise, is the same payload."""
    fp = Fingerprint("s1", "agent_message", "hello", "s0", stored_payload({"b": 1, "a": [2]}))
    assert fp.payload == '{"a": [2], "b": 1}'
    old_row = Fingerprint("s1", "agent_message", "hello", "s0", '{"b":1,  "a":[2]}')
    assert enqueue_decision("m", old_row, fp) is False
    assert stored_payload({}) == "{}" and stored_payload({1: "x"}) == stored_payload({"1": "x"})


@pytest.mark.parametrize(("flags", "limit", "suspects", "taken", "held_back"), [
    ([False, False, False], 2, 1, [0, 1], False),
    ([True, False, False], 2, 1, [0, 1], False),     # the oldest, a dead worker's, first
    ([True, True, False], 2, 1, [0, 2], True),       # one suspect a claim: the next waits
    ([True, True, False], 3, 0, [2], True),          # none: suspects leave their place
    ([False, True], 1, 1, [0], False),               # full before the suspect is reached
])
def test_a_claim_takes_heads_oldest_first_and_few_suspects(
        flags: list[bool], limit: int, suspects: int, taken: list[int], held_back: bool
) -> None:
    assert pick_heads(flags, limit, suspects) == (taken, held_back)
