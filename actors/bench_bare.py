"""``bare``: the smallest pipeline with kinbox's guarantees for one process, in raw sqlite3.

The yardstick for ``kinbox_vs_bare`` (issue #12): what the same guarantees
cost without the runtime around them. No kinbox code, one SQLite file (WAL,
``synchronous=FULL``):

- a send appends its row to the writer's open batch and waits for that
  batch's commit (group commit), so a send returns only once its row is durable;
- one writer thread commits each batch with one ``executemany`` per statement
  kind (inbox rows, transcript entries, delivery markers, acks) and only then
  hands the batch's new rows to their targets' in-memory mailboxes (no claim
  query for rows this process just wrote);
- 64 worker threads run the turns of sessions that have mail, at most one
  turn per session at a time and up to 16 turns of a session back to back
  before it yields its worker;
- each turn's transcript entries, its delivery marker and its ack go into the
  writer's next batch, and the turn's worker waits for that commit before the
  session's next turn, so per-session order holds and an acked row always has
  its turn committed with it.

On start the unacknowledged rows already in the file are put back in their
mailboxes in ``id`` order (what a restart after a crash needs).
"""

from __future__ import annotations

import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import bench_stages
from .bench_workload import Measured, Recorder, Workload, produce

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS inbox (id INTEGER PRIMARY KEY, target INTEGER NOT NULL,"
    " body TEXT NOT NULL, acked INTEGER NOT NULL DEFAULT 0)",
    "CREATE INDEX IF NOT EXISTS inbox_open ON inbox (acked, id)",
    "CREATE TABLE IF NOT EXISTS transcript (id INTEGER PRIMARY KEY, target INTEGER NOT NULL,"
    " role TEXT NOT NULL, text TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS markers (message_id INTEGER PRIMARY KEY,"
    " target INTEGER NOT NULL)",
)


class _Batch:
    """What the writer commits together; ``committed`` is set after the commit."""

    __slots__ = ("acks", "committed", "entries", "markers", "rows", "sends")

    def __init__(self) -> None:
        self.sends: list[tuple[Any, int, str]] = []
        """(id, target, body) of each new row: what the mailboxes get after the commit."""
        self.rows: list[tuple[Any, ...]] = []
        """The new rows as a variant writes them (``bare`` writes ``sends`` as they are)."""
        self.entries: list[tuple[Any, ...]] = []
        self.markers: list[tuple[Any, ...]] = []
        self.acks: list[tuple[Any, ...]] = []
        self.committed = threading.Event()

    def __bool__(self) -> bool:
        return bool(self.sends or self.markers)


class BarePipeline:
    """Durable sends, one writer, mailboxes filled after the commit, worker threads for turns.

    A variant that writes other rows (:mod:`.bench_bare_rows`) replaces ``schema``, the
    reads of :meth:`_top` and :meth:`_unacked`, the row :meth:`send` and
    :meth:`_commit_turn` queue, and the statements of :meth:`_write`."""

    schema: tuple[str, ...] = SCHEMA

    def __init__(self, path: Path, sessions: int, brain: Callable[[int, str], str | None],
                 workers: int = 64, chain: int = 16) -> None:
        self.brain = brain
        self.chain = chain
        self._conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        for statement in self.schema:
            self._conn.execute(statement)
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._batch = _Batch()
        self._stopping = False  # the writer's: set once no turn can commit any more
        self._closing = False  # the workers': start no further turn
        self._mailboxes: list[deque[tuple[Any, str]]] = [deque() for _ in range(sessions)]
        self._scheduled = [False] * sessions
        self._ready: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._next_id = 1 + self._top(self._conn)
        self._threads = [threading.Thread(target=self._writer, name="bare-writer", daemon=True)]
        self._threads += [threading.Thread(target=self._worker, name=f"bare-worker-{i}",
                                           daemon=True) for i in range(workers)]

    def start(self) -> BarePipeline:
        """Rehydrate the unacknowledged rows and start the threads."""
        rows = self._unacked(self._conn)
        with self._lock:
            self._deliver(rows)
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Let running turns commit, stop the workers, then the writer; close the file."""
        writer, workers = self._threads[0], self._threads[1:]
        self._closing = True
        for _ in workers:
            self._ready.put(None)
        for thread in workers:
            thread.join(10)
        with self._lock:
            self._stopping = True
            self._work.notify()
        writer.join(10)
        self._conn.close()

    def _top(self, conn: sqlite3.Connection) -> int:
        """The highest row id written."""
        return conn.execute("SELECT MAX(id) FROM inbox").fetchone()[0] or 0

    def _unacked(self, conn: sqlite3.Connection) -> list[tuple[Any, int, str]]:
        """(id, target, body) of the unacknowledged rows, in the order they were sent."""
        return conn.execute("SELECT id, target, body FROM inbox WHERE acked = 0"
                            " ORDER BY id").fetchall()

    def send(self, target: int, body: str) -> Any:
        """Queue one row for ``target`` and return its id once it is committed."""
        with self._lock:
            batch, mid = self._batch, self._next_id
            self._next_id += 1
            batch.sends.append((mid, target, body))
            self._work.notify()
        batch.committed.wait()
        return mid

    def _commit_turn(self, target: int, mid: Any, body: str, reply: str | None) -> None:
        with self._lock:
            batch = self._batch
            batch.entries += [(target, "user", body), (target, "assistant", reply)]
            batch.markers.append((mid, target))
            batch.acks.append((mid,))
            self._work.notify()
        batch.committed.wait()

    def _deliver(self, rows: list[tuple[Any, int, str]]) -> None:
        """Committed rows into their mailboxes; schedule idle sessions (lock held)."""
        for mid, target, body in rows:
            self._mailboxes[target].append((mid, body))
            if not self._scheduled[target]:
                self._scheduled[target] = True
                self._ready.put(target)

    def _writer(self) -> None:
        conn = self._conn
        while True:
            with self._lock:
                while not self._batch and not self._stopping:
                    self._work.wait()
                if not self._batch:
                    return
                batch, self._batch = self._batch, _Batch()
            conn.execute("BEGIN")
            self._write(conn, batch)
            conn.execute("COMMIT")
            if batch.sends:
                with self._lock:
                    self._deliver(batch.sends)
            batch.committed.set()

    def _write(self, conn: sqlite3.Connection, batch: _Batch) -> None:
        """The statements of one batch (inside its transaction)."""
        if batch.sends:
            conn.executemany("INSERT INTO inbox (id, target, body) VALUES (?, ?, ?)",
                             batch.sends)
        if batch.markers:
            conn.executemany("INSERT INTO transcript (target, role, text) VALUES (?, ?, ?)",
                             batch.entries)
            conn.executemany("INSERT INTO markers (message_id, target) VALUES (?, ?)",
                             batch.markers)
            conn.executemany("UPDATE inbox SET acked = 1 WHERE id = ?", batch.acks)

    def _worker(self) -> None:
        while (target := self._ready.get()) is not None:
            box = self._mailboxes[target]
            for _ in range(self.chain):
                with self._lock:
                    if not box or self._closing:
                        break
                    mid, body = box.popleft()
                self._commit_turn(target, mid, body, self.brain(target, body))
            with self._lock:
                if box and not self._closing:
                    self._ready.put(target)  # more mail: yield the worker, stay scheduled
                else:
                    self._scheduled[target] = False


def run_bare(w: Workload, workdir: Path, python_us: int = 0) -> Measured:
    """The bare pipeline on the benchmark workload, a trivial brain recording each turn;
    with ``python_us``, the brain also runs that many microseconds of pure Python (holding
    the interpreter lock, as the runtime's own code per message does)."""
    rec = Recorder(w.messages)

    def brain(target: int, body: str) -> str:
        if python_us:
            until = time.thread_time() + python_us / 1e6
            while time.thread_time() < until:
                pass
        rec.handled(body)
        return "ok"

    return measure("bare", BarePipeline(workdir / "bare.db", w.sessions, brain), w, rec)


def measure(name: str, pipe: BarePipeline, w: Workload, rec: Recorder) -> Measured:
    """Start ``pipe``, send ``w`` through it, and measure until ``rec`` heard every turn:
    the rate, latencies and the CPU a message by stage; ``pipe`` stopped however it ends."""
    pipe.start()
    try:
        before = bench_stages.sample()
        start = time.perf_counter()
        producers = produce(w, pipe.send)
        if not rec.done.wait(3600):
            raise TimeoutError(f"{name} did not deliver every message")
        elapsed = time.perf_counter() - start
        return rec.measured(elapsed, stages=bench_stages.per_message(
            before, bench_stages.sample(), producers, w.messages))
    finally:
        pipe.stop()
