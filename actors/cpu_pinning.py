"""Pinning a kinbox process to chosen CPUs: ``kinbox --cpus 1 worker ...``.

A kinbox process runs its Python one thread at a time (the interpreter
lock), and under load that lock changes hands several times per message
(a send, the writer, the turn's thread). When the kernel spreads those
threads over several cores, every hand-off wakes a thread on another core,
whose caches hold none of what the last thread touched: measured on two
cores (2026-12-02), the quick throughput workload cost 345-380 us of CPU
per message with the process free to use both cores and 210-260 us pinned
to one, and ran 1.3-2x faster; two PostgreSQL workers pinned to one core
each drained 30% faster than two unpinned. Other Python systems gain too
(the README has the numbers), so it is a deployment choice, not a default:
one process per core, each pinned to its own.

:func:`parse_cpus` is the pure part (the flag's syntax and its checks);
:func:`pin_process` applies it to every thread the process has, and the
threads started later inherit it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .errors import ConfigError


def parse_cpus(spec: str, allowed: Iterable[int]) -> frozenset[int]:
    """The CPUs ``spec`` names (``"1"``, ``"0,2"``, ``"0-3"``), each one of ``allowed``
    (the CPUs this process may use); a :class:`ConfigError` (field ``cpus``) otherwise."""
    usable = sorted(set(allowed))
    chosen: set[int] = set()
    for part in spec.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise ConfigError(f"--cpus {spec!r}: {part.strip()!r} is not a CPU number or a "
                              "range like 0-3", field="cpus") from None
        if first < 0 or last < first:
            raise ConfigError(f"--cpus {spec!r}: {part.strip()!r} is not a range of CPU "
                              "numbers (low-high, low <= high)", field="cpus")
        if usable and last > usable[-1]:  # before the range is spelled out: 0-999999999
            chosen.add(last)
        else:
            chosen.update(range(first, last + 1))
    outside = sorted(chosen - set(usable))
    if outside:
        raise ConfigError(f"--cpus {spec!r}: CPU {', '.join(map(str, outside))} is not one "
                          f"this process may use ({', '.join(map(str, usable))})",
                          field="cpus")
    return frozenset(chosen)


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on now; a :class:`ConfigError` where the platform
    cannot pin a process (``os.sched_setaffinity`` is Linux's)."""
    if not hasattr(os, "sched_getaffinity") or not hasattr(os, "sched_setaffinity"):
        raise ConfigError("--cpus: this platform cannot pin a process to CPUs (it needs "
                          "Linux's sched_setaffinity); use the system's own tool", field="cpus")
    return frozenset(os.sched_getaffinity(0))


def pin_process(cpus: frozenset[int]) -> None:
    """Run every thread of this process, and every thread it starts later, on ``cpus``."""
    tasks = Path("/proc/self/task")
    ids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    for tid in ids:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # a thread that ended since the listing
            continue
