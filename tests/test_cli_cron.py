"""``kinbox cron``: the operator commands on a real database file."""

from __future__ import annotations

import io
import json
import time

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors.cli import main

from .conftest import Stores
from .test_cli import kinbox


def run(db: str, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["cron", *args, "--db", db], out=out)
    return code, out.getvalue()


@pytest.fixture
def cron_db(db_url: str) -> str:
    Stores(db_url).close()  # an upgraded, empty database
    return db_url


def test_add_list_pause_resume_trigger_runs_remove(cron_db: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run(cron_db, "add", "digest", "--cron", "0 9 * * 1-5", "--prompt",
                     "Summarize the inbox", "--timezone", "Europe/Paris", "--json")
    assert code == 0
    job = json.loads(text)
    job_id = job["job_id"]
    assert (job["active"], job["delivery"], job["timezone"]) == (True, "announce", "Europe/Paris")
    code, text = run(cron_db, "list")
    assert code == 0 and job_id in text and "active" in text and "digest" in text
    assert json.loads(run(cron_db, "pause", job_id, "--json")[1])["active"] is False
    code, _ = run(cron_db, "trigger", job_id)
    assert code == 1 and "paused; resume it first" in capsys.readouterr().err
    resumed = json.loads(run(cron_db, "resume", job_id, "--json")[1])
    assert resumed["active"] and resumed["next_run_at"] > time.time()
    triggered = json.loads(run(cron_db, "trigger", job_id, "--json")[1])
    assert triggered["next_run_at"] <= time.time()
    assert run(cron_db, "runs", job_id) == (0, "no runs\n")
    assert run(cron_db, "remove", job_id)[0] == 0
    code, _ = run(cron_db, "remove", job_id)
    assert code == 1 and f"no cron job with id '{job_id}'" in capsys.readouterr().err
    assert run(cron_db, "list") == (0, "no cron jobs\n")


def test_the_listing_shows_the_next_run_in_the_jobs_own_time_zone(cron_db: str) -> None:
    """A job at 09:00 in Paris was listed as due at 08:00:00 (in winter) or 07:00:00: UTC,
    unsaid, so it read as a job due an hour or two early."""
    job = json.loads(run(cron_db, "add", "digest", "--cron", "0 9 * * *", "--prompt", "p",
                         "--timezone", "Europe/Paris", "--json")[1])
    code, text = run(cron_db, "list")
    assert code == 0 and job["job_id"] in text
    assert " 09:00 CET" in text or " 09:00 CEST" in text, text
    assert "0 9 * * * (Europe/Paris)" in text  # the expression's zone, named
    code, text = run(cron_db, "pause", job["job_id"])
    assert code == 0 and "0 9 * * * (Europe/Paris)" in text


def test_invalid_jobs_are_refused_with_a_clear_error_and_nothing_written(
        cron_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    for args, fragment in ((["--cron", "every day", "--prompt", "p"], "not a crontab"),
                           (["--cron", "* * * * *", "--prompt", " "], "prompt"),
                           (["--cron", "* * * * *", "--prompt", "p", "--timezone", "Nowhere"],
                            "unknown time zone")):
        code, _ = run(cron_db, "add", "job", *args)
        assert code == 1 and fragment in capsys.readouterr().err
    code, text = run(cron_db, "list", "--json")
    assert (code, json.loads(text)) == (0, {"items": [], "more": False, "next_offset": None})


def test_a_job_triggered_from_the_cli_runs_in_a_runtime_with_a_brain(cron_db: str) -> None:
    job_id = json.loads(run(cron_db, "add", "ping", "--cron", "0 0 1 1 *", "--prompt", "ping",
                            "--json")[1])["job_id"]
    run(cron_db, "trigger", job_id)

    def brain(turn: Turn) -> str:
        return "pong"

    with Runtime(db=cron_db, brain=brain, clock=ManualClock(time.time() + 1)) as rt:
        rt.run_until_idle()
    code, text = run(cron_db, "runs", job_id, "--json")
    assert code == 0
    [record] = json.loads(text)["items"]
    assert (record["status"], record["result"]) == ("success", "pong")


def test_the_console_script_has_the_cron_commands(cron_db: str) -> None:
    result = kinbox("cron", "list", "--db", cron_db)
    assert result.returncode == 0 and result.stdout == "no cron jobs\n"
    result = kinbox("cron", "runs", "nope", "--db", cron_db)
    assert result.returncode == 1 and "no cron job with id 'nope'" in result.stderr
