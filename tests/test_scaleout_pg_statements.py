"""PostgreSQL's fused claim and commit statements: their plans and their edge cases.

A claim is two statements (``pg_claims.PgClaims.claim_plain``: the candidates,
then one statement that locks them and leases the plain ones); a batch of
turn commits is one (``pg_commits.PgTurnSql.sql_commit``). These tests pin
what the fusing must not change: a next head another transaction holds is
skipped, never waited for; a head that needs more than its lease (a takeover)
goes through the full rules in the same claim, and a suspect one waits for a
runtime with room for it; and the markers are probed by index whatever the
markers table's statistics say.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinbox.persistence import NewMessage, TurnEntry, bulk_sql, open_database
from kinbox.persistence.pg_params import float8_array, text_array

from .conftest import Stores
from .helpers import pg_seq_scans
from .test_set_wise import commit, in_one_batch

pytestmark = pytest.mark.postgres

T0 = 1000.0


@pytest.fixture
def pg(pg_url: str) -> Iterator[Stores]:
    s = Stores(pg_url)
    yield s
    s.close()


@pytest.mark.timeout(120)
def test_markers_are_probed_by_index_when_their_statistics_say_the_table_is_empty(
        pg: Stores) -> None:
    # As in a drain: the markers table analyzed empty, then filled by the turns. An EXISTS
    # probe became a hashed subplan reading every marker in each claim and each commit.
    db, j = pg.tables.db, pg.journal
    db.execute_sql("ANALYZE delivery_markers")
    j.enqueue_many([NewMessage(f"m{i:05d}", f"t{i % 100:02d}", "x", sender="u")
                    for i in range(200)], T0)
    db.execute_sql("INSERT INTO delivery_markers (session_id, message_id, created_at) "
                   "SELECT 'old', 'done' || g, 0 FROM generate_series(1, 2000) g")
    ids = [f"m{i:05d}" for i in range(5)]  # a few heads, as a commit batch's next heads
    targets = [f"t{i:02d}" for i in range(5)]
    claims, turns = j.bulk.pg, j.bulk.pg_turns
    assert claims is not None and turns is not None
    statements = [
        (claims.sql_lock, (ids, T0, T0)),
        (claims.sql_lease_plain, {"ids": ids, "now": T0, "owner": "w", "until": T0 + 30,
                                  "limit": 5}),
        (turns.sql_commit, {"now": T0, "ids": ids, "owner": "w", "until": T0 + 30,
                            "chaining": targets, "chain_at": [T0] * len(targets),
                            "entries": "[]", "markers": "[]", "processing": "processing"}),
    ]
    for sql, params in statements:
        assert pg_seq_scans(db, sql, params, "delivery_markers") == [], sql[:60]


@pytest.mark.timeout(60)
def test_the_prepared_commit_plans_again_as_the_markers_table_grows(pg: Stores) -> None:
    # A drain on a fresh database: the commit's generic plan is made in its first batches,
    # when a sequential read of the markers is the cheapest probe; kept, it read every
    # marker for each next head (three times the server's CPU per message by 10,000).
    db, turns = pg.tables.db, pg.journal.bulk.pg_turns
    assert turns is not None
    db.execute_sql("ANALYZE delivery_markers")
    args = ("w", [], [], [], [("t00", T0)], T0 + 30, T0)
    params = {"now": T0, "ids": [], "owner": "w", "until": T0 + 30, "chaining": ["t00"],
              "chain_at": [T0], "entries": "[]", "markers": "[]", "processing": "processing"}

    def commits(n: int) -> list[str]:
        with db.atomic():
            for _ in range(n):
                assert turns.commit_batch(*args).acked == 0
            return pg_seq_scans(db, turns.commit.execute_text, params, "delivery_markers")

    assert commits(turns.commit.REPLAN_FIRST) == ["Seq Scan"]  # right for an empty table
    db.execute_sql("INSERT INTO delivery_markers (session_id, message_id, created_at) "
                   "SELECT 'old', 'done' || g, 0 FROM generate_series(1, 2000) g")
    assert commits(turns.commit.REPLAN_FIRST) == []


@pytest.mark.timeout(30)
def test_a_batch_commit_skips_a_next_head_another_transaction_holds(pg: Stores,
                                                                    pg_url: str) -> None:
    j = pg.journal
    pg.store.create_project("p", "p", "p", T0)
    pg.store.create_many([(s, "p", s, "interactive") for s in ("s1", "s2")], T0)
    for n in (1, 2):
        for s in ("s1", "s2"):
            j.enqueue(NewMessage(f"{s}-{n}", s, "hi", sender="u"), T0)
    heads = sorted(j.claim("w1", T0).rows, key=lambda r: r.target)
    other = open_database(pg_url)
    try:
        with other.atomic():  # another process's claim, mid-transaction, holds s1's next head
            other.execute_sql("SELECT 1 FROM agent_inbox_messages WHERE message_id = 's1-2' "
                              "FOR UPDATE")
            following = in_one_batch(pg, [commit(pg, "w1", r.target, r.message_id)
                                          for r in heads])
        assert following[0] is None  # skipped, not waited for (the timeout would fail it)
        assert following[1] is not None and following[1].message_id == "s2-2"
        assert pg.writer.statistics().bulk_runs >= 1
        rows = {r["message_id"]: r["status"] for r in j.rows()}
        assert rows == {"s1-1": "delivered", "s2-1": "delivered", "s1-2": "pending",
                        "s2-2": "processing"}
        assert (pg.store.session("s1").status, pg.store.session("s2").status) == (
            "idle", "active")
        assert [r.message_id for r in j.claim("w2", T0 + 1).rows] == ["s1-2"]
    finally:
        other.close()


@pytest.mark.timeout(30)
def test_one_claim_leases_plain_heads_and_takes_over_an_expired_one_by_the_full_rules(
        pg: Stores) -> None:
    j = pg.journal
    for s in ("s1", "s2", "s3"):
        j.enqueue(NewMessage(f"{s}-1", s, "hi", sender="u"), T0)
    [dead] = j.claim("dead", T0, lease=5, exclude={"s2", "s3"}).rows
    j.mark_turn_started("dead", dead.message_id, T0 + 1)  # it died mid-turn
    got = {r.message_id: r for r in j.claim("w", T0 + 10, lease=30).rows}
    assert sorted(got) == ["s1-1", "s2-1", "s3-1"]
    assert got["s1-1"].taken_over and got["s1-1"].attempts == 1
    assert not got["s2-1"].taken_over and got["s2-1"].attempts == 0
    assert {r["message_id"]: (r["status"], r["lease_owner"]) for r in j.rows()} == {
        m: ("processing", "w") for m in got}
    assert [e["event"] for e in j.history("s1-1")] == ["interrupted"]
    j.complete_turn("w", "s1", ["s1-1"], [TurnEntry("assistant", "ok")], T0 + 11)
    assert pg.store.marker_counts() == {"s1-1": 1}


@pytest.mark.timeout(30)
def test_a_claim_with_no_room_for_a_suspect_leases_only_the_plain_heads(pg: Stores) -> None:
    j = pg.journal
    for s in ("s1", "s2"):
        j.enqueue(NewMessage(f"{s}-1", s, "hi", sender="u"), T0)
    j.claim("dead", T0, lease=5, exclude={"s2"})
    rows = j.claim("w", T0 + 10, suspects=0).rows
    assert [r.message_id for r in rows] == ["s2-1"]
    assert j.get("s1-1")["lease_owner"] == "dead"  # untouched: claimable by a runtime with room


@pytest.mark.timeout(30)
def test_a_lone_commit_whose_next_head_has_a_turn_goes_by_the_rules_one_by_one(
        pg: Stores) -> None:
    # A commit alone in its batch runs the set-wise statement too; what that declines (here
    # a next head whose turn already committed) is undone and done by the one-by-one rules.
    j = pg.journal
    for n in (1, 2, 3):
        j.enqueue(NewMessage(f"m{n}", "s1", "hi", sender="u"), T0)
    [head] = j.claim("w", T0).rows
    j.writer.call(lambda: j.write_turn("s1", ["m2"], [], T0))  # m2's turn, ack lost
    following = j.complete_turn("w", "s1", [head.message_id], [TurnEntry("assistant", "ok")],
                                T0 + 1, next_lease=30.0)
    assert following is not None and following.message_id == "m3"
    assert {r["message_id"]: r["status"] for r in j.rows()} == {
        "m1": "delivered", "m2": "delivered", "m3": "processing"}
    assert pg.store.marker_counts() == {"m1": 1, "m2": 1}
    assert [(e.role, e.text) for e in pg.store.transcript("s1")] == [("assistant", "ok")]


@pytest.mark.timeout(60)
def test_a_batch_commit_keeps_every_entry_value_and_its_order(pg: Stores) -> None:
    # The fused commit carries entries and markers as JSON texts: what it writes must be
    # what the turns gave, bit for bit and in order, whatever the text holds.
    j = pg.journal
    pg.store.create_project("p", "p", "p", T0)
    pg.store.create_many([(s, "p", s, "interactive") for s in ("s1", "s2")], T0)
    for s in ("s1", "s2"):
        j.enqueue(NewMessage(f"{s}-1", s, "hi", sender="u"), T0)
    heads = sorted(j.claim("w1", T0).rows, key=lambda r: r.target)
    texts = {"s1": ['say "hi" \\ back', "line one\nline two\ttab", "{\"json\": [1, 2]}"],
             "s2": ["emoji \U0001f600 and accents éà", "%s %(x)s %% ?", "'; DROP TABLE x; --"]}
    at = {"s1": T0 + 0.1 + 1e-9, "s2": 1764663123.456789}

    def turn(session: str, mid: str) -> Any:
        entries = [TurnEntry("user", mid, True, mid, "agent-7", "agent_message"),
                   *(TurnEntry("assistant", t, False) for t in texts[session])]
        return lambda: j.complete_turn("w1", session, [mid], entries, at[session],
                                       next_lease=30.0)

    assert in_one_batch(pg, [turn(r.target, r.message_id) for r in heads]) == [None, None]
    for r in heads:
        got = [(e.role, e.text, e.visible, e.message_id, e.sender_id, e.kind, e.created_at)
               for e in pg.store.transcript(r.target)]
        assert got == [("user", r.message_id, True, r.message_id, "agent-7", "agent_message",
                        at[r.target]),
                       *(("assistant", t, False, None, None, None, at[r.target])
                         for t in texts[r.target])]
    assert pg.store.marker_counts() == {"s1-1": 1, "s2-1": 1}


@pytest.mark.timeout(60)
def test_array_literals_round_trip_any_text_and_every_float_bit(pg_url: str) -> None:
    # The turn commit's ids, targets and times travel as literals (pg_params.text_array,
    # float8_array), and a claim's ids and busy targets.
    conn = psycopg2.connect(pg_url)
    try:
        cur = conn.cursor()

        @settings(max_examples=300, deadline=None)
        @given(texts=st.lists(st.text().filter(lambda t: "\x00" not in t), max_size=8),
               floats=st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=8))
        def round_trip(texts: list[str], floats: list[float]) -> None:
            cur.execute("SELECT %s::text[], %s::float8[]",  # PostgreSQL text has no NUL
                        (text_array(texts), float8_array(floats)))
            got_texts, got_floats = cur.fetchone()
            assert got_texts == texts
            assert [repr(f) for f in got_floats] == [repr(f) for f in floats]  # -0.0 too

        round_trip()
    finally:
        conn.close()


def test_a_text_array_takes_text_only() -> None:
    with pytest.raises(TypeError):
        text_array(["a", 1])  # type: ignore[list-item]  # would become the text "1.0"


@pytest.mark.timeout(60)
def test_new_rows_read_back_on_postgresql_as_on_sqlite(pg: Stores, db_url: str) -> None:
    # PostgreSQL's new rows travel as one JSON text (bulk_sql._PG_NEW_ROWS): every value
    # must land in its column as SQLite's multi-row VALUES puts it, nulls and numbers too.
    msgs = [NewMessage("m0", "s1", "plain"),
            NewMessage("m1", "s2", "ünï \\ \"quoted\" 'q' ${x} %s 😀", kind="subagent_result",
                       sender="s0", payload={"k": [1, 2.5, None], "ü": "ß"}),
            NewMessage("m2", "s1", "to a peer", transport="peer", destination_peer_id="dev-1",
                       max_attempts=9),
            NewMessage("m3", "s3", "x" * 20_000)]
    sqlite = Stores(db_url)
    try:
        expected = sqlite.journal.enqueue_many(msgs, T0 + 0.123456789)
        want = [{k: v for k, v in r.items() if k != "seq"} for r in sqlite.journal.rows()]
    finally:
        sqlite.close()
    assert pg.journal.enqueue_many(msgs, T0 + 0.123456789) == expected
    rows = pg.journal.rows()  # in seq order
    assert [{k: v for k, v in r.items() if k != "seq"} for r in rows] == want


@pytest.mark.timeout(60)
def test_new_rows_past_one_statements_size_go_in_several_in_order(
        pg: Stores, monkeypatch: pytest.MonkeyPatch) -> None:
    # A jsonb array holds at most 256 MiB: a batch with more text than PG_ROWS_CHARS goes in
    # several statements, numbered in order, a repeat in a later one found as in one.
    monkeypatch.setattr(bulk_sql, "PG_ROWS_CHARS", 1000)
    statements: list[str] = []
    execute = pg.db.execute_sql

    def counted(sql: str, params: Any = None) -> Any:
        statements.append(sql)
        return execute(sql, params)

    monkeypatch.setattr(pg.db, "execute_sql", counted)
    msgs = [NewMessage(f"m{i}", f"s{i % 3}", f"{i}" * 300) for i in range(10)]
    assert all(r.created for r in pg.journal.enqueue_many(msgs, T0))
    assert statements.count(bulk_sql._PG_NEW_ROWS) == 4  # 3 + 3 + 3 + 1 bodies of 300
    assert [r["message_id"] for r in pg.journal.rows()] == [f"m{i}" for i in range(10)]
    again = pg.journal.enqueue_many([NewMessage("n0", "s1", "x" * 600), msgs[9]], T0 + 1)
    assert [(r.message_id, r.created) for r in again] == [("n0", True), ("m9", False)]
    assert len(pg.journal.rows()) == 11
