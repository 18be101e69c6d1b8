"""The retention rules (:mod:`kinbox.persistence.retention`), without a database."""

from __future__ import annotations

import itertools

import pytest

from kinbox.persistence.inbox_core import State
from kinbox.persistence.numbered_ids import chain_successors, numbered, successors
from kinbox.persistence.retention import (
    PRUNABLE_STATES,
    Keep,
    RowFacts,
    keep_reason,
    prunable,
)

CUTOFF = 1000.0


def old(mid: str, status: str = "delivered", *, leased: bool = False,
        task_open: bool = False, chained: bool = False) -> RowFacts:
    return RowFacts(mid, status, CUTOFF - 1, leased, task_open, chained)


@pytest.mark.parametrize("state", [State.PENDING, State.PROCESSING, State.FAILED])
def test_an_open_or_failed_row_is_never_prunable_however_old(state: State) -> None:
    assert keep_reason(RowFacts("m", state, 0.0, False), CUTOFF) is Keep.NOT_TERMINAL


def test_only_delivered_and_cancelled_rows_can_go() -> None:
    assert set(PRUNABLE_STATES) == {State.DELIVERED, State.CANCELLED}
    assert set(PRUNABLE_STATES) | {State.PENDING, State.PROCESSING, State.FAILED} == set(State)


def test_a_row_changed_at_or_after_the_cutoff_stays() -> None:
    assert keep_reason(RowFacts("m", "delivered", CUTOFF, False), CUTOFF) is Keep.RECENT
    assert keep_reason(RowFacts("m", "delivered", CUTOFF - 0.001, False), CUTOFF) is None


def test_a_leased_row_and_a_row_of_an_open_task_stay() -> None:
    assert keep_reason(old("m", leased=True), CUTOFF) is Keep.LEASED
    assert keep_reason(old("m", "cancelled", task_open=True),
                       CUTOFF) is Keep.TASK_OPEN
    assert keep_reason(old("m", "cancelled"), CUTOFF) is None


def test_successors_are_the_next_numbered_ids() -> None:
    assert successors("subagent-result-t1") == ("subagent-result-t1-2",)
    assert successors("subagent-result-t1-2") == ("subagent-result-t1-2-2",
                                                  "subagent-result-t1-3")
    assert chain_successors(["a", "a-2"]) == ["a-2", "a-2-2", "a-3"]


def test_the_ids_a_chain_takes_are_the_ids_a_prune_sees_following() -> None:
    # One scheme for the writer of chains (subagents.next_free_id) and the prune: each
    # id a chain takes is a successor of the one before it.
    ids = list(itertools.islice(numbered("subagent-result-t1"), 5))
    assert all(b in successors(a) for a, b in itertools.pairwise(ids))


def test_a_chain_member_stays_while_a_later_member_is_kept_and_so_do_those_before() -> None:
    rows = [old("b-3", chained=True), old("b-2", chained=True), old("b", chained=True),
            old("x", chained=True)]
    assert prunable(rows, CUTOFF, kept_elsewhere={"b-4"}) == ["x"]
    assert prunable(rows, CUTOFF, kept_elsewhere=set()) == ["b-3", "b-2", "b", "x"]


def test_a_chain_member_kept_in_the_same_batch_keeps_its_predecessors() -> None:
    rows = [RowFacts("b-2", "pending", 0.0, False, chained=True),
            RowFacts("b", "delivered", 0.0, False, chained=True),
            RowFacts("c", "delivered", 0.0, False, chained=True)]
    assert prunable(rows, CUTOFF, kept_elsewhere=set()) == ["c"]


def test_the_last_member_of_a_chain_may_go_before_the_others() -> None:
    """A chain cut at its end is still walked from its base without a gap."""
    rows = [RowFacts("b-2", "delivered", 0.0, False, chained=True),
            RowFacts("b", "delivered", CUTOFF, False, chained=True)]
    assert prunable(rows, CUTOFF, kept_elsewhere=set()) == ["b-2"]


def test_rows_that_name_no_task_are_no_chain() -> None:
    """A product's ``invoice-7`` is not kept by a recent ``invoice-8`` or ``invoice-7-2``."""
    rows = [RowFacts("invoice-7", "delivered", 0.0, False)]
    assert prunable(rows, CUTOFF, kept_elsewhere={"invoice-8", "invoice-7-2"}) == ["invoice-7"]


def _peer_schedule_span() -> float:
    """Seconds from a peer row's first attempt to its last, walked through the retry
    decisions the journal makes (not a copy of the policy's numbers)."""
    from kinbox.persistence.inbox_core import PEER, after_failure

    attempts, now = 0, 0.0
    while True:
        out = after_failure(attempts, PEER.max_attempts, PEER.cap, now)
        if out.state is State.FAILED:
            return now  # the attempt that just failed was the last one sent
        attempts, now = out.attempts, out.available_at


def test_the_minimum_retention_outlasts_every_resend_of_a_peer_row() -> None:
    """A paired device re-sends an unacknowledged row with the same id until its last
    attempt: a receiver that pruned the row first would run it a second time."""
    from kinbox.persistence.retention import MIN_RETENTION

    span = _peer_schedule_span()
    assert 37 * 3600 < span < 38 * 3600  # about 37 hours (SPEC: 2, 4, ... 3600 s, 48 tries)
    assert span <= MIN_RETENTION < span + 3600  # at least that, rounded up to the hour
