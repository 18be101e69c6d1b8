"""A worker process of ``kinbox bench scaleout``: one system's consumer with the shared brain.

Usage: KINBOX_DB=URL python -m kinbox.actors.bench_scaleout_child SYSTEM OUT_JSON [--slow] [--cpu N]

SYSTEM is ``kinbox`` (a delivering :class:`Runtime`, as ``kinbox worker``
runs), ``bare_pg`` (its guarantees in raw psycopg2: ``bench_scaleout_bare``),
``raw`` (a bare ``FOR UPDATE SKIP LOCKED`` claim loop), ``pgqueuer``,
``procrastinate`` or ``dbos`` (DBOS Transact: a workflow per message on a
queue partitioned by session, one at a time per partition). Every one
runs the same trivial brain: note the time from the send (stamped in the
body) to the turn's start. ``--slow`` makes each
turn take half a second (the recovery run kills a worker mid-turn); ``--cpu``
runs the process on that CPU alone (``kinbox --cpus N``). Prints
"ready" once consuming; on SIGTERM stops, then writes ``{"starts": [[id,
t], ...], "latencies": [...], "first": t, "last": t}`` to OUT_JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from .bench_scaleout_bare import run_bare_pg
from .bench_scaleout_bare_rows import STATEMENTS as ROWS
from .cpu_pinning import pin_process

BATCH = 64
"""Rows claimed per round trip, for every system (kinbox's claim limit is its capacity)."""

SLOW_TURN = 0.5


class Brain:
    """The shared trivial brain: records when each message's turn started."""

    def __init__(self, slow: bool) -> None:
        self.slow = slow
        self.lock = threading.Lock()
        self.starts: list[tuple[str, float]] = []
        self.latencies: list[float] = []
        self.last = 0.0
        self.pause = threading.Event()  # never set: waiting on it is the slow turn's work

    def handle(self, key: str, body: str) -> None:
        now = time.time()
        # The body's stamp is perf_counter, the system-wide monotonic clock on Linux.
        waited = time.perf_counter() - float(body.split("|", 1)[0])
        with self.lock:
            self.starts.append((key, now))
            self.latencies.append(waited)
        if self.slow:
            self.pause.wait(SLOW_TURN)
        with self.lock:
            self.last = time.time()

    def report(self) -> dict[str, Any]:
        with self.lock:
            return {"starts": self.starts, "latencies": self.latencies,
                    "first": min((t for _, t in self.starts), default=0.0), "last": self.last}


def run_kinbox(url: str, brain: Brain, stop: threading.Event) -> None:
    from .runtime import Runtime
    from .turn import Turn

    def turn(t: Turn) -> None:
        brain.handle(t.messages[0].message_id, t.messages[0].content)

    with Runtime(db=url, brain=turn, max_active_sessions=BATCH):
        print("ready", flush=True)
        stop.wait()


RAW_CLAIM = ("UPDATE raw_jobs SET status = 'picked' WHERE id IN (SELECT id FROM raw_jobs "
             "WHERE status = 'pending' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) "
             "RETURNING id, body")
RAW_DONE = "UPDATE raw_jobs SET status = 'done' WHERE id = ANY(%s)"


def run_raw(url: str, brain: Brain, stop: threading.Event) -> None:
    import psycopg2

    conn = psycopg2.connect(url)
    listen = psycopg2.connect(url)
    listen.autocommit = True
    with listen.cursor() as cur:
        cur.execute("LISTEN raw_jobs")
    print("ready", flush=True)
    import select
    while not stop.is_set():
        with conn, conn.cursor() as cur:  # one transaction: claim, run, mark done
            cur.execute(RAW_CLAIM, (BATCH,))
            rows = cur.fetchall()
            for job_id, body in rows:
                brain.handle(str(job_id), body)
            if rows:
                cur.execute(RAW_DONE, ([r[0] for r in rows],))
        if not rows:
            select.select([listen], [], [], 0.1)
            listen.poll()
            listen.notifies.clear()
    conn.close()
    listen.close()


def run_pgqueuer(url: str, brain: Brain, stop: threading.Event) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Job, PgQueuer

    async def main() -> None:
        conn = await asyncpg.connect(url)
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint("turn")
        async def turn(job: Job) -> None:
            assert job.payload is not None
            body = job.payload.decode()
            if brain.slow:
                await asyncio.to_thread(brain.handle, str(job.id), body)
            else:
                brain.handle(str(job.id), body)

        async def watch() -> None:
            await asyncio.to_thread(stop.wait)
            pgq.shutdown.set()

        watcher = asyncio.create_task(watch())
        print("ready", flush=True)
        await pgq.run(batch_size=BATCH)
        watcher.cancel()
        await conn.close()

    asyncio.run(main())


def run_procrastinate(url: str, brain: Brain, stop: threading.Event) -> None:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="turn", queue="turns", pass_context=True)
    def turn(context: procrastinate.JobContext, body: str) -> None:
        assert context.job is not None
        brain.handle(str(context.job.id), body)

    print("ready", flush=True)
    # Sync tasks run in threads; its own SIGTERM handler stops it gracefully.
    app.run_worker(queues=["turns"], concurrency=BATCH, fetch_job_polling_interval=0.1,
                   delete_jobs="always")


def run_dbos(url: str, brain: Brain, stop: threading.Event) -> None:
    from dbos import DBOS

    DBOS(config={"name": "kinbox-bench", "system_database_url": url,
                 "log_level": "WARNING"})

    @DBOS.workflow(name="turn")
    def turn(body: str) -> None:
        brain.handle(DBOS.workflow_id or "", body)

    DBOS.launch()
    DBOS.register_queue("turns", partition_concurrency=1, worker_concurrency=BATCH,
                        polling_interval_sec=0.05)
    print("ready", flush=True)
    stop.wait()
    DBOS.destroy()


SYSTEMS = {"kinbox": run_kinbox, "bare_pg": run_bare_pg,
           "bare_pg_rows": lambda url, brain, stop: run_bare_pg(url, brain, stop, ROWS),
           "raw": run_raw, "pgqueuer": run_pgqueuer,
           "procrastinate": run_procrastinate, "dbos": run_dbos}


def _stop_when_orphaned(stop: threading.Event) -> None:
    """Stop as SIGTERM would once the bench that started this worker is gone (killed, or a
    test's timeout ended its process): an orphan went on polling the database for good."""
    parent = os.getppid()
    while not stop.wait(1.0):
        if os.getppid() != parent:
            stop.set()


def main() -> None:
    system, out = sys.argv[1:3]
    url = os.environ["KINBOX_DB"]  # not an argument: ps shows arguments, password and all
    options = sys.argv[3:]
    if "--cpu" in options:
        pin_process(frozenset({int(options[options.index("--cpu") + 1])}))
    brain = Brain(slow="--slow" in options)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=_stop_when_orphaned, args=(stop,), daemon=True).start()
    extra = SYSTEMS[system](url, brain, stop)  # bare_pg: its stage times
    with open(out, "w") as f:
        json.dump({**brain.report(), **(extra or {})}, f)


if __name__ == "__main__":
    main()
