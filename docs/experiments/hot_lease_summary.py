"""Medians (and ranges) over the runs of hot_lease_measure.py's output, per mode and variant.

Usage: python docs/experiments/hot_lease_summary.py out.jsonl
A message is one lease and one ack; a turn, a claim's lease and a commit's ack and lease.
"""

import json
import statistics
import sys
from collections import defaultdict

runs: dict = defaultdict(list)
with open(sys.argv[1]) as lines:
    for line in lines:
        r = json.loads(line)
        runs[(r["commit"], r["explain"], r["variant"])].append(r)


def spread(rows: list, f) -> str:
    values = sorted(f(r) for r in rows)
    return f"{statistics.median(values):.2f} ({values[0]:.2f}-{values[-1]:.2f})"


def per_row(field: str, *whats: str, scale: float = 1000):
    return lambda r: (
        scale * sum(r[f"{w}_{field}"] for w in whats) / sum(r[f"{w}_rows"] for w in whats)
    )


for (commit, explain, v), rows in sorted(runs.items(), key=lambda kv: (kv[0][0], not kv[0][1])):
    mode = ("committed" if commit else "rolled back") + (", EXPLAIN" if explain else ", wall")
    out = [
        f"{mode} {v} n={len(rows)}",
        "HOT/updates " + spread(rows, lambda r: r["hot_upd"]) + f"/{rows[0]['upd']}",
    ]
    if explain:
        out += [
            "lease own us/row: claim " + spread(rows, per_row("own_ms", "claim_lease")),
            "commit " + spread(rows, per_row("own_ms", "commit_lease")),
            "ack own " + spread(rows, per_row("own_ms", "ack")),
            "commit lease+ack own us/msg "
            + spread(
                rows, lambda r: per_row("own_ms", "commit_lease")(r) + per_row("own_ms", "ack")(r)
            ),
            "with input "
            + spread(rows, lambda r: per_row("ms", "commit_lease")(r) + per_row("ms", "ack")(r)),
            "WAL B/row lease "
            + spread(rows, per_row("wal", "claim_lease", "commit_lease", scale=1)),
            "ack " + spread(rows, per_row("wal", "ack", scale=1)),
            "statement us/turn: claim "
            + spread(rows, lambda r: 1000 * r["claim_exec_ms"] / r["claim_lease_rows"]),
            "commit " + spread(rows, lambda r: 1000 * r["commit_exec_ms"] / r["ack_rows"]),
            "expiry walk ms " + spread(rows, lambda r: r["proc_window_ms"]),
        ]
        if "proc_heads_ms" in rows[0]:
            out.append("heads walk ms " + spread(rows, lambda r: r["proc_heads_ms"]))
    else:
        turns = rows[0]["upd"] / 3
        out += [
            "wall us/turn: claim " + spread(rows, lambda r, t=turns: 1000 * r["claim_wall_ms"] / t),
            "commit " + spread(rows, lambda r, t=turns: 1000 * r["commit_wall_ms"] / t),
        ]
    out.append(
        "LSN B/turn "
        + spread(rows, lambda r: 3 * (r["claim_lsn_bytes"] + r["commit_lsn_bytes"]) / r["upd"])
    )
    print(" | ".join(out))

# Paired within each run (the same load on both sides): each variant's figure over (a)'s.
PAIRED = {
    "lease+ack own": lambda r: per_row("own_ms", "commit_lease")(r) + per_row("own_ms", "ack")(r),
    "with input": lambda r: per_row("ms", "commit_lease")(r) + per_row("ms", "ack")(r),
    "claim+commit statements": lambda r: r["claim_exec_ms"] + r["commit_exec_ms"],
}
WALL = {"claim+commit wall": lambda r: r["claim_wall_ms"] + r["commit_wall_ms"]}
WALL["LSN bytes"] = lambda r: r["claim_lsn_bytes"] + r["commit_lsn_bytes"]
by_run: dict = defaultdict(dict)
for (commit, explain, v), rows in runs.items():
    for r in rows:
        by_run[(commit, explain, r["run"])][v] = r
for commit, explain in sorted({k[:2] for k in by_run}, key=lambda k: (k[0], not k[1])):
    keys = [k for k in by_run if k[:2] == (commit, explain)]
    mode = ("committed" if commit else "rolled back") + (", EXPLAIN" if explain else ", wall")
    for v in sorted({v for k in keys for v in by_run[k]} - {"a"}):
        out = [f"{mode} {v} / a"]
        for name, f in (PAIRED if explain else WALL).items():
            pairs = [by_run[k] for k in keys if v in by_run[k] and "a" in by_run[k]]
            out.append(f"{name} " + spread(pairs, lambda p, f=f, v=v: f(p[v]) / f(p["a"])))
        print(" | ".join(out))
