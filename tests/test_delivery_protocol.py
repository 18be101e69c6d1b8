"""The delivery protocol (actors/delivery.py) without threads or a database.

A table-driven test feeds every event in every phase; sequences check the exactly-once
rules of a run, including a crash at each step (the shell never applies the effect).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import delivery as dp
from kinbox.persistence import ClaimedRow

pytestmark = pytest.mark.timeout(10)


def row(n: int, taken_over: bool = False) -> ClaimedRow:
    return ClaimedRow(f"m{n}", n, "s1", None, "agent_message", f"text {n}", {}, 0, 0.0,
                      taken_over)


EVENTS: dict[str, Callable[[dp.Delivery], list[dp.Effect]]] = {
    "claimed": lambda d: d.claimed(row(1)),
    "started": lambda d: d.started(),
    "refused": lambda d: d.refused(),
    "steered": lambda d: d.steered_in(["m2"]),
    "unseen": lambda d: d.unseen(["m3"]),
    "brain_returned": lambda d: d.brain_returned(),
    "brain_raised": lambda d: d.brain_raised("boom"),
    "cut_short": lambda d: d.cut_short(),
    "committed": lambda d: d.committed(None, plain=True),
    "lease_lost": lambda d: d.lease_lost(),
    "commit_refused": lambda d: d.commit_refused("IntegrityError: refused"),
    "journal_failed": lambda d: d.journal_failed(),
    "failure_recorded": lambda d: d.failure_recorded(),
}

ALLOWED = {
    dp.Phase.IDLE: {"claimed"},
    dp.Phase.STARTING: {"started", "refused"},
    dp.Phase.RUNNING: {"steered", "unseen", "brain_returned", "brain_raised", "cut_short"},
    dp.Phase.COMMITTING: {"committed", "lease_lost", "commit_refused"},
    dp.Phase.FAILING: {"failure_recorded", "journal_failed"},
    dp.Phase.DONE: set(),
}

# Where each allowed event leads, and the kinds of effects it answers with.
EXPECTED: dict[tuple[dp.Phase, str], tuple[dp.Phase, list[type]]] = {
    (dp.Phase.IDLE, "claimed"): (dp.Phase.STARTING, [dp.StartTurn]),
    (dp.Phase.STARTING, "started"): (dp.Phase.RUNNING, [dp.RunBrain]),
    (dp.Phase.STARTING, "refused"): (dp.Phase.DONE, [dp.Done]),
    (dp.Phase.RUNNING, "steered"): (dp.Phase.RUNNING, []),
    (dp.Phase.RUNNING, "unseen"): (dp.Phase.RUNNING, [dp.Release]),
    (dp.Phase.RUNNING, "brain_returned"): (dp.Phase.COMMITTING, [dp.Commit]),
    (dp.Phase.RUNNING, "brain_raised"): (dp.Phase.FAILING, [dp.RecordFailure]),
    (dp.Phase.RUNNING, "cut_short"): (dp.Phase.DONE, [dp.Release, dp.Done]),
    (dp.Phase.COMMITTING, "committed"): (dp.Phase.DONE, [dp.Done]),
    (dp.Phase.COMMITTING, "lease_lost"): (dp.Phase.DONE, [dp.Done]),
    (dp.Phase.COMMITTING, "commit_refused"): (dp.Phase.FAILING, [dp.RecordFailure]),
    (dp.Phase.FAILING, "failure_recorded"): (dp.Phase.DONE, [dp.Done]),
    (dp.Phase.FAILING, "journal_failed"): (dp.Phase.DONE, [dp.Release, dp.Done]),
}

PATH_TO = {  # events that bring a fresh run to each phase
    dp.Phase.IDLE: [],
    dp.Phase.STARTING: ["claimed"],
    dp.Phase.RUNNING: ["claimed", "started"],
    dp.Phase.COMMITTING: ["claimed", "started", "brain_returned"],
    dp.Phase.FAILING: ["claimed", "started", "brain_raised"],
    dp.Phase.DONE: ["claimed", "refused"],
}


def in_phase(phase: dp.Phase) -> dp.Delivery:
    d = dp.Delivery()
    for event in PATH_TO[phase]:
        EVENTS[event](d)
    assert d.phase is phase
    return d


@pytest.mark.parametrize("phase", list(dp.Phase))
@pytest.mark.parametrize("event", list(EVENTS))
def test_every_event_in_every_phase(phase: dp.Phase, event: str) -> None:
    d = in_phase(phase)
    if event not in ALLOWED[phase]:
        with pytest.raises(dp.ProtocolError) as refused:
            EVENTS[event](d)
        assert (refused.value.event, refused.value.phase) == (event, phase)
        assert d.phase is phase  # a refused event changes nothing
        return
    effects = EVENTS[event](d)
    after, kinds = EXPECTED[(phase, event)]
    assert d.phase is after
    assert [type(e) for e in effects] == kinds


def test_every_allowed_pair_has_an_expectation() -> None:
    assert {(p, e) for p, events in ALLOWED.items() for e in events} == set(EXPECTED)


def test_a_plain_run_commits_the_row_and_its_steering_then_frees_the_slot() -> None:
    d = dp.Delivery()
    assert d.claimed(row(1)) == [dp.StartTurn(row(1), record_start=False)]
    d.started()
    d.steered_in(["m2", "m3"])
    assert d.brain_returned() == [dp.Commit(("m1", "m2", "m3"))]
    assert d.committed(None, plain=True) == [dp.Done(claim=False)]


def test_a_commit_the_journal_refused_is_a_failed_attempt_and_its_record_hands_back() -> None:
    """Nothing of the turn was written. Handed straight back, a commit that can never
    succeed ran its brain again at once, for ever: it is a failed attempt (its backoff,
    then ``failed``), and the steered rows go back with its record. Should the record be
    refused too (the database is down), the rows go back unrun, not left to their lease
    (a blip of a second stalled the session for the whole lease), the failed one due after
    a backoff (due at once, a record always refused reran its brain at once, for ever)."""
    d = dp.Delivery()
    d.claimed(row(1))
    d.started()
    d.steered_in(["m2"])
    d.brain_returned()
    assert d.commit_refused("DatabaseFailed: x") == [
        dp.RecordFailure("m1", ("m2",), "DatabaseFailed: x")]
    assert d.journal_failed() == [
        dp.Release("m1", backoff=True), dp.Release("m2"), dp.Done(claim=True)]


def test_a_turn_that_starts_once_the_runtime_is_stopping_hands_its_row_back() -> None:
    """It waited for another turn of its session; the stop asked the running turns to stop
    before it was one of them."""
    d = dp.Delivery()
    d.claimed(row(1))
    d.closing = True
    assert d.started() == [dp.Release("m1"), dp.Done(claim=True)]
    assert d.phase is dp.Phase.DONE


def test_a_start_the_journal_refused_is_a_failed_attempt_unless_the_lease_was_lost() -> None:
    """A taken-over row's start that the database refused: the row is still this
    worker's, and its attempt fails (a backoff, a count toward its limit), its brain not
    run; handed straight back, it was claimed again at once, round and round while the
    database refused. One refused for a lost lease is its new holder's: nothing written."""
    d = dp.Delivery()
    d.claimed(row(1, taken_over=True))
    assert d.refused("DatabaseFailed: x") == [
        dp.RecordFailure("m1", (), "DatabaseFailed: x", ran=False)]
    assert d.phase is dp.Phase.FAILING
    assert d.journal_failed() == [dp.Release("m1", backoff=True), dp.Done(True)]  # refused too
    d = dp.Delivery()
    d.claimed(row(1, taken_over=True))
    assert d.refused() == [dp.Done(True)]


def test_a_commit_refused_for_a_lost_lease_hands_its_steering_back() -> None:
    """The other worker took the turn's own row, not the rows steering leased into it:
    those are still this worker's, and nothing renews them once the run is done."""
    d = dp.Delivery()
    d.claimed(row(1))
    d.started()
    d.steered_in(["m2", "m3"])
    d.brain_returned()
    assert d.lease_lost() == [dp.Release("m2"), dp.Release("m3"), dp.Done(claim=True)]


def test_a_taken_over_row_records_its_start_before_the_brain_runs() -> None:
    assert dp.Delivery().claimed(row(1, taken_over=True)) == [
        dp.StartTurn(row(1, taken_over=True), record_start=True)]


def test_a_failed_attempt_hands_its_steering_back_and_asks_for_a_claim() -> None:
    d = dp.Delivery()
    d.claimed(row(1))
    d.started()
    d.steered_in(["m2"])
    assert d.brain_raised("ValueError: x") == [dp.RecordFailure("m1", ("m2",), "ValueError: x")]
    assert d.failure_recorded() == [dp.Done(claim=True)]


def test_a_turn_the_runtimes_stop_cut_short_hands_its_rows_back_with_no_attempt() -> None:
    d = dp.Delivery()
    d.claimed(row(1))
    d.started()
    d.steered_in(["m2"])
    assert d.cut_short() == [dp.Release("m1"), dp.Release("m2"), dp.Done(claim=True)]


def test_a_busy_session_chains_up_to_the_limit_and_its_last_commit_leases_nothing() -> None:
    d = dp.Delivery()
    effects = d.claimed(row(0))
    for n in range(1, dp.CHAIN_LIMIT):
        d.started()
        assert d.brain_returned() == [dp.Commit((f"m{n - 1}",), next_lease=True)]
        effects = d.committed(row(n), plain=True)
        assert effects == [dp.StartTurn(row(n), record_start=False)]
    d.started()
    # The last turn the run may chain: a next row leased here would only be handed back.
    assert d.brain_returned() == [dp.Commit((f"m{dp.CHAIN_LIMIT - 1}",), next_lease=False)]
    # Its session may still have rows due: the claim the run asks for finds them.
    assert d.committed(None, plain=True) == [dp.Done(claim=True)]
    assert d.turns == dp.CHAIN_LIMIT


def test_a_row_leased_past_the_limit_anyway_is_handed_back() -> None:
    d = dp.Delivery()
    d.claimed(row(0))
    for n in range(1, dp.CHAIN_LIMIT):
        d.started()
        d.brain_returned()
        d.committed(row(n), plain=True)
    d.started()
    d.brain_returned()
    assert d.committed(row(99), plain=True) == [dp.Release("m99"), dp.Done(claim=True)]


def test_a_commit_while_stopping_leases_nothing_and_asks_for_a_claim() -> None:
    d = dp.Delivery()
    d.claimed(row(1))
    d.started()
    d.closing = True
    assert d.brain_returned() == [dp.Commit(("m1",), next_lease=False)]
    assert d.committed(None, plain=True) == [dp.Done(claim=True)]


def test_a_commit_that_enqueued_messages_asks_for_a_claim_at_the_end() -> None:
    d = dp.Delivery()
    d.claimed(row(1))
    d.started()
    d.brain_returned()
    d.committed(row(2), plain=False)  # e.g. a sub-agent's result to its parent
    d.started()
    d.brain_returned()
    assert d.committed(None, plain=True) == [dp.Done(claim=True)]


def test_a_stopping_runtime_hands_rows_back_and_starts_nothing() -> None:
    assert dp.Delivery(closing=True).claimed(row(1)) == [dp.Release("m1"), dp.Done(True)]
    d = dp.Delivery()
    d.claimed(row(1))
    d.started()
    d.brain_returned()
    d.closing = True
    assert d.committed(row(2), plain=True) == [dp.Release("m2"), dp.Done(True)]


# -- crashes: the shell dies before it applies an effect --------------------------------------

class Journal:
    """The journal as the protocol's effects change it: one open row per message."""

    def __init__(self, ids: list[str]) -> None:
        self.open = list(ids)
        self.leased: set[str] = set()
        self.committed: dict[str, int] = {}
        self.attempts: dict[str, int] = {}

    def apply(self, effect: dp.Effect) -> None:
        if isinstance(effect, dp.Commit):
            for mid in effect.message_ids:
                self.committed[mid] = self.committed.get(mid, 0) + 1
                self.open.remove(mid)
                self.leased.discard(mid)
        elif isinstance(effect, dp.RecordFailure):
            self.attempts[effect.message_id] = self.attempts.get(effect.message_id, 0) + 1
            self.leased -= {effect.message_id, *effect.release}
        elif isinstance(effect, dp.Release):
            self.leased.discard(effect.message_id)

    def crash(self) -> None:
        self.leased.clear()  # the dead runtime's leases run out; the rows stay open


def drive(journal: Journal, crash_at: int | None, fail_first: bool) -> int:
    """Run one delivery run of the journal's head, crashing before effect ``crash_at``.
    Returns how many effects were applied."""
    d = dp.Delivery()
    head = journal.open[0]
    journal.leased.add(head)
    effects: list[Any] = d.claimed(ClaimedRow(head, 0, "s1", None, "k", "c", {}, 0, 0.0))
    applied = 0
    failed_once = False
    while effects:
        effect = effects.pop(0)
        if crash_at is not None and applied == crash_at:
            journal.crash()
            return applied
        journal.apply(effect)
        applied += 1
        if isinstance(effect, dp.StartTurn):
            effects[:0] = d.started()
        elif isinstance(effect, dp.RunBrain):
            if fail_first and not failed_once:
                failed_once = True
                effects[:0] = d.brain_raised("boom")
            else:
                effects[:0] = d.brain_returned()
        elif isinstance(effect, dp.Commit):
            nxt = journal.open[0] if journal.open and effect.next_lease else None
            following = None
            if nxt is not None:
                journal.leased.add(nxt)
                following = ClaimedRow(nxt, 0, "s1", None, "k", "c", {}, 0, 0.0)
            effects[:0] = d.committed(following, plain=True)
        elif isinstance(effect, dp.RecordFailure):
            effects[:0] = d.failure_recorded()
    return applied


@pytest.mark.parametrize("fail_first", [False, True])
@pytest.mark.parametrize("crash_at", range(12))
def test_a_crash_before_any_effect_loses_nothing_and_commits_nothing_twice(
        crash_at: int, fail_first: bool) -> None:
    journal = Journal(["m1", "m2", "m3"])
    drive(journal, crash_at, fail_first)
    for _ in range(5):  # restarts replay what is open, without crashing
        if not journal.open:
            break
        drive(journal, None, fail_first=False)
    assert journal.open == []
    assert journal.committed == {"m1": 1, "m2": 1, "m3": 1}
    assert journal.leased == set()


def test_a_taken_over_rows_run_ends_after_its_turn_so_the_next_suspect_may_start() -> None:
    """A runtime runs one taken-over row at a time; chaining the session's next turns
    kept the others waiting up to CHAIN_LIMIT turns each."""
    d = dp.Delivery()
    d.claimed(row(1, taken_over=True))
    d.started()
    assert d.brain_returned() == [dp.Commit(("m1",), next_lease=False)]
    assert d.committed(None, plain=True) == [dp.Done(claim=True)]
    leased_anyway = dp.Delivery()
    leased_anyway.claimed(row(1, taken_over=True))
    leased_anyway.started()
    leased_anyway.brain_returned()
    assert leased_anyway.committed(row(2), plain=True) == [dp.Release("m2"), dp.Done(True)]


def test_rows_fetched_for_the_turn_and_never_taken_are_handed_back_not_committed() -> None:
    d = in_phase(dp.Phase.RUNNING)
    d.steered_in(["m2"])
    assert d.unseen(["m3", "m4"]) == [dp.Release("m3"), dp.Release("m4")]
    [commit] = d.brain_returned()
    assert isinstance(commit, dp.Commit) and commit.message_ids == ("m1", "m2")
