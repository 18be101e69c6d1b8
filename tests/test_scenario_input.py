"""Scenario scripts that go wrong: each mistake is named at its line, the report tells only
what happened, and nothing is left half-written."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors.cli_scenario import run_scenario


def run_script(tmp_path: Path, text: str, url: str) -> dict[str, Any]:
    path = tmp_path / "story.py"
    path.write_text(text)
    report, _ = run_scenario(str(path), url, stream=io.StringIO())
    return report


def test_a_second_start_while_the_runtime_runs_is_named_at_its_line(
        tmp_path: Path, any_db_url: str) -> None:
    """On PostgreSQL a second start ran a second runtime beside the first, which no one
    stopped (it went on delivering after the report); on SQLite it failed on the file's
    lock and the report counted two lives."""
    report = run_script(tmp_path, "def run(sc):\n    sc.start()\n    sc.start()\n"
                                  "    sc.expect(True, 'two runtimes')\n", any_db_url)
    assert report["error"] is not None
    assert (report["error"]["type"], report["error"]["lineno"]) == ("RuntimeStateError", 3)
    assert "sc.restart()" in report["error"]["message"]
    assert report["summary"]["lives"] == 1


def test_a_start_that_fails_is_not_counted_as_a_life(tmp_path: Path, db_url: str) -> None:
    report = run_script(tmp_path, "def run(sc):\n    sc.start(max_live_sessions=0)\n", db_url)
    assert (report["error"]["type"], report["error"]["lineno"]) == ("ConfigError", 2)
    assert report["summary"]["lives"] == 0
    assert not any(e["event"] == "started" for e in report["timeline"])


def test_a_stopped_runtime_can_be_started_again_with_other_options(
        tmp_path: Path, db_url: str) -> None:
    report = run_script(tmp_path, "def run(sc):\n    sc.start()\n    sc.stop()\n"
                                  "    rt = sc.start(max_active_sessions=2)\n"
                                  "    sc.expect(rt.max_active_sessions == 2, 'restarted')\n",
                        db_url)
    assert report["ok"], report["expectations"]
    assert report["summary"]["lives"] == 2


SCRIPTED = ("def run(sc):\n    rt = sc.start()\n    p = sc.project('p')\n"
            "    bob = rt.create_session(p.id, 'Bob')\n    {call}\n"
            "    rt.post(bob.id, 'hi')\n    sc.settle()\n    sc.expect(True, 'ran on')\n")


@pytest.mark.parametrize(("call", "field"), [
    ("sc.on(7, lambda turn: None)", "session_id"),
    ("sc.on(bob.id, 'reply hello')", "script"),
    ("sc.on_children(None)", "script"),
], ids=["id-not-a-string", "script-not-callable", "children-not-callable"])
def test_a_wrong_sc_on_is_named_at_its_line(tmp_path: Path, db_url: str, call: str,
                                            field: str) -> None:
    """An id that was no string was kept and never matched (the session answered "ok", the
    script's checks failed far away); a script that could not be called failed each of
    the session's turns, retried with backoff, as if the brain were broken."""
    report = run_script(tmp_path, SCRIPTED.format(call=call), db_url)
    assert report["error"] is not None, report["expectations"]
    assert (report["error"]["type"], report["error"]["lineno"]) == ("ConfigError", 5)
    assert field in report["error"]["message"]
    assert report["summary"]["failed_attempts"] == 0


@pytest.mark.parametrize("seconds", ["float('nan')", "float('inf')", "-1", "'5'", "True"])
def test_a_clock_advance_that_is_no_time_is_named_at_its_line(tmp_path: Path, db_url: str,
                                                              seconds: str) -> None:
    """NaN was taken: the clock read NaN from then on (every later event at t=nan, no
    retry ever due) and the run went on to report ok."""
    report = run_script(tmp_path, SCRIPTED.format(call=f"sc.advance({seconds})"), db_url)
    assert report["error"] is not None, report["expectations"]
    assert (report["error"]["type"], report["error"]["lineno"]) == ("ConfigError", 5)
    assert all(e["t"] == 0.0 for e in report["timeline"])


@pytest.mark.timeout(30)
@pytest.mark.parametrize("code", ["0", "3"])
def test_a_script_that_calls_sys_exit_gets_a_failed_report(tmp_path: Path, db_url: str,
                                                           code: str) -> None:
    """``sys.exit(0)`` went past the harness: no report, no check, the exit status the
    script's (0: "every expectation held"), and the runtime left running with a turn held
    at the gate until the interpreter's exit stopped it."""
    report = run_script(tmp_path, SCRIPTED.format(call="import sys; sys.exit(" + code + ")"),
                        db_url)
    assert not report["ok"]
    assert (report["error"]["type"], report["error"]["lineno"]) == ("SystemExit", 5)
    assert [(m["content"], m["state"]) for m in report["messages"]] == []  # never posted


def test_a_script_that_exits_while_loading_is_a_usage_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "story.py"
    path.write_text("import sys\nsys.exit(0)\n\ndef run(sc):\n    pass\n")
    result = subprocess.run([sys.executable, "-m", "kinbox.actors", "scenario", "run",
                             str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"{path}:2: SystemExit" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1.0, True, "5"])
def test_a_manual_clock_refuses_a_step_it_cannot_take(seconds: object) -> None:
    """A plain ValueError for a step back (outside kinbox's errors), and NaN or infinity
    taken: every due time after it never came."""
    from kinbox.actors import ConfigError, ManualClock

    clock = ManualClock(100.0)
    with pytest.raises(ConfigError) as refused:
        clock.advance(seconds)  # type: ignore[arg-type]
    assert refused.value.field == "seconds"
    assert clock.now() == 100.0


def test_a_note_that_is_no_text_is_named_at_its_line(tmp_path: Path, db_url: str) -> None:
    """``sc.note(42)`` was kept: the text report showed it, and then ``--diagram`` died
    with an AttributeError traceback after the report was printed, writing no diagram."""
    from kinbox.actors.scenario_report import render_mermaid

    report = run_script(tmp_path, SCRIPTED.format(call="sc.note(42)"), db_url)
    assert report["error"] is not None, report["expectations"]
    assert (report["error"]["type"], report["error"]["lineno"]) == ("ConfigError", 5)
    assert "text" in report["error"]["message"]
    assert not any(e["event"] == "note" for e in report["timeline"])
    assert "sequenceDiagram" in render_mermaid(report)


def test_a_run_that_checks_nothing_says_why_it_failed(tmp_path: Path, db_url: str) -> None:
    """A run with no ``sc.expect`` fails (a run must check something), but the text report
    said only "result: FAILED" under an empty list of expectations, naming no reason."""
    from kinbox.actors.scenario_report import render_text

    report = run_script(tmp_path, "def run(sc):\n    sc.start()\n", db_url)
    assert not report["ok"] and report["expectations"] == []
    text = render_text(report)
    assert "no sc.expect" in text.split("expectations:", 1)[1]


def test_a_message_no_turn_took_counts_zero_so_a_check_of_each_fails(
        tmp_path: Path, db_url: str) -> None:
    """``sc.marker_counts()`` left out a message no turn committed: the bundled scripts'
    check that every count is 1 (``set(...) == {1}``) passed with one that never ran."""
    script = (
        "from kinbox.actors import PermanentFailure\n\n"
        "def refuse(turn):\n    raise PermanentFailure('not this one')\n\n"
        "def run(sc):\n    rt = sc.start()\n    p = sc.project('p')\n"
        "    bob = rt.create_session(p.id, 'Bob')\n    carol = rt.create_session(p.id, 'Carol')\n"
        "    sc.on(carol.id, refuse)\n    rt.post(bob.id, 'hi')\n    rt.post(carol.id, 'hi')\n"
        "    sc.settle()\n"
        "    counts = sc.marker_counts()\n"
        "    sc.expect(sorted(counts.values()) == [0, 1], 'one ran, one did not', repr(counts))\n"
        "    sc.expect(set(counts.values()) != {1}, 'the check of each fails')\n")
    report = run_script(tmp_path, script, db_url)
    assert report["ok"], report["expectations"]
