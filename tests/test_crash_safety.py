"""SIGKILL a real runtime process again and again: nothing lost, nothing run twice.

The deliberately broken variants (ack before the turn; a two-step commit
without the marker check) run the same harness and must be caught, which
shows the checker can fail.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kinbox.actors.crash_check import judge
from kinbox.actors.crash_run import CrashRun, evidence, prepare, run_with_kills


def check(run: CrashRun, ids: list[str]) -> list[str]:
    """Every guarantee violation the run's evidence proves."""
    return judge(evidence(run), ids).problems


KILL_WINDOW = {"sqlite": 0.04, "postgresql": 0.1}
"""Seconds after its turns (below) within which a life is killed, per backend. A life on
PostgreSQL takes longer to its first claim: before the kills were placed by turns, within
0.04 s every kill landed before any turn ran. Not much longer: on a quiet machine a life
delivers hundreds of messages in 0.6 s, and the 4,000 ran out after 17 kills."""

KILL_AFTER_TURNS = 40
"""A life is killed once it started a random number of turns up to this (then within its
kill window). A window of time alone is no moment in the work on a loaded machine: there a
life took 5 to 18 s to say "ready" and then, in 40 ms, never reached a turn, life after
life, so no kill landed mid-delivery."""


@pytest.mark.slow
@pytest.mark.timeout(600)  # 21 lives; each took up to 18 s to start on a loaded machine
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_random_kills_lose_nothing_and_never_run_a_turn_twice(
        any_db_url: str, tmp_path: Path, flavour: str) -> None:
    ids = prepare(any_db_url, sessions=50, messages=4000)
    run = run_with_kills(any_db_url, tmp_path / "turns.log", kills=20, seed=7,
                         max_gap=KILL_WINDOW[any_db_url.partition(":")[0]],
                         max_turns=KILL_AFTER_TURNS,
                         args=("async",) if flavour == "async" else ())
    assert run.kills >= 20, f"only {run.kills} kills landed before the work ran out"
    assert check(run, ids) == []
    # the kills really interrupted delivery: some lives ended after turns ran, work left
    assert any(0 < len(d) < len(ids) for d in run.delivered_before_kill)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("fault", "symptom"), [
    ("ack_before_turn", "without a committed turn"),
    ("skip_marker_check", "committed turns"),
])
def test_the_checker_catches_a_broken_delivery_variant(tmp_path: Path, fault: str,
                                                       symptom: str) -> None:
    url = f"sqlite:///{tmp_path / 'broken.db'}"
    ids = prepare(url, sessions=50, messages=1500)
    child = (sys.executable, str(Path(__file__).parent / "broken_child.py"), fault)
    run = run_with_kills(url, tmp_path / "turns.log", kills=15, seed=11, child=child,
                         max_turns=KILL_AFTER_TURNS)
    problems = check(run, ids)
    assert any(symptom in p for p in problems), problems[:5]
