"""The process one ``dbos`` benchmark run happens in (see bench_dbos.py).

Usage: python -m kinbox.actors.bench_dbos_child SQLITE_PATH SESSIONS MESSAGES PAYLOAD PRODUCERS
Prints one JSON object: elapsed seconds, latencies, order violations.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, SetEnqueueOptions

from .bench_workload import Recorder, Workload, produce

_recorder: Recorder | None = None


@sa.event.listens_for(sa.engine.Engine, "connect")
def _durable(dbapi_conn: Any, record: Any) -> None:
    """WAL and synchronous=FULL on every SQLite connection DBOS opens (as for every system)."""
    dbapi_conn.execute("PRAGMA journal_mode=WAL")
    dbapi_conn.execute("PRAGMA synchronous=FULL")


@DBOS.step()
def reply(body: str) -> str:
    """The handler's reply: the turn, recorded when it runs."""
    assert _recorder is not None
    _recorder.handled(body)
    return "ok"


@DBOS.workflow()
def handle(target: int, body: str) -> str:
    """One message's workflow."""
    return reply(body)


def main() -> None:
    global _recorder
    path, sessions, messages, payload, producers = sys.argv[1], *map(int, sys.argv[2:6])
    w = Workload(sessions, messages, payload, producers)
    _recorder = Recorder(messages)
    logging.getLogger("dbos").setLevel(logging.WARNING)
    DBOS(config={"name": "kinbox-bench", "system_database_url": f"sqlite:///{path}",
                 "log_level": "WARNING"})
    DBOS.launch()
    sessions_queue = DBOS.register_queue("sessions", partition_concurrency=1,
                                         polling_interval_sec=0.01)

    def send(target: int, body: str) -> None:
        with SetEnqueueOptions(queue_partition_key=f"s{target}"):
            sessions_queue.enqueue(handle, target, body)

    start = time.perf_counter()
    produce(w, send)
    if not _recorder.done.wait(3600):
        raise TimeoutError("dbos did not deliver every message")
    measured = _recorder.measured(time.perf_counter() - start)
    print(json.dumps({"elapsed": measured.elapsed, "latencies": measured.latencies,
                      "order_violations": measured.order_violations}), flush=True)
    DBOS.destroy()


if __name__ == "__main__":
    main()
