"""The systems ``kinbox bench throughput`` compares, each running the same workload
(the slow ones fewer messages of it: :data:`MESSAGE_BOUNDS`).

Workload: ``sessions`` targets, ``messages`` messages of ``payload`` bytes,
sent by ``producers`` threads (each send durable before the next, as an
agent's tool call would be; 32 by default, as many agents sending at once),
and a trivial brain that records when its turn ran. Every system returns
wall time and per-message latency (send -> turn). The comparison systems
come from the ``bench`` extra.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pykka

from . import bench_stages
from .bench_bare import run_bare
from .bench_bare_rows import run_bare_rows
from .bench_dbos import run_dbos
from .bench_workload import Measured, Recorder, Workload, fresh_dir, produce, stamp

if TYPE_CHECKING:
    from .turn import Turn

__all__ = ["SYSTEMS", "Measured", "Recorder", "Workload", "fresh_dir", "produce", "stamp"]


def run_kinbox(w: Workload, workdir: Path, synchronous: str = "FULL") -> Measured:
    """kinbox: agent_send-equivalent posts, group-committed, delivered by session actors."""
    from .runtime import Runtime  # here: the CLI lists the systems without loading it

    rec = Recorder(w.messages)

    def brain(turn: Turn) -> None:
        rec.handled(turn.messages[0].content)

    rt = Runtime(db=f"sqlite:///{workdir / f'kinbox-{synchronous}.db'}", brain=brain,
                 synchronous=synchronous).start()
    try:
        project = rt.create_project("bench")
        store = rt.context.store
        now = rt.clock.now()
        ids = [f"s{i:06d}" for i in range(w.sessions)]
        store.create_many([(sid, project.id, sid, "interactive") for sid in ids], now)
        before = bench_stages.sample()
        start = time.perf_counter()
        producers = produce(w, lambda i, body: rt.post(ids[i], body))
        if not rec.done.wait(3600):
            raise TimeoutError("kinbox did not deliver every message")
        elapsed = time.perf_counter() - start
        stages = bench_stages.per_message(before, bench_stages.sample(), producers, w.messages)
        stats = rt.statistics()
        return rec.measured(elapsed, writer=stats.get("writer"), peak_live=stats["peak_live"],
                            stages=stages)
    finally:
        rt.stop()


class _Handler(pykka.ThreadingActor):
    def __init__(self, on_message: Callable[[Any], None]) -> None:
        super().__init__()
        self.on_message = on_message

    def on_receive(self, message: Any) -> None:
        self.on_message(message)


def _actors(n: int, on_message: Callable[[Any], None]) -> list[pykka.ActorRef[Any]]:
    return [_Handler.start(on_message) for _ in range(n)]


def run_memory(w: Workload, workdir: Path) -> Measured:
    """Plain pykka actors, no durability: the upper bound of the actor layer."""
    rec = Recorder(w.messages)
    refs = _actors(min(w.sessions, 64), lambda m: rec.handled(m))
    try:
        start = time.perf_counter()
        produce(w, lambda i, body: refs[i % len(refs)].tell(body))
        if not rec.done.wait(3600):
            raise TimeoutError("memory did not deliver every message")
        return rec.measured(time.perf_counter() - start)
    finally:
        for ref in refs:
            ref.stop()


def run_naive(w: Workload, workdir: Path) -> Measured:
    """persist-queue SQLiteAckQueue feeding pykka actors, acked after each handler."""
    import persistqueue  # the bench extra

    queue = persistqueue.SQLiteAckQueue(str(workdir / "naive"), multithreading=True,
                                        auto_commit=True)
    for conn in [v for v in vars(queue).values() if isinstance(v, sqlite3.Connection)]:
        conn.execute("PRAGMA synchronous=FULL")
    rec = Recorder(w.messages)

    def handle(item: dict[str, Any]) -> None:
        rec.handled(item["data"]["body"])
        queue.ack(id=item["pqid"])  # by id: ack(item) searches every unacked item

    refs = _actors(min(w.sessions, 64), handle)
    stop = threading.Event()

    def consume() -> None:
        taken = 0
        while not stop.is_set():
            try:
                item = queue.get(block=True, timeout=0.05, raw=True)
            except persistqueue.Empty:
                continue
            refs[item["data"]["target"] % len(refs)].tell(item)
            taken += 1
            if taken % 1000 == 0:
                # The documented housekeeping: every get scans from the first row
                # (status is not indexed), so acked rows left in place slow it down.
                queue.clear_acked_data(max_delete=10_000, keep_latest=0)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        start = time.perf_counter()
        produce(w, lambda i, body: queue.put({"target": i, "body": body}))
        if not rec.done.wait(3600):
            raise TimeoutError("naive did not deliver every message")
        return rec.measured(time.perf_counter() - start)
    finally:
        stop.set()
        consumer.join(5)
        for ref in refs:
            ref.stop()


def run_huey(w: Workload, workdir: Path) -> Measured:
    """huey's SqliteHuey (fsync on, WAL) with a thread consumer."""
    from huey import SqliteHuey  # the bench extra
    from huey.consumer import Consumer

    huey = SqliteHuey("bench", filename=str(workdir / "huey.db"), fsync=True, results=False)
    rec = Recorder(w.messages)

    @huey.task()
    def handle(target: int, body: str) -> None:
        rec.handled(body)

    consumer = Consumer(huey, workers=8, periodic=False, initial_delay=0.001, backoff=1.0,
                        max_delay=0.001, worker_type="thread", check_worker_health=False)
    # Consumer.start() installs its own signal handlers; put ours back afterwards so a
    # benchmark process still dies on SIGTERM.
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    consumer.start()
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    try:
        start = time.perf_counter()
        produce(w, lambda i, body: handle(i, body))
        if not rec.done.wait(3600):
            raise TimeoutError("huey did not deliver every message")
        return rec.measured(time.perf_counter() - start)
    finally:
        consumer.stop(graceful=True)


def run_sqlite_ceiling(w: Workload, workdir: Path) -> Measured:
    """Raw SQLite inserts of one row per message, committed in batches of 1,000 (WAL, FULL)."""
    conn = sqlite3.connect(str(workdir / "ceiling.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS m (id INTEGER PRIMARY KEY, target INT, body TEXT)")
    body = "x" * w.payload
    start = time.perf_counter()
    for first in range(0, w.messages, 1000):
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO m (target, body) VALUES (?, ?)",
                         [(k % w.sessions, body) for k in range(first,
                                                                min(first + 1000, w.messages))])
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return Measured(elapsed)


MESSAGE_BOUNDS: dict[str, tuple[int | None, int | None]] = {
    "dbos": (1_000, 5_000),
    "naive": (5_000, 40_000),
    "huey": (5_000, 40_000),
}
"""system -> the most messages one of its runs sends, at the quick size and at the full
size (None: the whole workload). Same sessions, producers and payload; only the count is
cut, and a rate is a rate. DBOS delivers a few hundred messages a second here. naive and
huey at the full size took 928 s of a 1,338 s full run, past its 15 minutes, and their
rates do not follow the count (docs/benchmark-log.md, the run of 2026-12-03 21:10 UTC);
at the quick size their 10,000 took 40-80 s of the run's 90 s budget, and at 5,000 they
ran as fast or a little faster (2026-12-08 00:19 UTC, alternated: naive 1,199 / 1,333
msgs/s at 10,000 against 1,191 / 1,404 at 5,000, huey 1,468 / 1,680 against 1,550 /
1,777), so the cut does not flatter kinbox (if anything it favours them)."""


def bounded(system: str, w: Workload, quick: bool) -> Workload:
    """The workload ``system`` runs: ``w``, its count cut to :data:`MESSAGE_BOUNDS`."""
    limit = MESSAGE_BOUNDS.get(system, (None, None))[0 if quick else 1]
    return w if limit is None else replace(w, messages=min(w.messages, limit))


SYSTEMS: dict[str, Callable[[Workload, Path], Measured]] = {
    "kinbox": run_kinbox,
    "kinbox_normal": lambda w, d: run_kinbox(w, d, "NORMAL"),
    "naive": run_naive,
    "huey": run_huey,
    "memory": run_memory,
    "sqlite_ceiling": run_sqlite_ceiling,
    "bare": run_bare,
    "bare_py100": lambda w, d: run_bare(w, d, python_us=100),
    "bare_py200": lambda w, d: run_bare(w, d, python_us=200),
    "bare_rows": run_bare_rows,
    "dbos": run_dbos,
}

