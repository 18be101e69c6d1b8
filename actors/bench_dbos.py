"""``dbos``: DBOS Transact on SQLite, written the way a DBOS user would for many sessions.

A workflow per message on one queue partitioned by session (partition
concurrency 1, so a session's workflows run one at a time), the handler's
reply a step, queue polling every 0.01 s (DBOS's default of 1 s is slower
still). The system database is SQLite in WAL with ``synchronous=FULL``, set
on every connection DBOS opens. Each run is a child process
(``python -m kinbox.actors.bench_dbos_child``) because DBOS keeps a
process-wide instance and registry; the child prints one JSON line.

DBOS delivers 120-300 messages/s here, so the runner gives it fewer messages
than the other systems (``bench_systems.MESSAGE_BOUNDS``); a rate is a rate.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .bench_workload import Measured, Workload


def run_dbos(w: Workload, workdir: Path) -> Measured:
    """One DBOS run of ``w`` in a child process."""
    args = [sys.executable, "-m", "kinbox.actors.bench_dbos_child", str(workdir / "dbos.sqlite"),
            str(w.sessions), str(w.messages), str(w.payload), str(w.producers)]
    child = subprocess.run(args, capture_output=True, text=True, timeout=3600, cwd=workdir)
    if child.returncode != 0:
        raise RuntimeError(f"the dbos child failed ({child.returncode}): {child.stderr[-2000:]}")
    data = json.loads(child.stdout.strip().splitlines()[-1])
    return Measured(data["elapsed"], data["latencies"], {}, data["order_violations"])
