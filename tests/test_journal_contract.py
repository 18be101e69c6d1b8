"""The journal store's contract, run against SQLite and PostgreSQL alike."""

from __future__ import annotations

import threading

import pytest

from kinbox.persistence import (
    DatabaseFailed,
    IdempotencyConflict,
    IllegalTransition,
    Journal,
    LeaseLost,
    NewMessage,
    RowNotFound,
    TurnEntry,
)

from .conftest import Stores

T0 = 1000.0


def send(j: Journal, mid: str, target: str = "s1", content: str = "hi", now: float = T0) -> None:
    j.enqueue(NewMessage(mid, target, content, sender="s0"), now)


def test_enqueue_commits_a_pending_row_with_every_inbox_column(stores: Stores) -> None:
    result = stores.journal.enqueue(
        NewMessage("m1", "s1", "hello", sender="s0", payload={"k": 1}), T0
    )
    assert result.created and result.status == "pending"
    row = stores.journal.get("m1")
    expected = {
        "message_id",
        "seq",
        "transport",
        "destination_peer_id",
        "sender_chat_id",
        "target_chat_id",
        "kind",
        "content",
        "payload",
        "status",
        "attempts",
        "max_attempts",
        "available_at",
        "lease_owner",
        "lease_until",
        "created_at",
        "updated_at",
        "delivered_at",
        "last_error",
        "suspect",
        "turn_started_at",
    }
    assert set(row) == expected
    assert (row["status"], row["attempts"], row["max_attempts"], row["payload"]) == (
        "pending",
        0,
        5,
        {"k": 1},
    )


def test_same_id_same_content_is_not_a_new_row(stores: Stores) -> None:
    send(stores.journal, "m1")
    again = stores.journal.enqueue(NewMessage("m1", "s1", "hi", sender="s0"), T0 + 5)
    assert again.created is False
    assert len(stores.journal.rows()) == 1


def test_same_id_other_content_is_rejected_and_writes_nothing(stores: Stores) -> None:
    send(stores.journal, "m1")
    with pytest.raises(IdempotencyConflict):
        send(stores.journal, "m1", content="other")
    assert [r["content"] for r in stores.journal.rows()] == ["hi"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("change", ["payload", "sender", "no sender"])
def test_same_id_and_content_with_another_payload_or_sender_is_rejected(
    stores: Stores, change: str
) -> None:
    """The payload and the sender are part of the message: a second enqueue of the id that
    differs only there is a conflict (it was taken as a repeat, its payload dropped)."""
    j = stores.journal
    j.enqueue(NewMessage("m1", "s1", "hi", sender="s0", payload={"k": 1, "j": [1]}), T0)
    other = {
        "payload": NewMessage("m1", "s1", "hi", sender="s0", payload={"k": 2, "j": [1]}),
        "sender": NewMessage("m1", "s1", "hi", sender="s9", payload={"k": 1, "j": [1]}),
        "no sender": NewMessage("m1", "s1", "hi", payload={"k": 1, "j": [1]}),
    }[change]
    with pytest.raises(IdempotencyConflict):
        j.enqueue(other, T0 + 1)
    with pytest.raises(IdempotencyConflict):
        j.enqueue_many([NewMessage("m2", "s1", "new"), other], T0 + 1)
    [row] = j.rows()
    assert (row["sender_chat_id"], row["payload"]) == ("s0", {"k": 1, "j": [1]})
    again = j.enqueue(
        NewMessage("m1", "s1", "hi", sender="s0", payload={"j": [1], "k": 1}), T0 + 2
    )  # the same payload, its keys in another order: a repeat
    assert again.created is False


def test_enqueue_many_writes_a_batch_in_order_with_the_idempotence_rule(stores: Stores) -> None:
    """Set-wise for new ids; a batch holding an earlier id (or one id twice) follows the
    one-by-one rule: a repeat is no new row, other content under an old id writes nothing."""
    j = stores.journal
    first = j.enqueue_many([NewMessage(f"m{i}", "s1", f"body {i}") for i in range(3)], T0)
    assert [(r.message_id, r.created) for r in first] == [("m0", True), ("m1", True), ("m2", True)]
    again = j.enqueue_many(
        [
            NewMessage("m1", "s1", "body 1"),
            NewMessage("m3", "s1", "body 3"),
            NewMessage("m3", "s1", "body 3"),
        ],
        T0 + 1,
    )
    assert [(r.message_id, r.created) for r in again] == [
        ("m1", False),
        ("m3", True),
        ("m3", False),
    ]
    with pytest.raises(IdempotencyConflict):
        j.enqueue_many(
            [NewMessage("m4", "s1", "body 4"), NewMessage("m0", "s1", "changed")], T0 + 2
        )
    rows = j.rows()
    assert [r["message_id"] for r in rows] == ["m0", "m1", "m2", "m3"]  # m4 went with it
    assert [r["seq"] for r in rows] == sorted(r["seq"] for r in rows)
    assert j.enqueue_many([NewMessage("m5", "s1", "body 5")], T0 + 3)[0].created


def test_claim_takes_only_the_head_of_each_target_oldest_first(stores: Stores) -> None:
    j = stores.journal
    for mid, target in [("a1", "A"), ("b1", "B"), ("a2", "A"), ("c1", "C")]:
        send(j, mid, target)
    first = j.claim("w1", T0, limit=10)
    assert [r.message_id for r in first.rows] == ["a1", "b1", "c1"]
    assert j.claim("w1", T0, limit=10).rows == []  # a2 waits behind a1 in flight
    j.complete_turn("w1", "A", ["a1"], [], T0)
    assert [r.message_id for r in j.claim("w1", T0).rows] == ["a2"]


@pytest.mark.parametrize("handed_back", [False, True], ids=["taken-over", "handed-back"])
def test_suspect_heads_older_than_a_claims_room_do_not_hide_the_plain_heads_behind_them(
    stores: Stores, handed_back: bool
) -> None:
    """A claim runs at most ``suspects`` suspect rows (taken over from a dead worker, or
    handed back unrun after a takeover); the plain due heads behind them are claimed
    beside them, however many suspects are older. The claim read as many heads as it had
    room for, oldest first, and dropped the suspects past its share: with the room full
    of suspects, a plain head was never read (SQLite: taken over; both: handed back)."""
    j = stores.journal
    for i in range(10):
        send(j, f"dead{i}", f"D{i}")
    assert len(j.claim("dead", T0, limit=64, lease=10).rows) == 10
    if handed_back:  # taken over (marked suspect), then handed back unrun
        taken = j.claim("stopping", T0 + 20, limit=64, lease=10, suspects=10).rows
        assert len(taken) == 10 and all(r.taken_over for r in taken)
        j.release("stopping", [r.message_id for r in taken], T0 + 21)
    for i in range(3):
        send(j, f"fresh{i}", f"F{i}", now=T0 + 30)
    result = j.claim("live", T0 + 100, limit=4, lease=10, suspects=1)
    assert sorted(r.message_id for r in result.rows) == ["dead0", "fresh0", "fresh1", "fresh2"]


def test_a_row_in_backoff_holds_back_the_rows_behind_it(stores: Stores) -> None:
    j = stores.journal
    send(j, "a1", "A")
    send(j, "a2", "A")
    j.claim("w1", T0)
    j.retry("w1", "a1", "boom", T0)
    assert j.claim("w1", T0 + 1).rows == []
    assert [r.message_id for r in j.claim("w1", T0 + 2).rows] == ["a1"]


@pytest.mark.timeout(30)
def test_a_retry_waits_the_longer_of_its_backoff_and_its_retry_after(stores: Stores) -> None:
    j = stores.journal
    send(j, "a1", target="s1")
    send(j, "b1", target="s2")
    j.claim("w1", T0)
    out = j.retry("w1", "a1", "rate limited", T0, retry_after=60.0)
    assert (out.state.value, out.attempts, out.available_at) == ("pending", 1, T0 + 60)
    assert j.retry("w1", "b1", "slow", T0, retry_after=0.5).available_at == T0 + 2
    assert [r.message_id for r in j.claim("w1", T0 + 59).rows] == ["b1"]
    assert [r.message_id for r in j.claim("w1", T0 + 60).rows] == ["a1"]
    row = j.get("a1")
    assert (row["status"], row["available_at"], row["last_error"]) == (
        "processing",
        T0 + 60,
        "rate limited",
    )


@pytest.mark.timeout(30)
def test_a_row_released_later_goes_back_uncounted_and_due_after_its_attempts_backoff(
    stores: Stores,
) -> None:
    """What a failed attempt whose record the database refused leaves: the row unrun, its
    attempts as they were, due after the backoff that attempt would have cost."""
    j = stores.journal
    send(j, "a1")
    j.claim("w1", T0)
    with pytest.raises(LeaseLost):
        j.release_later("w2", "a1", T0)  # fenced: only the lease's owner hands it back
    assert j.release_later("w1", "a1", T0) == T0 + 2
    row = j.get("a1")
    assert (row["status"], row["attempts"], row["lease_owner"]) == ("pending", 0, None)
    assert j.claim("w1", T0 + 1).rows == []
    j.claim("w1", T0 + 2)
    j.retry("w1", "a1", "boom", T0 + 2)  # one attempt counted: the next backoff is 4 s
    j.claim("w1", T0 + 4)
    assert j.release_later("w1", "a1", T0 + 4) == T0 + 8
    assert j.get("a1")["attempts"] == 1


@pytest.mark.timeout(30)
def test_rows_released_until_a_time_go_back_uncounted_and_are_not_claimed_before_it(
    stores: Stores,
) -> None:
    """What a busy receiver's answer leaves (a peer's ``503 busy``): the rows unrun, their
    attempts as they were, due when it asked; only their lease's owner hands them back."""
    j = stores.journal
    send(j, "a1")
    send(j, "a2", target="s2")
    j.claim("w1", T0)
    j.claim("w1", T0)
    assert j.get("a2")["status"] == "processing"
    with pytest.raises(LeaseLost):
        j.release_until("w2", ["a1"], T0, T0 + 30)
    j.release_until("w1", ["a1", "a2"], T0, T0 + 30)
    for mid in ("a1", "a2"):
        row = j.get(mid)
        assert (row["status"], row["attempts"], row["lease_owner"]) == ("pending", 0, None)
        assert row["available_at"] == T0 + 30 and row["last_error"] is None
    assert j.claim("w1", T0 + 29).rows == []
    assert sorted(r.message_id for r in j.claim("w1", T0 + 30).rows) == ["a1", "a2"]


@pytest.mark.timeout(30)
def test_a_permanent_retry_fails_the_row_at_its_first_attempt(stores: Stores) -> None:
    j = stores.journal
    send(j, "a1")
    j.claim("w1", T0)
    out = j.retry("w1", "a1", "bad key", T0, permanent=True, retry_after=60.0)
    assert (out.state.value, out.attempts) == ("failed", 1)
    row = j.get("a1")
    assert (row["status"], row["attempts"], row["last_error"]) == ("failed", 1, "bad key")


def test_an_expired_lease_can_be_taken_over_and_fences_the_old_worker(stores: Stores) -> None:
    j = stores.journal
    send(j, "m1")
    j.claim("old", T0, lease=10)
    assert j.claim("new", T0 + 5, lease=10).rows == []
    taken = j.claim("new", T0 + 10, lease=10)
    assert [r.message_id for r in taken.rows] == ["m1"]
    before = j.get("m1")
    for late in (
        lambda: j.complete_turn("old", "s1", ["m1"], [TurnEntry("assistant", "x")], T0 + 11),
        lambda: j.ack("old", ["m1"], T0 + 11),
        lambda: j.retry("old", "m1", "late", T0 + 11),
    ):
        with pytest.raises(LeaseLost):
            late()
    assert j.get("m1") == before
    assert stores.store.transcript("s1") == []
    assert stores.store.marker_counts() == {}


def test_renewal_keeps_a_lease_alive_for_its_owner_only(stores: Stores) -> None:
    j = stores.journal
    send(j, "m1")
    j.claim("w1", T0, lease=10)
    assert j.renew("w2", ["s1"], T0 + 100, T0) == 0
    assert j.renew("w1", ["s1"], T0 + 100, T0) == 1
    assert j.claim("w2", T0 + 50).rows == []


def test_complete_turn_commits_entries_marker_and_ack_together(stores: Stores) -> None:
    j = stores.journal
    send(j, "m1")
    j.claim("w1", T0)
    j.complete_turn(
        "w1",
        "s1",
        ["m1"],
        [TurnEntry("user", "hi", True, "m1"), TurnEntry("assistant", "hello")],
        T0 + 1,
    )
    row = j.get("m1")
    assert (row["status"], row["delivered_at"], row["lease_owner"]) == ("delivered", T0 + 1, None)
    assert [(e.role, e.text) for e in stores.store.transcript("s1")] == [
        ("user", "hi"),
        ("assistant", "hello"),
    ]
    assert stores.store.marker_counts() == {"m1": 1}


def test_complete_turn_can_enqueue_follow_ups_in_the_same_transaction(stores: Stores) -> None:
    j = stores.journal
    send(j, "m1")
    j.claim("w1", T0)
    j.complete_turn("w1", "s1", ["m1"], [], T0, enqueue=[NewMessage("r1", "s0", "done")])
    assert [r["message_id"] for r in j.rows(state="pending")] == ["r1"]


def test_a_marker_already_present_acks_at_claim_without_delivering(stores: Stores) -> None:
    j = stores.journal
    send(j, "m1")
    j.claim("w1", T0)
    # The turn committed and its ack was lost (the marker check must make up for it).
    j.writer.call(lambda: j.write_turn("s1", ["m1"], [], T0))
    j.expire_leases(T0)
    result = j.claim("w2", T0)
    assert result.rows == [] and result.acked_by_marker == ["m1"]
    assert j.get("m1")["status"] == "delivered"
    assert stores.store.marker_counts() == {"m1": 1}


def test_retries_back_off_then_fail_and_requeue_keeps_history(stores: Stores) -> None:
    j = stores.journal
    send(j, "m1")
    now = T0
    for attempt in range(1, 6):
        rows = j.claim("w1", now).rows
        assert [r.message_id for r in rows] == ["m1"], attempt
        out = j.retry("w1", "m1", f"boom {attempt}", now)
        if attempt < 5:
            assert out.state.value == "pending"
            assert out.available_at - now == 2**attempt
            now = out.available_at
    row = j.get("m1")
    assert (row["status"], row["attempts"], row["last_error"]) == ("failed", 5, "boom 5")
    assert j.claim("w1", now + 10_000).rows == []
    with pytest.raises(LeaseLost):
        j.ack("w1", ["m1"], now)
    requeued = j.requeue("m1", now + 1)
    assert (requeued["status"], requeued["attempts"]) == ("pending", 0)
    events = [h["event"] for h in j.history("m1")]
    assert events == ["retry"] * 4 + ["failed", "requeued"]
    assert [r.message_id for r in j.claim("w1", now + 1).rows] == ["m1"]


def test_requeue_refuses_rows_that_are_not_failed(stores: Stores) -> None:
    j = stores.journal
    send(j, "m1")
    with pytest.raises(IllegalTransition, match="cannot requeue a row in state 'pending'"):
        j.requeue("m1", T0)
    with pytest.raises(RowNotFound):
        j.requeue("nope", T0)
    assert j.history("m1") == []


def test_steering_claims_the_next_due_rows_of_a_busy_target(stores: Stores) -> None:
    j = stores.journal
    for mid in ("a1", "a2", "a3"):
        send(j, mid, "A")
    head = j.claim("w1", T0).rows[0]
    more = j.claim_more("w1", "A", head.message_id, head.seq, T0)
    assert [r.message_id for r in more] == ["a2", "a3"]
    j.complete_turn("w1", "A", ["a1", "a2", "a3"], [], T0)
    assert j.counts() == {"delivered": 3}


def test_concurrent_workers_never_claim_the_same_row_or_two_rows_of_one_target(
    any_db_url: str,
) -> None:
    workers = [Stores(any_db_url) for _ in range(3)]
    try:
        j0 = workers[0].journal
        for i in range(60):
            send(j0, f"m{i:03d}", f"T{i % 6}")
        claimed: list[list[str]] = [[] for _ in workers]
        barrier = threading.Barrier(len(workers))

        def work(k: int) -> None:
            barrier.wait()
            j = workers[k].journal
            while True:
                rows = j.claim(f"w{k}", T0, limit=2).rows
                if not rows:
                    if j.counts().get("pending", 0) == 0:
                        return
                    continue
                for r in rows:
                    claimed[k].append(r.message_id)
                    j.complete_turn(f"w{k}", r.target, [r.message_id], [], T0)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(len(workers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        every = [m for c in claimed for m in c]
        assert sorted(every) == [f"m{i:03d}" for i in range(60)]
        assert workers[0].store.marker_counts() == {m: 1 for m in every}
    finally:
        for w in workers:
            w.close()


def test_a_worker_that_steered_before_its_turn_was_taken_over_steers_nothing_after(
    stores: Stores,
) -> None:
    """The rows a worker steered into its turn stay leased to it when a takeover leases
    the turn's head elsewhere: fenced by any of its rows, its next steer passed and leased
    the rows the new owner's turn chains into."""
    j = stores.journal
    for mid in ("a1", "a2", "a3", "a4"):
        send(j, mid, "A")
    head = j.claim("w1", T0, lease=30).rows[0]
    steered = j.claim_more("w1", "A", head.message_id, head.seq, T0, lease=30, limit=1)
    assert [r.message_id for r in steered] == ["a2"]
    taken = j.claim("w2", T0 + 31, lease=30).rows
    assert [(r.message_id, r.taken_over) for r in taken] == [("a1", True)]
    assert j.claim_more("w1", "A", head.message_id, steered[0].seq, T0 + 32) == []
    assert {r["message_id"]: r["status"] for r in j.rows()}["a3"] == "pending"


def test_steering_by_a_worker_whose_turn_was_taken_over_leases_nothing(stores: Stores) -> None:
    """A worker paused past its lease resumes mid-turn and steers: its row was taken over
    and runs elsewhere, so it may lease none of the target's later rows (they belonged to
    the new owner's turn, which chains into them). It leased them all, unfenced."""
    j = stores.journal
    for mid in ("a1", "a2", "a3"):
        send(j, mid, "A")
    head = j.claim("w1", T0, lease=30).rows[0]
    taken = j.claim("w2", T0 + 31, lease=30).rows
    assert [(r.message_id, r.taken_over) for r in taken] == [("a1", True)]
    assert j.claim_more("w1", "A", head.message_id, head.seq, T0 + 32) == []
    assert [(r["message_id"], r["status"], r["lease_owner"]) for r in j.rows()] == [
        ("a1", "processing", "w2"),
        ("a2", "pending", None),
        ("a3", "pending", None),
    ]
    assert [r.message_id for r in j.claim_more("w2", "A", "a1", head.seq, T0 + 32)] == ["a2", "a3"]


@pytest.mark.timeout(120)
def test_steering_leaves_a_suspect_row_for_a_turn_of_its_own(stores: Stores) -> None:
    """a1 was taken over (its worker died mid-turn) and handed back unrun: a suspect, to
    run alone so that a death during it is its own. An operator's requeue of the older a0
    put a plain head before it, and a0's turn steered a1 in: had a1 killed that process
    too, the death was counted against no one (a plain turn records no start), and a0,
    the head taken over, ran as the suspect in a1's place."""
    j = stores.journal
    send(j, "a0", "A")
    j.claim("w1", T0)
    j.retry("w1", "a0", "boom", T0, permanent=True)
    send(j, "a1", "A")
    assert [r.message_id for r in j.claim("w0", T0, lease=30).rows] == ["a1"]
    assert [(r.message_id, r.taken_over) for r in j.claim("w2", T0 + 31).rows] == [("a1", True)]
    j.hand_back("w2", ["a1"], T0 + 32)
    j.requeue("a0", T0 + 33)
    [head] = j.claim("w3", T0 + 34).rows
    assert (head.message_id, head.taken_over) == ("a0", False)
    assert j.claim_more("w3", "A", "a0", head.seq, T0 + 34) == []
    j.complete_turn("w3", "A", ["a0"], [], T0 + 35, next_lease=30.0)
    assert [(r.message_id, r.taken_over) for r in j.claim("w3", T0 + 36).rows] == [("a1", True)]


def test_a_turn_takes_one_named_row_only_while_it_holds_its_own(stores: Stores) -> None:
    """``claim_row`` (a foreground child's result taken into the waiting turn) has
    steering's fence and lease: out of order, by name, a row of the turn's own target
    that a claim could take (pending and due, or its lease ran out), nothing else."""
    j = stores.journal
    for mid in ("a1", "a2", "a3"):
        send(j, mid, "A")
    send(j, "b1", "B")
    head = j.claim("w1", T0, lease=30).rows[0]
    assert j.claim_row("w1", "A", "a1", "b1", T0) is None  # another session's row
    assert j.claim_row("w2", "A", "a1", "a3", T0) is None  # not w2's turn
    assert j.claim_row("w1", "A", "a1", "gone", T0) is None
    taken = j.claim_row("w1", "A", head.message_id, "a3", T0, lease=30)
    assert taken is not None and (taken.message_id, taken.target) == ("a3", "A")
    assert j.claim_row("w1", "A", "a1", "a3", T0 + 1) is None  # held: not claimable again
    states = {r["message_id"]: (r["status"], r["lease_owner"]) for r in j.rows()}
    assert states["a2"] == ("pending", None) and states["a3"] == ("processing", "w1")
    # w1 dies; w2 takes its turn over, and with it the row that turn had taken.
    taken_over = j.claim("w2", T0 + 31, lease=30).rows
    assert [(r.message_id, r.taken_over) for r in taken_over][:1] == [("a1", True)]
    assert j.claim_row("w1", "A", "a1", "a3", T0 + 32) is None  # w1's turn is gone
    assert j.claim_row("w2", "A", "a1", "a3", T0 + 32) is not None
    j.complete_turn("w2", "A", ["a1", "a3"], [], T0 + 33)
    states = {r["message_id"]: (r["status"], r["lease_owner"]) for r in j.rows()}
    assert (states["a1"], states["a2"], states["a3"]) == (
        ("delivered", None),
        ("pending", None),
        ("delivered", None),
    )


@pytest.mark.parametrize("text", ["a\ud800", "a\x00"], ids=["surrogate", "nul"])
def test_text_the_database_cannot_hold_fails_as_a_kinbox_error_writing_nothing(
    stores: Stores, text: str
) -> None:
    """A lone surrogate has no UTF-8 and PostgreSQL's text holds no NUL. The driver
    refuses such a value before the database sees it, with a bare ``UnicodeEncodeError``
    or ``ValueError``; the same value sent in a batch's JSON was refused by the server as
    a ``DataError``. So a write answered a kinbox error or a builtin one depending on the
    company it kept in its batch. Now always the database's refusal: ``DataError``."""
    j = stores.journal
    if "\x00" in text and not j.bulk.postgres:
        pytest.skip("SQLite holds a NUL")
    send(j, "m1")
    [row] = j.claim("w", T0).rows
    attempts = [
        lambda: j.enqueue(NewMessage("m2", "s2", text), T0),
        lambda: j.enqueue_many([NewMessage("m2", "s2", "ok"), NewMessage("m3", "s2", text)], T0),
        lambda: j.complete_turn("w", "s1", ["m1"], [TurnEntry("assistant", text)], T0),
        lambda: j.complete_turn(
            "w", "s1", ["m1"], [TurnEntry("assistant", text)], T0, also=[lambda: None]
        ),
        lambda: j.retry("w", "m1", f"boom {text}", T0),
    ]
    for attempt in attempts:
        with pytest.raises(DatabaseFailed) as refused:
            attempt()
        assert refused.value.kind == "DataError"
    assert [(r["message_id"], r["status"]) for r in j.rows()] == [("m1", "processing")]
    assert (
        j.complete_turn("w", "s1", [row.message_id], [TurnEntry("assistant", "ok")], T0) is None
    )  # the fence and the row are as they were
