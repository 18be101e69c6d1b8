"""Three worker processes on one PostgreSQL, one SIGKILLed and restarted every 2 seconds,
one running with its clock 10 minutes fast: nothing lost, no turn committed twice, nothing
left in processing, per-session order kept, and never two turns of one session at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from .scale_harness import (
    Db,
    Workers,
    check_outcome,
    create_turn_table,
    require_faketime,
    run_with_kills,
    send_in_background,
    sessions_for,
)

pytestmark = pytest.mark.postgres


def run(pg_url: str, tmp_path: Path, sessions: int, messages: int,
        deadline: float) -> dict[str, int]:
    require_faketime()
    db = Db(pg_url)
    sender, sids = sessions_for(pg_url, str(tmp_path), sessions)  # creates the schema
    create_turn_table(db)
    workers = Workers(pg_url, 3, tmp_path, skewed=(1, 2))
    try:
        workers.start()
        sending = send_in_background(sender, sids, messages)
        kills = run_with_kills(db, workers, messages, every=2.0, deadline=deadline)
        sending.join(30)
        workers.stop()
        outcome = check_outcome(db, workers, messages)
        assert kills >= 1
        return {**outcome, "kills": kills}
    finally:
        workers.stop()
        sender.stop()
        db.close()


@pytest.mark.timeout(90)
def test_three_workers_one_killed_every_two_seconds_one_skewed_lose_and_double_nothing(
        pg_url: str, tmp_path: Path) -> None:
    run(pg_url, tmp_path, sessions=20, messages=300, deadline=60)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_5000_messages_to_200_sessions_three_workers_killed_every_two_seconds(
        pg_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # About 2 minutes on this machine: only when asked for by marker (``-m slow``).
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the 5,000-message run with kills runs only with -m slow")
    out = run(pg_url, tmp_path, sessions=200, messages=5000, deadline=240)
    print(out)
