"""Kill a runtime process at random moments, restart it, and check what survived.

``run_with_kills`` drives the child; ``check`` returns every violation of
the delivery guarantees it can prove from the database and the turn log:
lost messages, message ids with more than one committed turn, messages run
again after their acknowledgement, and per-target order broken.
"""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kinbox.persistence import NewMessage

from .conftest import Stores

CHILD = Path(__file__).with_name("crash_child.py")


@dataclass
class CrashRun:
    """What happened during a run with kills."""

    url: str
    log: Path
    delivered_before_kill: list[set[str]] = field(default_factory=list)
    kills: int = 0
    lives: int = 0


def prepare(url: str, sessions: int, messages: int) -> list[str]:
    """Create the sessions and commit every message before any runtime starts."""
    s = Stores(url)
    try:
        for i in range(sessions):
            s.store.create_session(f"s{i:02d}", None, f"S{i}", "interactive", 0)
        ids = [f"m{k:05d}" for k in range(messages)]
        batch = [NewMessage(mid, f"s{k % sessions:02d}", f"payload {k}")
                 for k, mid in enumerate(ids)]
        for start in range(0, len(batch), 500):
            s.journal.enqueue_many(batch[start:start + 500], 0)
        return ids
    finally:
        s.close()


def delivered(url: str) -> set[str]:
    """Ids of the rows in state ``delivered`` now."""
    s = Stores(url)
    try:
        return {r["message_id"] for r in s.journal.rows(state="delivered")}
    finally:
        s.close()


def _spawn(run: CrashRun, faults: tuple[str, ...]) -> subprocess.Popen[str]:
    run.lives += 1
    proc = subprocess.Popen([sys.executable, str(CHILD), run.url, str(run.log), str(run.lives),
                             *faults], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the child is up (or dies)
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"child did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc


def run_with_kills(url: str, log: Path, kills: int, seed: int,
                   faults: tuple[str, ...] = ()) -> CrashRun:
    """Start the child, SIGKILL it ``kills`` times at random moments, then let it finish."""
    rng = random.Random(seed)
    run = CrashRun(url, log)
    while run.kills < kills:
        proc = _spawn(run, faults)
        try:
            proc.wait(timeout=rng.uniform(0.0, 0.04))  # the kill moment
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            run.kills += 1
            run.delivered_before_kill.append(delivered(url))
        else:
            break  # it finished everything before this kill
    proc = _spawn(run, faults)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return run


def check(run: CrashRun, ids: list[str]) -> list[str]:
    """Every guarantee violation the evidence shows; empty when all held."""
    s = Stores(run.url)
    try:
        rows = {r["message_id"]: r for r in s.journal.rows()}
        markers = s.store.marker_counts()
        tables = s.tables
        order = [(m.session_id, m.message_id) for m in
                 tables.marker.select().order_by(tables.marker.id)]
    finally:
        s.close()
    problems: list[str] = []
    for mid in ids:
        row = rows.get(mid)
        if row is None or row["status"] != "delivered":
            problems.append(f"{mid} not delivered ({row and row['status']})")
        elif markers.get(mid, 0) == 0:
            problems.append(f"{mid} acknowledged without a committed turn (lost)")
        if markers.get(mid, 0) > 1:
            problems.append(f"{mid} has {markers[mid]} committed turns")
    starts: dict[int, set[str]] = {}
    for line in run.log.read_text().splitlines():
        life, mid = line.split()
        starts.setdefault(int(life), set()).add(mid)
    for k, acked in enumerate(run.delivered_before_kill):
        # kill number k ended life k + 1; later lives must not run what it had acked
        for life in range(k + 2, run.lives + 1):
            for mid in sorted(acked & starts.get(life, set())):
                problems.append(f"{mid} acknowledged before kill {k + 1} but ran in life {life}")
    seq = {mid: rows[mid]["seq"] for mid in rows}
    per_target: dict[str, list[int]] = {}
    for session_id, mid in order:
        per_target.setdefault(session_id, []).append(seq[mid])
    for session_id, seqs in per_target.items():
        if seqs != sorted(seqs):
            problems.append(f"turns of {session_id} committed out of order")
    return problems
