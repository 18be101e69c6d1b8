"""``dbos``: DBOS Transact on SQLite, written the way a DBOS user would for many sessions.

A workflow per message on one queue partitioned by session (partition
concurrency 1, so a session's workflows run one at a time), the handler's
reply a step, queue polling every 0.01 s (DBOS's default of 1 s is slower
still). The system database is SQLite in WAL with ``synchronous=FULL``, set
on every connection DBOS opens. Each run is a child process
(``python -m kinbox.actors.bench_dbos_child``) because DBOS keeps a
process-wide instance and registry; the child prints one JSON line.

DBOS delivers 120-300 messages/s here, so its run is bounded by message
count (``DBOS_MESSAGES``) and reports the count it ran; a rate is a rate.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from .bench_workload import Measured, Workload

QUICK_MESSAGES = 10_000  # the quick throughput workload; anything larger is a full run
DBOS_MESSAGES = {"quick": 1_000, "full": 5_000}


def bounded(w: Workload) -> Workload:
    """The workload DBOS runs: at most 1,000 messages for a quick-sized one, 5,000 beyond.

    Same sessions, producers and payload; only the count is cut.
    """
    limit = DBOS_MESSAGES["quick" if w.messages <= QUICK_MESSAGES else "full"]
    return replace(w, messages=min(w.messages, limit))


def run_dbos(w: Workload, workdir: Path) -> Measured:
    """One DBOS run in a child process, on the bounded workload."""
    run = bounded(w)
    args = [sys.executable, "-m", "kinbox.actors.bench_dbos_child", str(workdir / "dbos.sqlite"),
            str(run.sessions), str(run.messages), str(run.payload), str(run.producers)]
    child = subprocess.run(args, capture_output=True, text=True, timeout=3600, cwd=workdir)
    if child.returncode != 0:
        raise RuntimeError(f"the dbos child failed ({child.returncode}): {child.stderr[-2000:]}")
    data = json.loads(child.stdout.strip().splitlines()[-1])
    return Measured(data["elapsed"], data["latencies"], {},
                    data["order_violations"], run.messages if run.messages != w.messages
                    else None)
