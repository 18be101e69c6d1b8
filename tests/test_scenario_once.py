"""A scenario that runs once per database (``focal_day``, ``two_devices``), run again on
the same ``--db``: refused before it runs, exit 2 and one line, as a database with open
messages is. Each test failed on the code before its fix."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from kinbox.actors import Runtime
from kinbox.actors.cli_scenario import run_scenario
from kinbox.actors.errors import ScenarioError

from .test_scenario_cli import kinbox, script

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize(
    ("name", "what"),
    [("focal_day", "the Focal agent's session"), ("two_devices", "a device pairing")],
)
def test_a_second_run_of_a_once_per_database_scenario_is_refused_before_it_runs(
    any_db_url: str, name: str, what: str
) -> None:
    """The second run started, failed deep in the script (an IdempotencyConflict on
    Focal's heartbeat id; the laptop holding each note twice) and exited 1 with a report
    of failed expectations, having written a second day beside the first."""
    first, _ = run_scenario(name, any_db_url, stream=io.StringIO())
    assert first["ok"], first["expectations"]
    with Runtime(db=any_db_url) as rt:
        rows = len(rt.inbox())
    again = kinbox("scenario", "run", name, "--db", any_db_url)
    assert again.returncode == 2, (again.stdout[-2000:], again.stderr)
    assert again.stdout == "" and "Traceback" not in again.stderr
    [line] = again.stderr.splitlines()
    assert line.startswith("kinbox: ") and "once per database" in line and what in line
    with Runtime(db=any_db_url) as rt:
        assert len(rt.inbox()) == rows  # nothing of the script ran


@pytest.mark.parametrize("value", ["'focus'", "['focal']", "{'focal': 1}", "['focal', 'pairing']"])
@pytest.mark.parametrize("db", [True, False], ids=["db", "temporary-db"])
def test_an_unknown_once_per_database_kind_is_a_scenario_error(tmp_path: Path, value: str,
                                                               db: bool) -> None:
    """A list or a dict (a script naming both kinds) raised TypeError (unhashable) through
    ``kinbox scenario run``, a traceback; without ``--db`` no value was looked at, so the
    script ran, and failed only once given a database."""
    ran = tmp_path / "ran"
    path = script(tmp_path, f"ONCE_PER_DATABASE = {value}\ndef run(sc):\n"
                            f"    open({str(ran)!r}, 'w').close()\n    sc.start()\n")
    url = f"sqlite:///{tmp_path / 'k.db'}" if db else None
    with pytest.raises(ScenarioError) as refused:
        run_scenario(str(path), url, stream=io.StringIO())
    assert "ONCE_PER_DATABASE" in str(refused.value)
    assert not ran.exists()
