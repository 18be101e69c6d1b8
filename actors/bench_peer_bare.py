"""``bare_durable``: the smallest durable windowed link, the yardstick for ``kinbox_peers``.

The same guarantee as kinbox's peer link, with nothing else: the sender
commits its outbound rows to SQLite (WAL, ``synchronous=FULL``; 500 to a
transaction, as ``send_many`` does) before any is sent; a sending thread keeps
at most ``window`` frames unacknowledged; the receiver child commits each
frame before acking it (bench_peer_bare_child.py); the sender's ack thread
frees window slots as acks arrive and marks the acked rows ``acked`` in one
transaction per burst of acks (a crash before that commit resends rows the
receiver already has; their repeat is ignored and acked again). Raw sqlite3
and websockets, no kinbox code. Latency is socket send -> ack received.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

from ..transport import frames


def _outbox(path: Path, n: int) -> sqlite3.Connection:
    """The sender's file with ``n`` rows committed, 500 to a transaction."""
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE outbox (seq INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL,"
                 " text TEXT NOT NULL, acked INTEGER NOT NULL DEFAULT 0)")
    for first in range(0, n, 500):
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO outbox (id, text) VALUES (?, ?)",
                         [(f"msg-{i:08d}", f"benchmark message {i}")
                          for i in range(first, min(n, first + 500))])
        conn.execute("COMMIT")
    return conn


def _acks(ws: ClientConnection, conn: sqlite3.Connection, n: int, slots: threading.Semaphore,
          sent_at: dict[str, float], latencies: list[float]) -> None:
    """Read acks, free their window slots, commit them as acked per burst."""
    done = 0
    while done < n:
        burst = [ws.recv(60)]
        while True:
            try:
                burst.append(ws.recv(timeout=0))
            except TimeoutError:
                break
        now = time.perf_counter()
        ids = [json.loads(m)["id"] for m in burst]
        for mid in ids:
            latencies.append(now - sent_at[mid])
            slots.release()
        conn.execute("BEGIN")
        conn.executemany("UPDATE outbox SET acked = 1 WHERE id = ?", [(m,) for m in ids])
        conn.execute("COMMIT")
        done += len(ids)


def bare_durable(n: int, window: int, workdir: Path, port: int,
                 wait_port: Any) -> dict[str, Any]:
    """Run the bare durable link for ``n`` messages; its rate and latencies."""
    proc = subprocess.Popen([sys.executable, "-m", "kinbox.actors.bench_peer_bare_child",
                             str(port), str(workdir / "bare-receiver.db")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        started = time.perf_counter()
        conn = _outbox(workdir / "bare-sender.db", n)
        rows = conn.execute("SELECT id, text FROM outbox WHERE acked = 0 ORDER BY seq").fetchall()
        slots = threading.Semaphore(window)
        sent_at: dict[str, float] = {}
        latencies: list[float] = []
        with connect(f"ws://127.0.0.1:{port}/", proxy=None, compression=None) as ws:
            reader = threading.Thread(target=_acks, args=(ws, conn, n, slots, sent_at,
                                                          latencies), daemon=True)
            reader.start()
            for mid, text in rows:
                slots.acquire()
                sent_at[mid] = time.perf_counter()
                ws.send(frames.encode(frames.Deliver(mid, text, None)))
            reader.join(600)
        elapsed = time.perf_counter() - started
        unacked = conn.execute("SELECT COUNT(*) FROM outbox WHERE acked = 0").fetchone()[0]
        conn.close()
        received = sqlite3.connect(str(workdir / "bare-receiver.db"))
        stored = received.execute("SELECT COUNT(*) FROM inbox").fetchone()[0]
        received.close()
    finally:
        proc.terminate()
        proc.wait(10)
    if unacked or stored != n:
        raise RuntimeError(f"bare_durable: {unacked} rows unacked, {stored} of {n} stored")
    return {"messages": n, "elapsed_s": round(elapsed, 3), "msgs_per_s": round(n / elapsed),
            "latencies": latencies}
