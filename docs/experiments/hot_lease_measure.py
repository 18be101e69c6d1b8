"""Lease and ack costs of kinbox's PostgreSQL statements on schema variants (a HOT lease?):
on a fresh copy of hot_lease_fill.py's backlog per run, ROUNDS rounds of a claim's lease of 29
heads and a turn commit (the ack of an earlier 29, the lease of their sessions' next heads);
rolled back (EXPLAIN, then without), then each statement committed (EXPLAIN); interleaved.
Usage: python docs/experiments/hot_lease_measure.py URL [RUNS] [ROUNDS] > out.jsonl"""

import json
import sys
import time
from collections import Counter
from functools import reduce

import peewee as pw
import psycopg2

from kinbox.persistence.open_indexes import INBOX_INDEXES
from kinbox.persistence.pg_claims import PgClaims
from kinbox.persistence.pg_commits import PgTurnSql
from kinbox.persistence.pg_params import float8_array, json_rows, text_array

URL, BATCH, T = sys.argv[1], 29, "agent_inbox_messages"
RUNS, ROUNDS = int((sys.argv[2:3] or [5])[0]), int((sys.argv[3:4] or [20])[0])
CLOSED = "CASE WHEN status IN ('pending', 'processing') THEN NULL ELSE status END"
CLOSED = f"ADD COLUMN closed varchar(16) GENERATED ALWAYS AS ({CLOSED}) STORED"
OPEN = "WHERE closed IS NULL"
B_INDEXES = {"open_seq": f"(seq) {OPEN}", "open_target_seq": f"(target_chat_id, seq) {OPEN}"}
B_INDEXES["failed_seq"] = "(seq) WHERE closed = 'failed'"
A_INDEXES = {k: v.split(f"ON {T} ")[1] for k, v in INBOX_INDEXES.items()}
C_INDEXES = {k: v for k, v in A_INDEXES.items() if k != "agent_inbox_processing_seq"}
VARIANTS = {"a": (100, A_INDEXES), "a50": (50, A_INDEXES), "c_noproc": (100, C_INDEXES)}
VARIANTS |= {f"b{ff}": (ff, B_INDEXES) for ff in (100, 90, 70, 50)}
claims, turns = PgClaims(pw.PostgresqlDatabase(None)), PgTurnSql(pw.PostgresqlDatabase(None))
# kinbox's statements for variant b: open rows are ``closed IS NULL`` (no status).
FOR_B = [("o.status IN ('pending', 'processing')", "o.closed IS NULL")]
FOR_B += [("r.status = 'processing'", "r.closed IS NULL AND r.status = 'processing'")]
FOR_B += [(f"FROM {T} WHERE status = ", f"FROM {T} WHERE closed IS NULL AND status = ")]
HEADS = "SELECT h.* FROM sessions s CROSS JOIN LATERAL (SELECT o.message_id, o.status, "
HEADS += f"o.lease_until FROM {T} o WHERE o.target_chat_id = s.id AND o.closed IS NULL ORDER "
HEADS += "BY o.seq LIMIT 1) h WHERE h.status = 'processing' AND h.lease_until <= %s"
WINDOW = f"SELECT seq FROM {T} WHERE status = 'processing' AND seq > 0 ORDER BY seq LIMIT 116"


def for_b(sql: str) -> str:
    return reduce(lambda text, change: text.replace(*change), FOR_B, sql)


def prepare(cur, name: str, sql: str, params: str, b: bool) -> None:
    params, sql = [p.split(":") for p in params.split()], for_b(sql) if b else sql
    for i, (p, _) in enumerate(params):
        sql = sql.replace(f"%({p})s", f"${i + 1}")
    cur.execute(f"PREPARE {name}({', '.join(t for _, t in params)}) AS {sql}")


def modify_nodes(node: dict, out: list) -> list:
    """(alias, rows, total ms, ms and WAL bytes without its input) per ModifyTable."""
    kids = node.get("Plans", [])
    if node["Node Type"] == "ModifyTable":
        inner = [k for k in kids if k.get("Parent Relationship") == "Outer"]
        own = [node[f] - sum(k[f] for k in inner) for f in ("Actual Total Time", "WAL Bytes")]
        out.append((node["Alias"], node["Actual Rows"], node["Actual Total Time"], *own))
    for k in kids:
        modify_nodes(k, out)
    return out


def execute(cur, explain: bool, name: str, args: list, rec: Counter, key: str) -> None:
    """Run a prepared statement; wall time, WAL by LSN, and with ``explain`` its nodes."""
    cur.execute("SELECT pg_current_wal_insert_lsn()")
    lsn, start = cur.fetchone()[0], time.perf_counter()
    sql = f"EXECUTE {name}({', '.join(['%s'] * len(args))})"
    cur.execute(("EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " if explain else "") + sql, args)
    rows = cur.fetchall()
    rec[key + "_wall_ms"] += 1000 * (time.perf_counter() - start)
    cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (lsn,))
    rec[key + "_lsn_bytes"] += float(cur.fetchone()[0])
    if explain:
        rec[key + "_exec_ms"] += rows[0][0][0]["Execution Time"]
        for alias, *values in modify_nodes(rows[0][0][0]["Plan"], []):
            what = {"u": key + "_lease", T: "ack"}.get(alias, alias)  # or entries, markers
            for field, value in zip(("rows", "ms", "own_ms", "wal"), values, strict=True):
                rec[f"{what}_{field}"] += value


def run(v: str, explain: bool, commit: bool, run_no: int) -> dict:
    conn = psycopg2.connect(URL, options="-c plan_cache_mode=force_generic_plan")
    cur, conn.autocommit = conn.cursor(), True
    ff, indexes = VARIANTS[v]  # a fresh copy of the backlog
    cur.execute(f"DROP SCHEMA IF EXISTS {v} CASCADE; CREATE SCHEMA {v}; SET search_path = {v}")
    cur.execute(f"CREATE TABLE {T} (LIKE public.{T} INCLUDING DEFAULTS) WITH (fillfactor={ff})")
    if b := indexes is B_INDEXES:
        cur.execute(f"ALTER TABLE {T} {CLOSED}")
    for table in ("delivery_markers", "transcript_entries"):  # what a commit writes
        cur.execute(f"CREATE TABLE {table} (LIKE public.{table} INCLUDING ALL)")
    cur.execute(f"INSERT INTO {T} SELECT * FROM public.{T} ORDER BY seq")
    cur.execute(f"ALTER TABLE {T} ADD PRIMARY KEY (message_id); CREATE UNIQUE INDEX ON {T} (seq)")
    for name, definition in indexes.items():
        cur.execute(f"CREATE INDEX {name} ON {T} {definition}")
    cur.execute(f"ANALYZE {T}; SET search_path = {v}, public")
    first = claims.sql_window["pending"] if b else claims.sql_first  # b: expiry walk apart
    prepare(cur, "win", first, "now:float8 transport:text skip:text[] after:bigint window:int", b)
    params = "ids:text[] now:float8 owner:text until:float8 limit:int"
    prepare(cur, "lease", claims.sql_lease_plain, params, b)
    params = "now:float8 ids:text[] owner:text until:float8 chaining:text[] chain_at:float8[] "
    params += "entries:jsonb markers:jsonb processing:text"
    prepare(cur, "turn", turns.sql_commit, params, b)
    conn.autocommit = False
    rec = Counter({"variant": v, "explain": explain, "commit": commit, "run": run_no})
    now, owner, inflight = time.time(), "measure", []
    for _ in range(ROUNDS):
        cur.execute("EXECUTE win(%s, 'local', '{}', 0, 116)", (now,))
        ids = [r[0] for r in (r[-5:] for r in cur.fetchall()) if r[3] and r[2] <= now][:BATCH]
        lease = [text_array(ids), now, owner, now + 300, BATCH]
        execute(cur, explain, "lease", lease, rec, "claim")
        inflight.append(ids)
        conn.commit() if commit else None
        sql = f"SELECT message_id, target_chat_id FROM {T} WHERE message_id = ANY(%s) AND "
        cur.execute(sql + "status = 'processing'", (inflight.pop(0),))
        got = cur.fetchall()
        mids, targets = [m for m, _ in got], [s for _, s in got]
        pairs = [(m, s, r) for m, s in got for r in ("user", "assistant")]
        entries = [(s, r, "x" * 100, True, m, None, "agent_message", now) for m, s, r in pairs]
        turn = [now, text_array(mids), owner, now + 300, text_array(targets)]
        turn += [float8_array([now] * len(got)), json_rows(entries, 8)]
        turn += [json_rows([(s, m, now) for m, s in got], 3), "processing"]
        execute(cur, explain, "turn", turn, rec, "commit")
        sql = f"SELECT message_id FROM {T} WHERE target_chat_id = ANY(%s) AND "
        cur.execute(sql + "status = 'processing'", (targets,))
        inflight.append([r[0] for r in cur.fetchall()])
        conn.commit() if commit else None
    if explain:  # the lease-expiry walk as it is (a) and as it could be (b: HEADS)
        walks = {"proc_window": for_b(WINDOW) if b else WINDOW}
        walks |= {"proc_heads": HEADS} if b else {}
        for key, sql in walks.items():
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, (now,) if "%s" in sql else None)
            rec[key + "_ms"] = cur.fetchone()[0][0]["Execution Time"]
    conn.rollback()
    cur.execute("SELECT pg_stat_force_next_flush()")  # flushed as the backend waits
    conn.commit()
    sql = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = %s"
    cur.execute(sql + " AND relname = %s", (v, T))
    rec["upd"], rec["hot_upd"] = cur.fetchone()
    return rec  # the connection closes with ``conn``


for run_no in range(RUNS):
    order = list(VARIANTS)[run_no % len(VARIANTS) :] + list(VARIANTS)[: run_no % len(VARIANTS)]
    for explain, commit in ((True, False), (False, False), (True, True)):
        for v in order:
            print(json.dumps(run(v, explain, commit, run_no)), flush=True)
