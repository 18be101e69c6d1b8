"""Several worker processes on one PostgreSQL, one of them SIGKILLed and restarted on a beat,
and the checks of what they did: nothing lost, no turn committed twice, per-session order,
and no two turns of one session running at the same time in any two processes.

Times are the server's (``clock_timestamp()``), so records from processes whose own clocks
disagree (one runs under ``faketime``) still compare.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from kinbox.actors import Runtime

from .helpers import wait_for
from .scale_child import TABLE_SQL

CHILD = Path(__file__).with_name("scale_child.py")
LIBFAKETIME = next((p for p in (Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
                                  Path("/usr/lib/faketime/libfaketime.so.1")) if p.is_file()),
                   None)
SKEWS = ("+10m", "-10m")
"""A worker's clock ten minutes fast, another's ten minutes slow."""


def require_faketime() -> Path:
    """libfaketime (Debian package ``libfaketime``); skips without it, fails in CI.

    Preloaded into the worker itself rather than run through the ``faketime``
    command, which forks: a SIGKILL would hit the wrapper and orphan the worker.
    """
    if LIBFAKETIME is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the clock-skew test: install the libfaketime package")
        pytest.skip("the clock-skew test needs libfaketime (apt-get install faketime)")
    return LIBFAKETIME


@dataclass
class Workers:
    """Worker processes (``scale_child.py``); the ``skewed`` ones run with their wall clock
    off by :data:`SKEWS` in turn."""

    url: str
    count: int
    logs: Path
    skewed: tuple[int, ...] = ()
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    last_kill: float = 0.0
    ready: dict[int, float] = field(default_factory=dict)
    """pid -> when (``time.monotonic()``) that process said it was delivering."""
    slots: dict[int, int] = field(default_factory=dict)
    """pid -> which worker (0..count-1) that process was."""
    killed: dict[int, float] = field(default_factory=dict)
    """pid -> the server's time just before that process was sent SIGKILL."""

    def start(self) -> None:
        for i in range(self.count):
            self.spawn(i)

    def spawn(self, i: int) -> None:
        env = dict(os.environ)
        if i in self.skewed:
            skew = SKEWS[self.skewed.index(i) % len(SKEWS)]
            # The wall clock only: with the monotonic clock faked too, every timed wait
            # (pthread_cond_timedwait) of the worker would wait ten minutes.
            env.update(LD_PRELOAD=str(require_faketime()), FAKETIME=skew,
                       FAKETIME_DONT_FAKE_MONOTONIC="1")
        with open(self.logs / f"worker{i}.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, str(CHILD), self.url], env=env,
                                    stdout=subprocess.PIPE, stderr=log)
        self.procs[i], self.slots[proc.pid] = proc, i
        threading.Thread(target=self._watch, args=(proc,), daemon=True).start()

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:  # to its end: a full pipe would block the worker
            if line.strip() == b"ready":
                self.ready[proc.pid] = time.monotonic()

    def victim(self, every: float) -> int | None:
        """The worker to kill now, if any: the one that has delivered the longest, once it
        has for ``every`` seconds and the last kill was as long ago (the first kill: as
        soon as one delivers). Never one still starting: on a loaded machine a start
        (imports, the runtime's) took longer than the beat, each restarted worker was
        killed before it delivered anything, and the rows stayed where the first three
        left them."""
        ready = [(self.ready[p.pid], i) for i, p in self.procs.items() if p.pid in self.ready]
        if not ready:
            return None
        since, i = min(ready)
        if self.killed and time.monotonic() < max(self.last_kill, since) + every:
            return None
        return i

    def kill_and_restart(self, i: int, server_now: Any) -> None:
        proc = self.procs[i]
        # Before the signal: a turn cut short ran until then (a doomed process's last
        # microseconds do not count), and no other process may start its row before.
        # Read after the reaping instead, a takeover landing in between would look like
        # an overlap.
        self.killed[proc.pid] = server_now()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        self.last_kill = time.monotonic()
        self.spawn(i)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


class Db:
    """The test's own connection: counts, records, and the server's clock."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg2.connect(url)
        self.conn.autocommit = True
        self.lock = threading.Lock()

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        with self.lock, self.conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall() if cur.description else []

    def now(self) -> float:
        return float(self.rows("SELECT EXTRACT(EPOCH FROM clock_timestamp())")[0][0])

    def counts(self) -> dict[str, int]:
        return dict(self.rows("SELECT status, COUNT(*) FROM agent_inbox_messages "  # type: ignore[arg-type]
                              "GROUP BY status"))

    def close(self) -> None:
        self.conn.close()


def sessions_for(url: str, data_dir: str, sessions: int) -> tuple[Runtime, list[str]]:
    """A send-only runtime (left running) and ``sessions`` new sessions' ids."""
    rt = Runtime(db=url, data_dir=data_dir).start()
    project = rt.create_project("scale")
    sids = [rt.create_session(project.id, f"S{i}").id for i in range(sessions)]
    return rt, sids


def send_in_background(rt: Runtime, sids: list[str], messages: int) -> threading.Thread:
    """Post ``messages`` sends round-robin over ``sids`` from 4 threads, in the background."""
    counter = itertools.count()

    def one(_: int) -> None:
        i = next(counter)
        rt.post(sids[i % len(sids)], f"message {i}")

    def run() -> None:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(one, range(messages)))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def run_with_kills(db: Db, workers: Workers, total: int, every: float, deadline: float) -> int:
    """Once a tenth of ``total`` rows are delivered, kill (and restart) one worker every
    ``every`` seconds, the one delivering the longest first, until all are; return how
    many kills there were. A restarted worker is killed only once it has delivered for
    ``every`` seconds (:meth:`Workers.victim`): the beat slows down to the machine's
    starts."""
    end = time.monotonic() + deadline
    wait_for(lambda: db.counts().get("delivered", 0) >= total // 10, timeout=deadline,
             what="the first deliveries")
    beat = threading.Event()  # never set: waiting on it is the kill beat
    kills = 0
    while True:
        victim = None
        while time.monotonic() < end and db.counts().get("delivered", 0) < total:
            if not beat.wait(0.05) and (victim := workers.victim(every)) is not None:
                break
        else:
            if db.counts().get("delivered", 0) >= total:
                return kills
            raise AssertionError(f"not all delivered in {deadline}s: {db.counts()}")
        workers.kill_and_restart(victim, db.now)
        kills += 1


def check_outcome(db: Db, workers: Workers, total: int) -> dict[str, int]:
    """Assert the guarantees over what the workers did; return a few counts for the report."""
    assert db.counts() == {"delivered": total}  # 0 lost, 0 stuck in processing or pending
    assert db.rows("SELECT COUNT(*), COUNT(DISTINCT message_id) FROM delivery_markers") == [
        (total, total)]  # 0 duplicate committed turns
    seq = dict(db.rows("SELECT message_id, seq FROM agent_inbox_messages"))
    turns: dict[str, dict[str, Any]] = {}
    for turn_id, sid, mid, pid, phase, at in db.rows(
            "SELECT turn_id, session_id, message_id, pid, phase, at FROM scale_turns"):
        t = turns.setdefault(turn_id, {"sid": sid, "mid": mid, "pid": pid})
        t[phase] = at
    per_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    cut_short = 0
    for t in turns.values():
        if "end" not in t:
            cut_short += 1  # cut short: its process must have been killed
            assert t["pid"] in workers.killed, f"turn of {t['mid']} never ended in a live process"
            t["end"] = max(t["start"], workers.killed[t["pid"]])
        per_session[t["sid"]].append(t)
    for sid, ts in per_session.items():
        ts.sort(key=lambda t: t["start"])
        for a, b in itertools.pairwise(ts):
            assert a["end"] <= b["start"], (
                f"two turns of {sid} overlap: {a['mid']} in pid {a['pid']} until {a['end']}, "
                f"{b['mid']} in pid {b['pid']} from {b['start']}")
        mids = [k for k, _ in itertools.groupby(t["mid"] for t in ts)]
        assert mids == sorted(set(mids), key=lambda m: seq[m]), f"{sid} out of order"
        # A message runs again only after its process died: a live owner is never robbed.
        for a, b in itertools.pairwise(ts):
            if a["mid"] == b["mid"]:
                assert a["pid"] in workers.killed, (
                    f"{a['mid']} ran twice though pid {a['pid']} was alive")
    # The work really was shared across processes. Not necessarily by all three: a worker
    # that claims a session's head keeps leasing its next rows in its commits (up to the
    # chain limit), so with few sessions two workers can hold them all for a whole run.
    slots = {workers.slots[t["pid"]] for t in turns.values()}
    assert len(slots) >= 2, f"only workers {slots} ran turns"
    return {"turns": len(turns), "cut_short": cut_short}


def create_turn_table(db: Db) -> None:
    """A fresh ``scale_turns`` table (not one of kinbox's: the fixture leaves it alone)."""
    db.rows("DROP TABLE IF EXISTS scale_turns")
    db.rows(TABLE_SQL)
