"""Pinning a kinbox process to chosen CPUs: ``kinbox --cpus 1 worker ...``.

A kinbox process runs its Python one thread at a time (the interpreter
lock), and under load that lock changes hands several times per message
(a send, the writer, the turn's thread). When the kernel spreads those
threads over several cores, every hand-off wakes a thread on another core,
whose caches hold none of what the last thread touched: measured on two
cores (2026-12-02), the quick throughput workload cost 345-380 us of CPU
per message with the process free to use both cores and 210-260 us pinned
to one, and ran 1.25-2x faster; two PostgreSQL workers pinned to one core
each drained 35-85% faster than two unpinned. Other Python systems gain too
(the README has the numbers), so it is a deployment choice, not a default:
one process per core, each pinned to its own.

:func:`parse_cpus` is the pure part (the flag's syntax and its checks);
:func:`pin_process` applies it to every thread the process has, and the
threads started later inherit it. The command line pins before its
command starts any thread.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from .errors import ConfigError

_ITEM = re.compile(r"([0-9]+)(?:-([0-9]+))?")
"""One item of a list: a CPU number or a range ``low-high`` (ASCII digits only)."""


def parse_cpus(spec: str, allowed: Iterable[int]) -> frozenset[int]:
    """The CPUs ``spec`` names (``"1"``, ``"0,2"``, ``"0-3"``), each one of ``allowed``
    (the CPUs this process may use); a :class:`ConfigError` (field ``cpus``) otherwise."""
    usable = set(allowed)
    top = max(usable, default=-1)
    chosen: set[int] = set()
    outside: list[str] = []
    for part in spec.split(","):
        item = _ITEM.fullmatch(part.strip())
        if item is None:
            raise ConfigError(f"--cpus {spec!r}: {part.strip()!r} is not a CPU number or a "
                              "range like 0-3", field="cpus")
        first = int(item.group(1))
        last = int(item.group(2)) if item.group(2) is not None else first
        if last < first:
            raise ConfigError(f"--cpus {spec!r}: {part.strip()!r} is not a range of CPU "
                              "numbers (low-high, low <= high)", field="cpus")
        # Spelled out only up to the highest usable CPU: 0-999999999 is one error, not a
        # billion numbers.
        inside = set(range(first, min(last, top) + 1))
        outside += [str(cpu) for cpu in sorted(inside - usable)]
        if last > top:
            beyond = max(first, top + 1)
            outside.append(str(beyond) if beyond == last else f"{beyond}-{last}")
        chosen |= inside & usable
    if outside:
        raise ConfigError(f"--cpus {spec!r}: CPU {', '.join(outside)} is not one this "
                          f"process may use ({', '.join(map(str, sorted(usable)))})",
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
    """Run every thread of this process, and every thread it starts later, on ``cpus``
    (listing the threads until a pass finds no new one, so a thread started by one being
    pinned is pinned too). Where there is no ``/proc`` only the calling thread is pinned,
    and the threads it starts later. A CPU the system refuses (a changed cpuset) is a
    :class:`ConfigError`."""
    done: set[int] = set()
    while True:
        tasks = Path("/proc/self/task")
        ids = {int(t.name) for t in tasks.iterdir()} if tasks.is_dir() else {0}
        fresh = ids - done
        if not fresh:
            return
        for tid in sorted(fresh):
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:  # a thread that ended since the listing
                pass
            except OSError as exc:
                raise ConfigError(f"--cpus: the system refused CPUs "
                                  f"{', '.join(map(str, sorted(cpus)))}: {exc.strerror}",
                                  field="cpus") from None
        done |= fresh
