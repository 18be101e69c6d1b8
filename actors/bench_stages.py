"""CPU per message by stage: where a system's microseconds go, next to the bare pipeline's.

Issue #12 asks that a throughput target still out of reach be explained per
stage. Both kinbox and ``bare`` name their threads for what they do (the
writer; the session or worker threads that run turns), and the benchmark's
producer threads measure themselves (:func:`.bench_workload.produce`), so one
run of ``kinbox bench throughput`` can say, for each of the two, how many
microseconds of CPU a message costs in each stage:

- ``producers``: the send call (validation, the enqueue, the wait for its
  group commit, and for kinbox the hand-off of a fast-path row to its session);
- ``writer``: the one writer thread (the sends' inserts and leases, the turns'
  commits: SQL, the commit itself, the answers handed back);
- ``turns``: the threads that run turns (building the turn, the brain, its
  outbox and its commit request, the wait for it, the slot's end);
- ``other``: every other thread of the process (kinbox's dispatcher, ticker);
- ``process``: the whole process (``getrusage``), which also counts threads
  that ended during the run; ``system`` is its kernel share.

A thread's CPU is read from the kernel's account of it
(``/proc/self/task/<tid>/schedstat``, nanoseconds), before and after the
measured part of a run, so threads that outlive the run count only what they
spent in it; a thread that ended between the two samples counts in
``process`` only. (Not ``time.pthread_getcpuclockid``: on a thread that has
just ended it may read another thread's clock, or crash.) Where there is no
``/proc`` the threads are not sampled and only ``process`` is filled in.
:func:`per_message` is the pure part.
"""

from __future__ import annotations

import resource
import threading
from dataclasses import dataclass, field
from pathlib import Path

ROLES: tuple[tuple[str, str], ...] = (
    ("kinbox-writer", "writer"), ("bare-writer", "writer"),
    ("kinbox-session-", "turns"), ("bare-worker-", "turns"),
)
"""Thread-name prefixes and the stage each names; any other thread is ``other``."""

STAGES = ("producers", "writer", "turns", "other", "process", "system")
"""The stages a report gives, in the order a table shows them."""


def role_of(thread_name: str) -> str:
    """The stage a thread's CPU counts in, from its name."""
    for prefix, role in ROLES:
        if thread_name.startswith(prefix):
            return role
    return "other"


@dataclass(frozen=True)
class CpuSample:
    """Each live thread's CPU seconds by thread id, and the process's counters."""

    threads: dict[int, tuple[str, float]] = field(default_factory=dict)
    """Kernel thread id -> (thread name, CPU seconds)."""
    process: float = 0.0
    system: float = 0.0
    switches: int = 0
    """Voluntary context switches of the whole process (a thread waiting for another)."""


TASKS = Path("/proc/self/task")


def sample() -> CpuSample:
    """Read every live thread's CPU seconds and the process's counters."""
    threads: dict[int, tuple[str, float]] = {}
    for thread in threading.enumerate():
        tid = thread.native_id
        if tid is None:  # not started yet
            continue
        try:
            nanoseconds = int((TASKS / str(tid) / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # it ended, or there is no /proc
            continue
        threads[tid] = (thread.name, nanoseconds / 1e9)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return CpuSample(threads, usage.ru_utime + usage.ru_stime, usage.ru_stime, usage.ru_nvcsw)


def per_message(before: CpuSample, after: CpuSample, producers: float,
                messages: int) -> dict[str, float]:
    """Microseconds of CPU per message in each stage between two samples; ``producers`` is
    the producer threads' own CPU seconds (they end before ``after`` is taken). A thread
    that started between the samples counts from zero; one that ended counts in
    ``process`` only."""
    if messages <= 0:
        raise ValueError(f"stages need at least one message, got {messages}")
    seconds = dict.fromkeys(STAGES, 0.0)
    seconds["producers"] = producers
    for tid, (name, spent) in after.threads.items():
        start = before.threads.get(tid, (name, 0.0))[1]
        seconds[role_of(name)] += max(0.0, spent - start)
    seconds["process"] = after.process - before.process
    seconds["system"] = after.system - before.system
    out = {stage: round(s * 1e6 / messages, 1) for stage, s in seconds.items()}
    out["switches"] = round((after.switches - before.switches) / messages, 2)
    return out
