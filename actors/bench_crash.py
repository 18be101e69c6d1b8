"""``kinbox bench crash``: SIGKILL a delivering runtime again and again, then judge the journal.

A child runtime (:mod:`.crash_child`) delivers a committed workload on a
fresh SQLite file; the parent kills it with SIGKILL at random moments
(``--kills`` times), restarts it, and lets a last life drain everything.
:func:`.crash_check.judge` then reports lost messages, duplicate committed
turns, stuck rows and messages run again after their acknowledgement (all
must be 0) and re-executed turns (turns a kill interrupted before their
commit, run again: allowed, at most one per turn in flight at the kill, so
at most ``MAX_ACTIVE`` per kill). The exit status is 1 when
any guarantee failed, so CI can run the quick mode as a gate.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from .crash_check import judge
from .crash_run import evidence, prepare, run_with_kills

QUICK = {"kills": 10, "messages": 500}
FULL = {"kills": 200, "messages": 10_000}
SESSIONS = 50
"""Targets the messages are spread over (rows of one target are delivered in order)."""
MAX_ACTIVE = 64
"""Turns the child runs at once (the Runtime's default ``max_active_sessions``)."""


def crash(quick: bool, kills: int | None = None, messages: int | None = None,
          seed: int = 7) -> dict[str, Any]:
    """Run the kill loop and return the bench body (``settings``, ``results``, ``ratios``)."""
    size = QUICK if quick else FULL
    kills = size["kills"] if kills is None else kills
    messages = size["messages"] if messages is None else messages
    if kills < 0 or messages < 1:
        raise ValueError("--kills must be >= 0 and --messages >= 1")
    workdir = Path(tempfile.mkdtemp(prefix="kinbox-bench-crash-"))
    try:
        url = f"sqlite:///{workdir / 'crash.db'}"
        ids = prepare(url, sessions=min(SESSIONS, messages), messages=messages)
        started = time.perf_counter()
        run = run_with_kills(url, workdir / "turns.log", kills=kills, seed=seed)
        wall = time.perf_counter() - started
        verdict = judge(evidence(run), ids)
        bound_ok = verdict.most_reexecuted_by_one_kill <= min(MAX_ACTIVE, SESSIONS)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result: dict[str, Any] = {**verdict.as_dict(), "kills": run.kills, "lives": run.lives,
                              "messages": messages, "wall_s": round(wall, 2),
                              "ok": not verdict.problems and bound_ok}
    if verdict.problems:
        result["problems"] = verdict.problems[:20]
    return {"settings": {"kills_asked": kills, "messages": messages, "sessions":
                         min(SESSIONS, messages), "seed": seed, "backend": "sqlite",
                         "kill_gap_s": "uniform(0, 0.04) after the child is ready"},
            "results": {"kinbox": result}, "ratios": {}}
