"""``kinbox bench scaleout``: worker processes sharing one PostgreSQL, beside other PG queues.

Every system runs as worker processes (``bench_scaleout_child``) with the
same trivial brain, the same payload and the same claim batch, each on a
fresh database of its own (dropped after the measurement), in one run
(absolute numbers drift on a shared machine; ratios measured together
hold). Sends are durable everywhere (committed before the call returns).
Workloads:

* ``drain``: a backlog enqueued before any worker starts; messages per
  second from the first turn's start to the last turn's end, so process
  start-up is not counted;
* ``closed``: 32 producer threads, each sending its next message once the
  last is committed (as ``bench throughput``), workers already running;
  messages per second from the first send to the last turn's end;
* ``sends only``: kinbox only, the closed workload's sends with no worker running:
  the producer's own ceiling (a worker that keeps up cannot beat it);
* ``latency``: kinbox only, 2 workers, sends at a steady 500 per second
  from this process: send -> turn start across processes (p50, p99);
* ``recovery``: kinbox only, 2 workers with half-second turns; one is
  SIGKILLed mid-turn; seconds from the kill to the other's first start of
  a row the dead one held.

Targets (issue 16): 2 kinbox workers >= 1.3x one; kinbox >= pgqueuer on both
workloads; recovery <= 1 s; p99 <= 20 ms at 500 msgs/s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .bench_runs import percentile
from .bench_scaleout_bare_cpu import CpuSample, backends
from .bench_scaleout_systems import SYSTEM_NAMES, Producer, scratch_producer, server_connection
from .cpu_pinning import allowed_cpus

OTHERS = (("pgqueuer", " (target >= 1)"), ("dbos", " (target >= 3)"), ("procrastinate", ""),
          ("raw", ""))
"""The systems kinbox is compared with, and the issue's target for each."""

SESSIONS = 200
PAYLOAD = 100
PRODUCERS = 32


@dataclass(frozen=True)
class Sizes:
    """How many messages each workload sends."""

    drain: int
    closed: int
    latency_seconds: float

    @classmethod
    def of(cls, quick: bool, tiny: bool = False) -> Sizes:
        if tiny:
            return cls(drain=200, closed=100, latency_seconds=1.0)
        return cls(5_000, 2_000, 4.0) if quick else cls(50_000, 10_000, 10.0)


class Workers:
    """``n`` consumer processes of one system; their reports once stopped."""

    def __init__(self, system: str, url: str, n: int, slow: bool = False,
                 pin: bool = False) -> None:
        """``pin``: worker i runs on the i-th CPU this process may use (round robin), as
        ``kinbox --cpus N worker`` would, whatever the system."""
        self.dir = Path(tempfile.mkdtemp(prefix="kinbox-scaleout-"))
        """The workers' reports and their runtimes' data folders (``KINBOX_HOME``), removed
        by :meth:`stop`: a run leaves no device key or heartbeat file for a database it
        drops."""
        self.procs: list[subprocess.Popen[str]] = []
        cpus = sorted(allowed_cpus()) if pin else []
        for i in range(n):
            cmd = [sys.executable, "-m", "kinbox.actors.bench_scaleout_child", system,
                   str(self.dir / f"w{i}.json")] + (["--slow"] if slow else [])
            if cpus:
                cmd += ["--cpu", str(cpus[i % len(cpus)])]
            env = {**os.environ, "KINBOX_HOME": str(self.dir / f"w{i}-home"), "KINBOX_DB": url}
            self.procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env))
        for p in self.procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                self.stop()
                raise RuntimeError(f"a {system} worker did not start")

    def stop(self) -> list[dict[str, Any]]:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        reports = []
        try:
            for i, p in enumerate(self.procs):
                p.wait(60)
                path = self.dir / f"w{i}.json"
                if path.exists():
                    reports.append(json.loads(path.read_text()))
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
        return reports


POLL_SECONDS = 0.1
"""How often :func:`wait_done` counts what is left. The rates come from the workers' own
times (first turn start, last turn end), so the poll only notices the end; it runs on the
server the workers share, and every 20 ms it took a tenth of a core at 20,000 messages.
The drain's CPU sample, taken once the poll has seen the end, counts up to one interval
of idle workers and server as well (a few ms of CPU: their timers and listeners)."""


def wait_done(producer: Producer, timeout: float) -> None:
    pause = threading.Event()
    deadline = time.monotonic() + timeout
    while producer.remaining() > 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{producer.system}: not done in {timeout}s")
        pause.wait(POLL_SECONDS)
    if producer.failed():
        raise RuntimeError(f"{producer.system}: {producer.failed()} messages failed")


def _rate(n: int, start: float, reports: list[dict[str, Any]]) -> float:
    last = max(r["last"] for r in reports)
    return round(n / max(1e-9, last - start))


def drain(system: str, base: str, workers: int, n: int, pin: bool = False) -> dict[str, Any]:
    """Messages per second draining a backlog of ``n``, the CPU per message of the workers
    and of the server, and (bare_pg) its lost/duplicate counts and stage times."""
    with scratch_producer(system, base, SESSIONS, PAYLOAD) as producer:
        producer.backlog(n)
        exclude = backends(producer)
        pool = Workers(system, producer.url, workers, pin=pin)
        try:
            pids = [p.pid for p in pool.procs]
            start = CpuSample(producer, pids, exclude)
            wait_done(producer, 600)
            cpu = CpuSample(producer, pids, exclude).per_message_us(start, n)
        finally:
            reports = pool.stop()
        out = {"drain_msgs_per_s": _rate(n, min(r["first"] for r in reports if r["starts"]),
                                         reports),
               **{f"drain_{k}": v for k, v in cpu.items()},
               **{f"drain_{k}": v for k, v in producer.audit().items()}}
        if "stages_us_per_msg" in reports[0]:
            out["_drain_stages"] = [r["stages_us_per_msg"] for r in reports]
        return out


def closed(system: str, base: str, workers: int, n: int, pin: bool = False) -> dict[str, Any]:
    """Messages per second with closed-loop durable sends from 32 threads (and bare_pg's
    lost/duplicate counts)."""
    with scratch_producer(system, base, SESSIONS, PAYLOAD) as producer:
        pool = Workers(system, producer.url, workers, pin=pin)
        try:
            start = time.time()
            with ThreadPoolExecutor(PRODUCERS) as senders:
                list(senders.map(producer.send, range(n)))
            wait_done(producer, 600)
        finally:
            reports = pool.stop()
        return {"closed_msgs_per_s": _rate(n, start, reports),
                **{f"closed_{k}": v for k, v in producer.audit().items()}}


def sends_only(base: str, n: int) -> float:
    """kinbox: closed-loop sends per second with no worker running (the producer's own
    ceiling, which bounds the closed workload whatever the number of workers)."""
    with scratch_producer("kinbox", base, SESSIONS, PAYLOAD) as producer:
        start = time.time()
        with ThreadPoolExecutor(PRODUCERS) as senders:
            list(senders.map(producer.send, range(n)))
        return round(n / max(1e-9, time.time() - start))


def latency(base: str, seconds: float, rate: float = 500.0, pin: bool = False
            ) -> dict[str, Any]:
    """kinbox, 2 workers: send -> turn start at a steady ``rate`` per second."""
    with scratch_producer("kinbox", base, SESSIONS, PAYLOAD) as producer:
        pool = Workers("kinbox", producer.url, 2, pin=pin)
        n = int(seconds * rate)
        try:
            start = time.monotonic()
            beat = threading.Event()  # never set: waiting on it paces the sends
            for k in range(n):
                ahead = start + k / rate - time.monotonic()
                if ahead > 0:
                    beat.wait(ahead)
                producer.send(k)
            wait_done(producer, 120)
        finally:
            reports = pool.stop()
        lat = [x for r in reports for x in r["latencies"]]
        return {"messages": n, "rate": rate, "p50_ms": _ms(percentile(lat, 0.5)),
                "p99_ms": _ms(percentile(lat, 0.99)),
                "per_worker": [len(r["latencies"]) for r in reports]}


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def recovery(base: str, pin: bool = False) -> dict[str, Any]:
    """kinbox, 2 workers with slow turns: SIGKILL one mid-turn; seconds to redelivery."""
    with scratch_producer("kinbox", base, SESSIONS, PAYLOAD) as producer:
        pool = Workers("kinbox", producer.url, 2, slow=True, pin=pin)
        try:
            for k in range(40):
                producer.send(k)
            victim = pool.procs[0]
            held = producer_held(producer, victim.pid)
            pause = threading.Event()
            while not held:
                pause.wait(0.01)
                held = producer_held(producer, victim.pid)
            victim.send_signal(signal.SIGKILL)
            killed_at = time.time()
            victim.wait(10)
            wait_done(producer, 120)
        finally:
            reports = pool.stop()
        again = [t for r in reports for mid, t in r["starts"] if mid in held]
        return {"rows_held": len(held),
                "first_redelivery_s": round(min(again) - killed_at, 3) if again else None}


def producer_held(producer: Producer, pid: int) -> set[str]:
    """Rows a worker process holds in ``processing`` (its owner id names its pid)."""
    rows = producer.query("SELECT message_id FROM agent_inbox_messages WHERE status = "
                         "'processing' AND lease_owner LIKE %s", (f"%:{pid}:%",))
    return {r[0] for r in rows}


def base_url(db: str | None) -> str:
    """The PostgreSQL URL to derive the systems' databases from: ``db`` or ``$KINBOX_DB``."""
    return db or os.environ.get("KINBOX_DB", "")


def url_problem(db: str | None) -> str | None:
    """Why scaleout cannot run on ``db`` (not PostgreSQL), or None."""
    url = base_url(db)
    if not url.startswith(("postgresql://", "postgres://")):
        return ("needs a PostgreSQL server: --db postgresql://user@host/db "
                "(or $KINBOX_DB); each system gets a database of its own on it")
    if "dbname" in parse_qs(urlsplit(url).query):
        # libpq would put every system in that one database, whatever the path says.
        return ("name the database in the URL's path, not a dbname parameter: each "
                "system's database is named after it")
    return None


def scaleout(quick: bool, base: str, tiny: bool = False,
             systems: tuple[str, ...] = SYSTEM_NAMES, pin: bool = False) -> dict[str, Any]:
    """Run every workload and return the report body (results, ratios, settings); ``pin``:
    every system's worker processes each on a CPU of its own (see :class:`Workers`)."""
    sizes = Sizes.of(quick, tiny)
    results: dict[str, dict[str, Any]] = {}
    runs = [("kinbox_1_worker", "kinbox", 1), ("kinbox_2_workers", "kinbox", 2)]
    runs += [(f"{bare}_2_workers", bare, 2) for bare in ("bare_pg", "bare_pg_rows")
             if bare in systems]
    runs += [(s, s, 1) for s in systems if s != "kinbox"]
    for name, system, n in runs:
        results[name] = {**drain(system, base, n, sizes.drain, pin),
                         **closed(system, base, n, sizes.closed, pin)}
    results["kinbox_sends_only"] = {"closed_msgs_per_s": sends_only(base, sizes.closed)}
    results["kinbox_latency"] = latency(base, sizes.latency_seconds, pin=pin)
    results["kinbox_recovery"] = recovery(base, pin)
    return {"settings": {"sessions": SESSIONS, "payload": PAYLOAD, "producers": PRODUCERS,
                         "drain_messages": sizes.drain, "closed_messages": sizes.closed,
                         "database": "postgresql", "server": server_settings(base),
                         "analyze_after_backlog": True, "pinned_workers": pin},
            "results": results, "ratios": ratios(results)}


def server_settings(base: str) -> dict[str, str]:
    """The server's version and the settings that shape these numbers."""
    conn = server_connection(base)
    try:
        with conn.cursor() as cur:
            found = {}
            for name in ("server_version", "autovacuum", "synchronous_commit", "fsync",
                         "max_connections"):
                cur.execute(f"SHOW {name}")
                found[name] = cur.fetchone()[0]
            return found
    finally:
        conn.close()


def ratios(r: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, each with its measured ratio."""
    one, two = r["kinbox_1_worker"], r["kinbox_2_workers"]
    out: dict[str, Any] = {}
    for w in ("drain", "closed"):
        key = f"{w}_msgs_per_s"
        out[f"{w}: 2 workers / 1 (target >= 1.3)"] = round(two[key] / one[key], 2)
        for other, target in OTHERS:
            if other in r:
                out[f"{w}: kinbox 1 worker / {other}{target}"] = round(
                    one[key] / r[other][key], 2)
        if "bare_pg" in r:  # the same guarantees with no runtime: kinbox's own overhead
            out[f"{w}: kinbox_vs_bare_pg"] = round(one[key] / r["bare_pg"][key], 2)
            if "pgqueuer" in r:
                out[f"{w}: bare_pg_vs_pgqueuer"] = round(r["bare_pg"][key] / r["pgqueuer"][key], 2)
        if "bare_pg_rows" in r:  # that overhead split: kinbox's rows, and the rest
            out[f"{w}: kinbox_vs_bare_pg_rows"] = round(one[key] / r["bare_pg_rows"][key], 2)
            if "bare_pg" in r:
                out[f"{w}: bare_pg_rows_vs_bare_pg"] = round(
                    r["bare_pg_rows"][key] / r["bare_pg"][key], 2)
        for bare in ("bare_pg", "bare_pg_rows"):
            if bare in r and f"{bare}_2_workers" in r:
                out[f"{w}: {bare} 2 workers / 1"] = round(
                    r[f"{bare}_2_workers"][key] / r[bare][key], 2)
    out["recovery to first redelivery, s (target <= 1)"] = (
        r["kinbox_recovery"]["first_redelivery_s"])
    out["p99 send -> turn start at 500/s, ms (target <= 20)"] = r["kinbox_latency"]["p99_ms"]
    return out
