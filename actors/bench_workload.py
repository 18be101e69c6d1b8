"""The workload every ``kinbox bench throughput`` system runs, and how a run is scored.

Owns what the systems share and nothing of any one system: the workload
shape, the message body (send time, target, producer, sequence number), the
producer threads, the recorder of handled messages and the order check. A
message body starts ``"<perf_counter>|<target>|<producer>|<seq>|"`` so any
handler, in any process, can report latency and per-producer order from the
body alone.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Workload:
    """What every system runs."""

    sessions: int
    messages: int
    payload: int = 100
    producers: int = 32


@dataclass
class Measured:
    """One system's run: elapsed seconds, latencies (seconds) per message, order violations."""

    elapsed: float
    latencies: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    order_violations: int | None = None


def order_violations(handled: Iterable[tuple[Hashable, int]]) -> int:
    """How many messages were handled after a later message of the same stream.

    ``handled`` is (stream, seq) in handling order, a stream being one
    producer's messages to one target and ``seq`` increasing in send order.
    A message counts once when some message sent after it on its stream was
    handled before it.
    """
    latest: dict[Hashable, int] = {}
    late = 0
    for stream, seq in handled:
        seen = latest.get(stream)
        if seen is not None and seq < seen:
            late += 1
        else:
            latest[stream] = seq
    return late


class Recorder:
    """Counts handled messages, keeps latencies and handling order, signals when all arrived."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.latencies: list[float] = []
        self.order: list[tuple[tuple[str, str], int]] = []
        self._lock = threading.Lock()
        self.done = threading.Event()

    def handled(self, content: str) -> None:
        now = time.perf_counter()
        sent, target, producer, seq = [*content.split("|", 4), "", "", "", ""][:4]
        with self._lock:
            self.latencies.append(now - float(sent))
            if seq:
                self.order.append(((target, producer), int(seq)))
            if len(self.latencies) >= self.expected:
                self.done.set()

    def measured(self, elapsed: float, **extra: Any) -> Measured:
        """The run's result with its order violations counted."""
        with self._lock:
            return Measured(elapsed, list(self.latencies), extra,
                            order_violations(self.order))


def stamp(payload: int, target: int = 0, producer: int = 0, seq: int = 0) -> str:
    """A message body: send time, target, producer and sequence, padded to ``payload`` bytes."""
    head = f"{time.perf_counter():.9f}|{target}|{producer}|{seq}|"
    return head + "x" * max(0, payload - len(head))


def produce(w: Workload, send: Callable[[int, str], None]) -> float:
    """Send every message from ``w.producers`` threads; message k goes to session k % S.
    The producer threads' CPU seconds, summed (each reads its own clock: they are gone
    once this returns).

    Producer p sends messages p, p + P, p + 2P, ... in that order, each send
    returning (durable, for the durable systems) before the next.
    """
    def worker(offset: int) -> float:
        began = time.thread_time()
        for k in range(offset, w.messages, w.producers):
            target = k % w.sessions
            send(target, stamp(w.payload, target, offset, k))
        return time.thread_time() - began
    with ThreadPoolExecutor(w.producers) as pool:
        return sum(pool.map(worker, range(w.producers)))


def fresh_dir() -> Path:
    """A scratch directory for one system's run."""
    return Path(tempfile.mkdtemp(prefix="kinbox-bench-"))
