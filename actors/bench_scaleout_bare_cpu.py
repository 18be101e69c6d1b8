"""CPU per drained message in ``kinbox bench scaleout``: the worker processes' and the server's.

Where a system's extra microseconds go, beside the bare pipeline (issue
#16), is first a question of whose CPU they are: the worker's (Python,
driver) or the server's (statements, index entries, WAL). Both are read
from ``/proc/<pid>/stat`` (user + system time), so this works only with the
server on this machine (as the benchmark's is); elsewhere the numbers are
``None``. The server's share is the backends connected to the system's
database, less those that were there before the workers started (the
producer's own connections); sampled once the workers report ready and
again when the backlog is done, before they stop.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Protocol
from urllib.parse import urlsplit

TICK = os.sysconf("SC_CLK_TCK")


class Queryable(Protocol):
    url: str

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]: ...


def process_cpu(pid: int) -> float | None:
    """Seconds of user + system CPU of process ``pid`` (all its threads), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime: fields 14 and 15


def backends(producer: Queryable) -> set[int]:
    """The server pids of the client connections to the producer's database."""
    name = urlsplit(producer.url).path.lstrip("/")
    rows = producer.query("SELECT pid FROM pg_stat_activity WHERE datname = %s", (name,))
    return {int(r[0]) for r in rows}


class CpuSample:
    """CPU seconds so far of the workers and of their server backends (None if unreadable)."""

    def __init__(self, producer: Queryable, workers: Iterable[int], exclude: set[int]) -> None:
        self.workers = _total(process_cpu(p) for p in workers)
        self.server = {p: process_cpu(p) for p in backends(producer) - exclude}

    def per_message_us(self, start: CpuSample, messages: int) -> dict[str, float | None]:
        """Microseconds per message between ``start`` and this sample."""
        server = None
        if self.server and all(v is not None for v in self.server.values()):
            # A backend born after ``start`` counts from zero.
            server = sum(v - (start.server.get(p) or 0.0)  # type: ignore[operator]
                         for p, v in self.server.items())
        worker = None
        if self.workers is not None and start.workers is not None:
            worker = self.workers - start.workers
        return {"worker_cpu_us_per_msg": _us(worker, messages),
                "server_cpu_us_per_msg": _us(server, messages)}


def _total(values: Iterable[float | None]) -> float | None:
    found = list(values)
    return None if not found or None in found else sum(v for v in found if v is not None)


def _us(seconds: float | None, messages: int) -> float | None:
    return None if seconds is None else round(seconds * 1e6 / max(1, messages), 1)
