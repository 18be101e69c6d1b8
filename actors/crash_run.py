"""Run a runtime child process under SIGKILL, restart it, and gather the evidence.

The reusable half of the crash harness (``kinbox bench crash`` and the
crash tests share it): :func:`prepare` commits the workload before any
runtime starts, :func:`run_with_kills` kills the child at random moments
and finally lets it drain, :func:`evidence` reads what the journal and the
turn log show, for :func:`.crash_check.judge`. The child is any command
that takes ``DB_URL LOG_PATH LIFE [ARGS...]``, prints ``ready`` once up and
exits 0 when idle; :mod:`.crash_child` is the standard one.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..persistence import (
    Journal,
    NewMessage,
    SessionStore,
)
from ..persistence.opened import opened
from .crash_check import Evidence, parse_turn_log

CHILD = (sys.executable, "-m", "kinbox.actors.crash_child")
"""The standard child: a runtime that delivers what the journal holds until idle."""

READY_TIMEOUT = 60.0
"""Seconds a child may take to print ``ready``."""

TURNS_TIMEOUT = 60.0
"""Seconds a life may take to start the turns it is to be killed after."""


@dataclass
class CrashRun:
    """What happened during a run with kills."""

    url: str
    log: Path
    delivered_before_kill: list[frozenset[str]] = field(default_factory=list)
    kills: int = 0
    lives: int = 0


@contextmanager
def stores(url: str) -> Iterator[tuple[Journal, SessionStore]]:
    """A journal and session store on ``url`` (schema upgraded), closed afterwards."""
    with opened(url) as (tables, writer):
        yield Journal(tables, writer), SessionStore(tables, writer)


def prepare(url: str, sessions: int, messages: int) -> list[str]:
    """Create the sessions and commit every message before any runtime starts."""
    with stores(url) as (journal, store):
        for i in range(sessions):
            store.create_session(f"s{i:02d}", None, f"S{i}", "interactive", 0)
        ids = [f"m{k:05d}" for k in range(messages)]
        batch = [NewMessage(mid, f"s{k % sessions:02d}", f"payload {k}")
                 for k, mid in enumerate(ids)]
        for start in range(0, len(batch), 500):
            journal.enqueue_many(batch[start:start + 500], 0)
        return ids


def delivered(url: str) -> frozenset[str]:
    """Ids of the rows in state ``delivered`` now."""
    with stores(url) as (journal, _store):
        return frozenset(r["message_id"] for r in journal.rows(state="delivered"))


def evidence(run: CrashRun) -> Evidence:
    """Read the journal and the turn log of ``run``."""
    with stores(run.url) as (journal, store):
        rows = journal.rows()
        markers = store.marker_counts()
        mk = journal.t.marker
        order = [(m.session_id, m.message_id) for m in mk.select().order_by(mk.id)]
    text = run.log.read_text() if run.log.exists() else ""
    return Evidence(status={r["message_id"]: r["status"] for r in rows},
                    seq={r["message_id"]: r["seq"] for r in rows}, markers=markers,
                    marker_order=order, starts=parse_turn_log(text.splitlines()),
                    delivered_before_kill=list(run.delivered_before_kill))


def spawn(run: CrashRun, args: Sequence[str] = (),
          child: Sequence[str] = CHILD) -> subprocess.Popen[str]:
    """Start the next life of the child and wait until it says ``ready``."""
    run.lives += 1
    proc = subprocess.Popen([*child, run.url, str(run.log), str(run.lives), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the child is up (or dies)
    if line.strip() != "ready":
        proc.kill()
        _out, err = proc.communicate(timeout=READY_TIMEOUT)
        raise RuntimeError(f"crash child did not start: {line!r} {err[-2000:]}")
    return proc


def finish(run: CrashRun, args: Sequence[str] = (), child: Sequence[str] = CHILD,
           timeout: float = 120.0) -> str:
    """Run one more life to the end (it must exit 0); return its stderr."""
    proc = spawn(run, args, child)
    _out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the last life exited {proc.returncode}: {err[-3000:]}")
    return err


def run_with_kills(url: str, log: Path, kills: int, seed: int, args: Sequence[str] = (),
                   child: Sequence[str] = CHILD, max_gap: float = 0.04,
                   max_turns: int = 0) -> CrashRun:
    """Start the child, SIGKILL it ``kills`` times at random moments, then let one last
    life drain everything.

    A life is killed once it has started a random number of turns from 0 to ``max_turns``
    (counted in the turn log) and then up to ``max_gap`` seconds more. The count makes
    kills land mid-delivery however slowly the machine runs: on a loaded one a life gets
    so little of a core that in a window of time alone it never reaches its first turn."""
    rng = random.Random(seed)
    run = CrashRun(url, log)
    while run.kills < kills:
        said = run.log.stat().st_size if run.log.exists() else 0  # the lives before are dead
        proc = spawn(run, args, child)
        turns = rng.randint(0, max_turns) if max_turns else 0
        gap = rng.uniform(0.0, max_gap)
        try:
            wait_turns(run.log, said, proc, turns)
            proc.wait(timeout=gap)  # the kill moment
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            run.kills += 1
            run.delivered_before_kill.append(delivered(url))
        else:
            break  # it finished everything before this kill
    finish(run, args, child)
    return run


def wait_turns(log: Path, offset: int, proc: subprocess.Popen[str], turns: int) -> None:
    """Return once ``proc`` has started ``turns`` turns (lines of the turn log past
    ``offset``), or has exited, or after :data:`TURNS_TIMEOUT` seconds."""
    if turns <= 0:
        return
    deadline = time.monotonic() + TURNS_TIMEOUT
    pause = threading.Event()
    while proc.poll() is None and time.monotonic() < deadline:
        if log.exists():
            with log.open("rb") as f:
                f.seek(offset)
                if f.read().count(b"\n") >= turns:
                    return
        pause.wait(0.02)  # polling a file the child appends to; the deadline bounds it
