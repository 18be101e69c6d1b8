"""``kinbox inbox prune`` as a user runs it: a real subprocess on a real database file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kinbox.persistence import CronJobRecord, CronStore, NewMessage, TurnEntry

from .conftest import Stores
from .test_cli import kinbox

pytestmark = pytest.mark.timeout(120)

LONG_AGO = 1_000_000.0
"""1970: older than any cutoff the command computes."""
FAR_AHEAD = 4_000_000_000.0
"""2096: newer than any cutoff."""


@pytest.fixture
def aged_db(db_url: str) -> str:
    """Old rows in every state (delivered, cancelled, failed, processing) and a new delivered
    one."""
    s = Stores(db_url)
    j = s.journal
    for mid, target in (("done", "a"), ("dropped", "b"), ("broken", "c"), ("waiting", "d")):
        j.enqueue(NewMessage(mid, target, f"body of {mid}"), LONG_AGO)
    j.claim("w", LONG_AGO, limit=10)
    j.complete_turn("w", "a", ["done"], [TurnEntry("user", "body of done", True, "done")],
                    LONG_AGO)
    j.retry("w", "broken", "boom", LONG_AGO, permanent=True)
    j.release("w", ["dropped", "waiting"], LONG_AGO)
    j.cancel("dropped", LONG_AGO, by="ops", reason="obsolete")
    j.enqueue(NewMessage("fresh", "e", "body of fresh"), FAR_AHEAD)
    j.claim("w", FAR_AHEAD, limit=10)
    j.complete_turn("w", "e", ["fresh"], [], FAR_AHEAD)
    s.close()
    return db_url


def rows(url: str) -> dict[str, str]:
    s = Stores(url)
    try:
        return {r["message_id"]: r["status"] for r in s.journal.rows()}
    finally:
        s.close()


def test_prune_deletes_the_old_finished_rows_and_says_how_many(aged_db: str) -> None:
    result = kinbox("inbox", "prune", "--older-than", "30d", "--db", aged_db)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("pruned 2 inbox row(s) last changed before ")
    assert "with 1 delivery marker(s) and 1 history row(s)" in result.stdout
    assert rows(aged_db) == {"broken": "failed", "waiting": "processing", "fresh": "delivered"}
    again = kinbox("inbox", "prune", "--older-than", "38h", "--db", aged_db, "--json")
    assert again.returncode == 0, again.stderr
    data = json.loads(again.stdout)
    assert (data["rows"], data["markers"], data["events"], data["dry_run"]) == (0, 0, 0, False)


def test_a_dry_run_counts_and_leaves_the_file_as_it_was(aged_db: str) -> None:
    path = Path(aged_db.removeprefix("sqlite:///"))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    result = kinbox("inbox", "prune", "--older-than", "2w", "--dry-run", "--json",
                    "--db", aged_db)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["rows"], data["markers"], data["events"], data["dry_run"]) == (2, 1, 1, True)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert len(rows(aged_db)) == 5


@pytest.mark.parametrize(("flags", "said"), [
    (["--older-than", "0d"], "more than 0"),
    (["--older-than=-5d"], "expected a duration"),
    (["--older-than", "30"], "expected a duration"),
    (["--older-than", "thirty days"], "expected a duration"),
    (["--older-than", "101000d"], "at most 100 years"),
    ([], "the following arguments are required: --older-than"),
    (["--older-than", "30d", "--batch", "0"], "--batch"),
    # Shorter than a paired device re-sends a message: a re-send would run again.
    (["--older-than", "12h"], "at least 38h"),
    (["--older-than", "37h"], "at least 38h"),
    (["--older-than", "1d", "--dry-run"], "at least 38h"),
    (["--older-than", "136799s", "--dry-run"], "at least 38h"),
])
def test_bad_flags_are_a_usage_error_that_changes_nothing(aged_db: str, flags: list[str],
                                                          said: str) -> None:
    result = kinbox("inbox", "prune", *flags, "--db", aged_db)
    assert result.returncode == 2
    assert said in result.stderr
    assert "usage: kinbox inbox prune" in result.stderr
    assert len(rows(aged_db)) == 5


def test_the_shortest_age_taken_is_the_peers_resend_horizon(aged_db: str) -> None:
    result = kinbox("inbox", "prune", "--older-than", "38h", "--dry-run", "--json",
                    "--db", aged_db)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rows"] == 2


def test_a_missing_database_is_an_error_and_creates_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nowhere.db'}"
    result = kinbox("inbox", "prune", "--older-than", "30d", "--db", url)
    assert result.returncode == 1
    assert result.stderr.startswith("kinbox: ")
    assert not (tmp_path / "nowhere.db").exists()


def test_old_finished_cron_runs_go_too_and_are_counted(aged_db: str) -> None:
    """Seven old runs of a job: the two oldest go, its five newest stay (what its next
    run's reminder reads)."""
    s = Stores(aged_db)
    crons = CronStore(s.tables, s.writer)
    crons.create(CronJobRecord("cj_1", "tick", "* * * * *", "UTC", "p", True, "none", 0,
                               None, None, None, None, LONG_AGO, LONG_AGO))
    s.writer.call(lambda: s.tables.cron_run.insert_many([
        {"id": f"cj_1@{k}", "job_id": "cj_1", "scheduled_for": LONG_AGO + 60 * k,
         "started_at": LONG_AGO + 60 * k, "finished_at": LONG_AGO + 60 * k + 1,
         "status": "success", "attempts": 1} for k in range(7)]).execute())
    s.close()
    dry = kinbox("inbox", "prune", "--older-than", "30d", "--dry-run", "--json",
                 "--db", aged_db)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["cron_runs"] == 2
    result = kinbox("inbox", "prune", "--older-than", "30d", "--db", aged_db)
    assert result.returncode == 0, result.stderr
    assert "and 2 finished cron run(s)" in result.stdout
    s = Stores(aged_db)
    try:
        left = [r.id for r in CronStore(s.tables, s.writer).runs("cj_1")]
    finally:
        s.close()
    assert left == [f"cj_1@{k}" for k in (6, 5, 4, 3, 2)]
