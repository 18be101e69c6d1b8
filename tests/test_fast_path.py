"""The enqueue fast path and the writes a message saves on it.

An exclusive SQLite runtime enqueues with a lease: a new row that will be its
target's head is inserted already ``processing``, leased to the runtime, and
comes back as ``claimed`` for the session at once (no claim, no second write
of the row); any other row is inserted pending. PostgreSQL rows always go
through a claim.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kinbox.persistence import ClaimedRow, Lease, NewMessage, is_postgres

from .conftest import Stores
from .test_set_wise import in_one_batch

T0 = 1000.0
LEASE = Lease("w", 30.0)


class InboxUpdates:
    """Counts the UPDATEs of inbox rows that go through ``db.execute_sql``."""

    def __init__(self, stores: Stores) -> None:
        self.db, self.real, self.count = stores.tables.db, stores.tables.db.execute_sql, 0

    def __call__(self, sql: str, params: Any = None, *args: Any, **kw: Any) -> Any:
        if sql.lstrip().upper().startswith("UPDATE AGENT_INBOX_MESSAGES"):
            self.count += 1
        return self.real(sql, params, *args, **kw)


@pytest.fixture
def sqlite_stores(tmp_path: Path) -> Iterator[Stores]:
    s = Stores(f"sqlite:///{tmp_path / 'fast.db'}")
    yield s
    s.close()


def _row(stores: Stores, message_id: str) -> dict[str, Any]:
    return stores.journal.get(message_id)


@pytest.mark.timeout(60)
def test_a_new_head_is_inserted_leased_and_handed_back_in_one_write(
        sqlite_stores: Stores) -> None:
    stores, journal = sqlite_stores, sqlite_stores.journal
    stores.store.create_session("s1", None, "S1", "interactive", 0.0)
    updates = InboxUpdates(stores)
    stores.tables.db.execute_sql = updates  # type: ignore[method-assign]
    try:
        first = journal.enqueue(NewMessage("m1", "s1", "hello", sender="u",
                                           payload={"b": [1, 2], "a": "x"}), T0, lease=LEASE)
        second = journal.enqueue(NewMessage("m2", "s1", "again"), T0 + 1, lease=LEASE)
    finally:
        stores.tables.db.execute_sql = updates.real  # type: ignore[method-assign]
    assert updates.count == 0  # each row written once, by its insert
    row = _row(stores, "m1")
    assert (row["status"], row["lease_owner"], row["lease_until"]) == ("processing", "w", T0 + 30)
    # The row handed back is the one a claim would read from the database.
    assert first.claimed == ClaimedRow("m1", row["seq"], "s1", "u", "agent_message", "hello",
                                       {"a": "x", "b": [1, 2]}, 0, T0)
    assert second.claimed is None  # behind the head: pending, for the head's chain
    assert (_row(stores, "m2")["status"], _row(stores, "m2")["lease_owner"]) == ("pending", None)
    session = stores.store.session("s1")
    assert session is not None and session.status == "active"


@pytest.mark.timeout(60)
def test_in_one_batch_only_the_first_new_row_of_an_idle_target_is_leased(
        sqlite_stores: Stores) -> None:
    stores, journal = sqlite_stores, sqlite_stores.journal
    journal.enqueue(NewMessage("busy-1", "busy", "x"), T0)  # an open row, not leased
    msgs = [NewMessage("a1", "a", "x"), NewMessage("busy-2", "busy", "x"),
            NewMessage("a2", "a", "x"), NewMessage("b1", "b", "x")]
    results = in_one_batch(stores, [lambda m=m: journal.enqueue(m, T0, lease=LEASE)
                                    for m in msgs])
    assert stores.writer.statistics().bulk_runs >= 1
    # The batch's order decides which of a's rows is first: the one with the lower seq.
    a_first = min(("a1", "a2"), key=lambda mid: _row(stores, mid)["seq"])
    leased = {r.message_id for r in results if r.claimed is not None}
    assert leased == {a_first, "b1"}
    for mid in ("a1", "a2", "busy-1", "busy-2", "b1"):
        assert _row(stores, mid)["status"] == ("processing" if mid in leased else "pending")


@pytest.mark.timeout(60)
def test_postgres_rows_go_through_a_claim_even_when_a_lease_is_asked(stores: Stores) -> None:
    if not is_postgres(stores.tables.db):
        pytest.skip("SQLite takes the fast path (the tests above)")
    result = stores.journal.enqueue(NewMessage("m1", "s1", "x"), T0, lease=LEASE)
    assert result.claimed is None and _row(stores, "m1")["status"] == "pending"
    assert [r.message_id for r in stores.journal.claim("w", T0).rows] == ["m1"]
