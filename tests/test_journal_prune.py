"""The journal's prune (:mod:`kinbox.persistence.inbox_prune`), on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kinbox.persistence import Journal, NewMessage, PruneCounts, TurnEntry

from .conftest import Stores

T0 = 1000.0
CUTOFF = T0 + 50


def send(j: Journal, mid: str, target: str, now: float = T0,
         payload: dict[str, object] | None = None) -> None:
    j.enqueue(NewMessage(mid, target, f"body of {mid}", sender="s0", payload=payload or {}),
              now)


def deliver(j: Journal, mid: str, target: str, now: float = T0,
            payload: dict[str, object] | None = None) -> None:
    """A row sent, claimed and committed by a turn (marker and transcript entry)."""
    send(j, mid, target, now, payload)
    [row] = j.claim("w1", now).rows
    assert row.message_id == mid
    j.complete_turn("w1", target, [mid], [TurnEntry("user", f"body of {mid}", True, mid)],
                    now + 1)


def ids(j: Journal) -> list[str]:
    return [r["message_id"] for r in j.rows()]


def journal_of_every_state(s: Stores) -> None:
    """delivered, cancelled, failed, pending, processing (all old), and a new delivered."""
    j = s.journal
    deliver(j, "old-delivered", "a")
    send(j, "old-cancelled", "b")
    j.cancel("old-cancelled", T0 + 2, by="ops", reason="not needed")
    send(j, "old-failed", "c")
    j.claim("w1", T0)
    j.retry("w1", "old-failed", "boom", T0 + 3, permanent=True)
    send(j, "old-pending", "d", T0)
    j.claim("w1", T0, lease=10_000)  # d's head: processing (a long turn)
    send(j, "old-pending-2", "d", T0)  # behind it: pending
    deliver(j, "new-delivered", "e", T0 + 100)


def test_prune_deletes_exactly_the_old_finished_rows_with_their_markers_and_history(
        stores: Stores) -> None:
    j = stores.journal
    journal_of_every_state(stores)
    # A direct turn's marker has no inbox row: it is not the prune's.
    j.writer.call(lambda: j.write_turn("f", ["direct-1"], [], T0))
    counts = j.prune(CUTOFF)
    assert counts == PruneCounts(rows=2, markers=1, events=1)
    assert ids(j) == ["old-failed", "old-pending", "old-pending-2", "new-delivered"]
    assert stores.store.marker_counts() == {"direct-1": 1, "new-delivered": 1}
    assert [h["event"] for h in j.history("old-failed")] == ["failed"]
    assert j.history("old-cancelled") == []
    # The conversation is not the journal's to prune.
    assert [e.message_id for e in stores.store.transcript("a")] == ["old-delivered"]


def test_a_dry_run_counts_the_same_and_changes_nothing(stores: Stores) -> None:
    j = stores.journal
    journal_of_every_state(stores)
    before = (j.rows(), stores.store.marker_counts(), j.history("old-cancelled"))
    assert j.prune(CUTOFF, dry_run=True) == PruneCounts(rows=2, markers=1, events=1)
    assert (j.rows(), stores.store.marker_counts(), j.history("old-cancelled")) == before
    assert j.prune(CUTOFF) == PruneCounts(rows=2, markers=1, events=1)
    assert j.prune(CUTOFF) == PruneCounts()


def test_each_batch_deletes_at_most_its_bound_newest_first(stores: Stores) -> None:
    j = stores.journal
    for k in range(7):
        deliver(j, f"m{k}", f"s{k}")
    deleted: list[list[str]] = []
    before_seq = None
    while True:
        left = set(ids(j))
        step = j.prune_batch(CUTOFF, before_seq=before_seq, batch=3)
        deleted.append(sorted(left - set(ids(j))))
        assert step.counts.rows == step.counts.markers == len(deleted[-1]) <= 3
        if step.before_seq is None:
            break
        before_seq = step.before_seq
    assert deleted == [["m4", "m5", "m6"], ["m1", "m2", "m3"], ["m0"]]
    assert ids(j) == []
    # The whole prune walks the same batches.
    for k in range(7, 12):
        deliver(j, f"m{k}", f"s{k}")
    assert j.prune(CUTOFF, batch=2) == PruneCounts(rows=5, markers=5, events=0)


def test_the_rows_of_an_open_task_stay_until_it_settles(stores: Stores) -> None:
    j, tasks = stores.journal, stores.tables.task
    tasks.insert(id="t1", project_id=None, chat_id="child", title="work",
                 status="blocked", created_at=T0, updated_at=T0).execute()
    deliver(j, "subagent-task-t1", "child", payload={"task_id": "t1"})
    deliver(j, "subagent-result-t1", "parent", payload={"task_id": "t1"})
    deliver(j, "plain", "other")
    assert j.prune(CUTOFF).rows == 1
    assert ids(j) == ["subagent-task-t1", "subagent-result-t1"]
    tasks.update(status="completed").where(tasks.id == "t1").execute()
    assert j.prune(CUTOFF).rows == 2
    assert ids(j) == []


def test_a_chain_goes_whole_or_from_its_end_never_from_its_base(stores: Stores) -> None:
    j = stores.journal
    notice = {"task_id": "t1"}  # a chain's messages are about a task (settled here)
    for mid in ("focal-blocked-t1", "focal-blocked-t1-2"):
        deliver(j, mid, "focal", payload=notice)
    send(j, "focal-blocked-t1-3", "focal", payload=notice)  # open: the chain before it stays
    assert j.prune(CUTOFF) == PruneCounts()
    [row] = j.claim("w1", T0 + 200).rows
    j.complete_turn("w1", "focal", [row.message_id], [], T0 + 201)
    assert j.prune(CUTOFF) == PruneCounts()  # its newest member is recent
    # One batch at a time, newest first: each member goes once those after it have.
    assert j.prune(T0 + 300, batch=1) == PruneCounts(rows=3, markers=3)
    assert ids(j) == []


def test_a_chain_split_across_batches_is_pruned_in_one_prune_and_so_counted_dry(
        stores: Stores) -> None:
    j = stores.journal
    deliver(j, "r", "p", payload={"task_id": "t1"})
    for k in range(5):
        deliver(j, f"x{k}", f"q{k}")
    deliver(j, "r-2", "p", payload={"task_id": "t1"})
    assert j.prune(CUTOFF, batch=2, dry_run=True) == PruneCounts(rows=7, markers=7)
    assert len(ids(j)) == 7
    assert j.prune(CUTOFF, batch=2) == PruneCounts(rows=7, markers=7)


class ConcurrentJournal(Journal):
    """A journal whose prune meets writes committed between its read of the candidates
    and its own transaction (another process's, or this one's queued before it)."""

    meanwhile: Sequence[NewMessage] = ()
    reopen: str | None = None
    finish: str | None = None

    def _judge_and_delete(self, ids: Sequence[str], cutoff: float) -> PruneCounts:
        for msg in self.meanwhile:
            self.enqueue_now(msg, cutoff + 500)
        if self.reopen is not None:
            task = self.t.task
            task.update(status="in_progress").where(task.id == self.reopen).execute()
        if self.finish is not None:  # its turn commits now: terminal, after the cutoff
            self._complete_op("w1", "late", [self.finish], [], cutoff + 1, (), ())
        return super()._judge_and_delete(ids, cutoff)


def test_a_prune_judges_rows_as_they_are_in_its_own_transaction(stores: Stores) -> None:
    """A chain's next member, or a task reopened, between the prune's read and its
    delete keeps what it needs; a row that goes terminal meanwhile is not deleted."""
    j = ConcurrentJournal(stores.tables, stores.writer)
    tasks = stores.tables.task
    tasks.insert(id="t1", project_id=None, chat_id="child", title="work",
                 status="completed", created_at=T0, updated_at=T0).execute()
    deliver(j, "notice", "focal", payload={"task_id": "t2"})
    deliver(j, "subagent-task-t1", "child", payload={"task_id": "t1"})
    deliver(j, "gone", "other")
    send(j, "open", "late")
    assert [r.message_id for r in j.claim("w1", T0, lease=10_000).rows] == ["open"]
    next_notice = NewMessage("notice-2", "focal", "next", payload={"task_id": "t2"})
    j.meanwhile, j.reopen, j.finish = [next_notice], "t1", "open"
    assert j.prune(CUTOFF, batch=10) == PruneCounts(rows=1, markers=1)
    j.meanwhile, j.reopen, j.finish = [], None, None
    assert j.get("open")["status"] == "delivered"
    assert j.prune(CUTOFF) == PruneCounts()
    assert ids(j) == ["notice", "subagent-task-t1", "open", "notice-2"]
    assert stores.store.marker_counts() == {"notice": 1, "subagent-task-t1": 1, "open": 1}
    assert j.prune(CUTOFF + 2) == PruneCounts(rows=1, markers=1)  # once it is old too
    assert ids(j) == ["notice", "subagent-task-t1", "notice-2"]


def test_old_rows_below_a_long_run_of_recent_ones_are_reached(stores: Stores) -> None:
    """Each batch looks through a bounded window of the journal's order: windows of recent
    rows delete nothing, and the walk goes on below them."""
    j = stores.journal
    for k in range(2):
        deliver(j, f"old{k}", f"o{k}")
    for k in range(45):
        deliver(j, f"new{k}", f"n{k}", T0 + 100)
    first = j.prune_batch(CUTOFF, batch=1)
    assert first.counts == PruneCounts() and first.before_seq is not None
    assert j.prune(CUTOFF, batch=1) == PruneCounts(rows=2, markers=2)
    assert len(ids(j)) == 45


def test_numbered_ids_of_a_product_are_no_chain(stores: Stores) -> None:
    """Only messages about a task are numbered in chains (a child's hand-backs and
    results, Focal's notices: their payload names the task). A product's own ids that end
    in numbers (``invoice-7``, ``invoice-8``...) are no chain: an old one goes although
    the next is recent, or the journal of a product numbering its messages never shrank."""
    j = stores.journal
    deliver(j, "invoice-7", "a")
    deliver(j, "invoice-7-2", "a")
    deliver(j, "invoice-8", "a", T0 + 100)
    deliver(j, "invoice-8-2", "b", T0 + 100)
    assert j.prune(CUTOFF, dry_run=True) == PruneCounts(rows=2, markers=2)
    assert j.prune(CUTOFF) == PruneCounts(rows=2, markers=2)
    assert ids(j) == ["invoice-8", "invoice-8-2"]


@pytest.mark.timeout(120)
def test_a_seq_is_never_handed_out_again_after_the_newest_rows_are_pruned(
        stores: Stores) -> None:
    """A reader that tails the journal by ``seq`` (the newest page, then the rows past the
    last ``seq`` it saw) sees every message: pruning the newest rows (a retention pass
    stops after a batch, or prunes them all) gives their numbers to no later send."""
    j = stores.journal

    def tail(seen: int) -> tuple[list[str], int]:
        rows = j.rows(limit=10)
        return ([r["message_id"] for r in rows if r["seq"] > seen],
                max([seen, *(r["seq"] for r in rows)]))

    for k in range(4):
        deliver(j, f"m{k}", f"s{k}")
    _, seen = tail(0)
    assert j.prune_batch(CUTOFF, batch=2).counts.rows == 2  # m3 and m2, the newest
    deliver(j, "after-a-batch", "s9")
    new, seen = tail(seen)
    assert new == ["after-a-batch"]
    assert j.prune(CUTOFF).rows == 3
    assert ids(j) == []
    send(j, "after-all", "s9")
    assert tail(seen)[0] == ["after-all"]
