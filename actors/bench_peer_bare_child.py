"""The receiver of the peers benchmark's ``bare_durable`` system (see bench_peer_bare.py).

Usage: python -m kinbox.actors.bench_peer_bare_child PORT SQLITE_PATH

A plain websockets server (the sync API, one thread per connection) that
commits every message it receives to SQLite (WAL, ``synchronous=FULL``)
before acking it: it reads the frames that have arrived (up to 256), commits
them in one transaction (a repeated id is ignored, so a resend gets the same
ack), then sends one ack per frame. No kinbox code.
"""

from __future__ import annotations

import json
import sqlite3
import sys

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

BATCH = 256


def handler(ws: ServerConnection, path: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS inbox (id TEXT PRIMARY KEY, text TEXT NOT NULL)")
    try:
        while True:
            batch = [ws.recv()]
            while len(batch) < BATCH:
                try:
                    batch.append(ws.recv(timeout=0))
                except TimeoutError:
                    break
            rows = [(f["id"], f["text"]) for f in map(json.loads, batch)]
            conn.execute("BEGIN")
            conn.executemany("INSERT OR IGNORE INTO inbox (id, text) VALUES (?, ?)", rows)
            conn.execute("COMMIT")
            for mid, _ in rows:
                ws.send(json.dumps({"v": 1, "type": "ack", "id": mid}))
    except ConnectionClosed:
        return
    finally:
        conn.close()


def main(port: int, path: str) -> None:
    with serve(lambda ws: handler(ws, path), "127.0.0.1", port, compression=None,
               max_size=1 << 20) as server:
        print("listening", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
