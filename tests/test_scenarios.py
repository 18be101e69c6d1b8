"""Every scenario in scenarios/ runs to the end with its expectations met, on both backends;
timelines tell the true story; one database holds many runs."""

from __future__ import annotations

import io
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import Runtime, scenario_files
from kinbox.actors.cli_scenario import run_scenario
from kinbox.actors.scenario_report import render_mermaid, render_text

from .conftest import PG_URL, reset_postgres
from .helpers import database_down

SCENARIOS = sorted((Path(__file__).resolve().parent.parent / "scenarios").glob("*.py"))
NAMES = [p.stem for p in SCENARIOS]
BY_NAME = dict(zip(NAMES, SCENARIOS, strict=True))


def run(name: str, url: str, seed: int = 0, stream: io.StringIO | None = None) -> dict[str, Any]:
    report, _ = run_scenario(str(BY_NAME[name]), url, seed=seed, stream=stream or io.StringIO())
    return report


def failures(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in report["expectations"] if not e["ok"]]



@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", NAMES)
def test_scenario_meets_its_expectations(name: str, any_db_url: str) -> None:
    report = run(name, any_db_url)
    assert report["expectations"], "a scenario must check something"
    assert not failures(report), failures(report)


@pytest.mark.timeout(60)
def test_two_devices_on_postgresql_removes_the_laptops_folder(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The phone on a server database: the laptop's file goes in a folder of the run's own.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    made: list[str] = []
    mkdtemp = tempfile.mkdtemp

    def recorded(*args: Any, **kwargs: Any) -> str:
        made.append(mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recorded)
    report = run("two_devices", pg_url)
    assert not failures(report), failures(report)
    laptops = [m for m in made if Path(m).name.startswith("kinbox-laptop-")]
    assert len(laptops) == 1
    assert not Path(laptops[0]).exists()


def test_the_scenarios_of_one_run_per_database_say_so() -> None:
    assert {"focal_day", "two_devices"} == ONE_PER_DATABASE


def test_every_scenario_tells_its_story_in_a_docstring() -> None:
    import ast

    for path in SCENARIOS:
        assert ast.get_docstring(ast.parse(path.read_text())), path.name


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", NAMES)
def test_the_same_seed_gives_the_same_report(name: str, tmp_path: Path) -> None:
    reports = [run(name, f"sqlite:///{tmp_path / f'sc{n}.db'}", seed=5) for n in range(2)]
    assert reports[0]["timeline"] == reports[1]["timeline"]
    assert reports[0]["messages"] == reports[1]["messages"]
    assert render_mermaid(reports[0]) == render_mermaid(reports[1])


# -- item 5: the timeline is causal ----------------------------------------------------------

def check_causal(report: dict[str, Any]) -> None:
    """Every turn follows the send of its messages; nothing of a life follows its crash."""
    sent_at: dict[str, int] = {}
    crashed: set[int] = set()
    for i, e in enumerate(report["timeline"]):
        if e["event"] == "sent":
            sent_at.setdefault(e["message_id"], i)
        if e["event"] == "crashed":
            crashed.add(e["life"])
        if e["event"] in ("turn_committed", "turn_failed"):
            assert e["life"] not in crashed, f"life {e['life']} committed after its crash: {e}"
            for mid in e.get("message_ids") or [e["message_id"]]:
                assert sent_at.get(mid, -1) < i, f"turn on {mid} before it was sent"


@pytest.mark.parametrize("seed", range(6))
def test_hello_tells_the_conversation_in_the_order_it_happened(seed: int, db_url: str) -> None:
    report = run("hello", db_url, seed)
    check_causal(report)
    turns = [(report["sessions"][t["session"]], t["replies"]) for t in report["turns"]]
    assert turns == [("Bob", ["Bob read: Hello Bob!"]), ("Bob", ["Bob read: How are you?"]),
                     ("Alice", ["Glad to hear it."])]
    lines = render_text(report).splitlines()
    order = [next(i for i, x in enumerate(lines) if text in x) for text in
             ("replying 'Bob read: Hello Bob!'", "replying 'Bob read: How are you?'",
              "replying 'Glad to hear it.'")]
    assert order == sorted(order)


@pytest.mark.parametrize("name", NAMES)
def test_every_timeline_is_causal(name: str, db_url: str) -> None:
    check_causal(run(name, db_url, seed=3))


def test_crash_restart_tells_the_crash_where_it_happened(db_url: str) -> None:
    report = run("crash_restart", db_url)
    events = [(e["life"], e["event"], tuple(e.get("replies", ())), e.get("text"))
              for e in report["timeline"] if e["event"] in
              ("turn_committed", "crashed", "started", "note")]
    assert events == [
        (1, "started", (), None),
        (1, "turn_committed", ("reviewed draft 1",), None),
        (1, "note", (), "kill the runtime mid-turn"),
        (1, "crashed", (), None),
        (2, "started", (), None),
        (2, "turn_committed", ("reviewed draft 2",), None),
        (2, "turn_committed", ("reviewed draft 3",), None),
    ]
    diagram = render_mermaid(report)
    notes = [x.split(": ", 1)[1] for x in diagram.splitlines() if "Note over" in x]
    assert notes == ["turn committed: reviewed draft 1", "kill the runtime mid-turn",
                     "runtime crashed", "runtime restarted, replaying",
                     "turn committed: reviewed draft 2", "turn committed: reviewed draft 3"]
    arrows = [x for x in diagram.splitlines() if "->>" in x]
    assert len(arrows) == 3  # the editor sent all three before the script let turns run
    assert diagram.index(arrows[2]) < diagram.index("reviewed draft 1")


# -- item 7: the report covers the run; many runs share one database ---------------------------

ONE_PER_DATABASE = {n for n, p in BY_NAME.items()
                    if scenario_files.once_per_database(scenario_files.load(p), p)}
"""Scenarios of what a database holds once (they say so: ``ONCE_PER_DATABASE``): the one
Focal agent (its heartbeat schedule and notes persist, so a second run continues the first
one's day) and a device pairing (the second run would find the devices already paired)."""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", sorted(set(NAMES) - ONE_PER_DATABASE))
def test_a_scenario_runs_twice_on_one_database(name: str, any_db_url: str) -> None:
    first, second = run(name, any_db_url), run(name, any_db_url)
    assert not failures(second), failures(second)
    assert second["summary"]["messages"] == first["summary"]["messages"]
    assert {m["id"] for m in first["messages"]}.isdisjoint(m["id"] for m in second["messages"])


@pytest.mark.timeout(90)
def test_seeded_ids_do_not_collide_across_scenarios_on_one_database(any_db_url: str) -> None:
    for name in ("crash_restart", "hello", "subagents"):  # each draws the same first ids
        report = run(name, any_db_url)
        assert not failures(report), (name, failures(report))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", sorted(ONE_PER_DATABASE))
def test_a_one_per_database_scenario_runs_after_other_scenarios(name: str,
                                                                 any_db_url: str) -> None:
    # "Runs never collide on a shared --db": a scenario that must be the first of its own
    # kind on a database still checks only its own run's rows, not what hello left there.
    run("hello", any_db_url)
    report = run(name, any_db_url)
    assert not failures(report), failures(report)


def test_the_report_covers_the_run_not_the_database(db_url: str) -> None:
    run("retry_requeue", db_url)
    report = run("hello", db_url)
    assert report["summary"]["messages"] == 3
    assert report["summary"]["states"] == {"delivered": 3}
    assert all(m["content"] != "load sales.csv" for m in report["messages"])


@pytest.mark.skipif(not PG_URL, reason="needs KINBOX_TEST_PG_URL")
def test_the_same_seed_gives_the_same_report_on_postgresql() -> None:
    assert PG_URL is not None
    reports = []
    for _ in range(2):
        reset_postgres(PG_URL)
        reports.append(run("hello", PG_URL, seed=2))
    assert reports[0]["timeline"] == reports[1]["timeline"]
    assert reports[0]["messages"] == reports[1]["messages"]


# -- item 18: progress counters add up ---------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_the_progress_counters_add_up(name: str, db_url: str) -> None:
    stream = io.StringIO()
    report = run(name, db_url, stream=stream)
    done = stream.getvalue().splitlines()[-1]
    counts = {k: int(v) for k, v in re.findall(r"([a-z ]+): (\d+)", done.removeprefix("done"))}
    counts = {k.strip(): v for k, v in counts.items()}
    s = report["summary"]
    assert counts["messages"] == s["messages"], done
    assert counts["delivered"] == s["states"].get("delivered", 0), done
    assert counts["failed attempts"] == s["failed_attempts"], done
    assert counts["delivered"] <= counts["messages"]


def test_a_script_waiting_on_its_own_is_told_why_no_turn_runs(
        tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from kinbox.actors import scenario_brain

    monkeypatch.setattr(scenario_brain, "HELD_WARNING_SECONDS", 0.05)
    script = tmp_path / "bare_wait.py"
    script.write_text(
        "import threading\n\ndef run(sc):\n    rt = sc.start()\n"
        "    bob = rt.create_session(None, 'Bob')\n    ran = threading.Event()\n"
        "    sc.on(bob.id, lambda turn: ran.set())\n    rt.post(bob.id, 'hi')\n"
        "    sc.expect(not ran.wait(1), 'no turn runs while the script waits on its own')\n"
        "    sc.expect(sc.wait(ran), 'the turn runs once the script waits through sc.wait')\n")
    with caplog.at_level("WARNING", logger="kinbox.scenario"):
        report, _ = run_scenario(str(script), db_url, stream=io.StringIO())
    assert not failures(report), failures(report)
    assert "sc.settle() or sc.wait(event)" in caplog.text


def test_a_requeued_message_keeps_its_failed_attempts_in_the_report(any_db_url: str) -> None:
    """A requeue resets the row's ``attempts``: the diagram drew the message that failed
    five times as "(delivered, 0 failed attempts)"; the journal's history keeps them."""
    report = run("retry_requeue", any_db_url)
    (message,) = report["messages"]
    assert (message["state"], message["attempts"], message["failed_attempts"]) == (
        "delivered", 0, 5)
    assert report["summary"]["failed_attempts"] == 5
    arrows = [x for x in render_mermaid(report).splitlines() if "->>" in x]
    assert len(arrows) == 1 and arrows[0].endswith("(delivered, 5 failed attempts)")
    assert "attempts=0 (5 failed in all)" in render_text(report)
    hello = run("hello", any_db_url)
    assert [m["failed_attempts"] for m in hello["messages"]] == [0, 0, 0]


@pytest.mark.timeout(60)
def test_the_summary_counts_the_peer_links_failed_attempts(db_url: str) -> None:
    """Sends to the offline laptop failed five times (the rows say so): the summary, and
    the progress line's final count with it, said "0 failed attempts", counting turns'
    failures only."""
    stream = io.StringIO()
    report = run("two_devices", db_url, stream=stream)
    assert not failures(report), failures(report)
    assert [m["failed_attempts"] for m in report["messages"]] == [0, 0, 0, 3, 2]
    assert report["summary"]["failed_attempts"] == 5
    assert "failed attempts: 5" in stream.getvalue().splitlines()[-1]


def test_the_summary_counts_a_failed_direct_turn(tmp_path: Path, db_url: str) -> None:
    """A cron run's turn is no inbox row: its failure is in the timeline only."""
    path = tmp_path / "cron_fails.py"
    path.write_text(
        "from kinbox.actors.scenario import failing\n\ndef run(sc):\n    rt = sc.start()\n"
        "    job = rt.cron.add('j', '0 8 * * *', 'go')\n"
        "    sc.on(f\"cron-{job['job_id']}\", failing(1))\n"
        "    sc.advance(8 * 3600)\n    sc.settle()\n"
        "    runs = rt.cron.runs(job['job_id'])\n"
        "    sc.expect([r['status'] for r in runs] == ['error'], 'the run failed',"
        " repr(runs))\n")
    report, _ = run_scenario(str(path), db_url, stream=io.StringIO())
    assert not failures(report), failures(report)
    assert report["messages"] == []
    assert report["summary"]["failed_attempts"] == 1


def test_a_title_mermaid_reads_specially_is_made_safe_in_the_diagram(tmp_path: Path,
                                                                     db_url: str) -> None:
    """Notes and replies were made safe, titles not: Mermaid reads ';' as the end of a
    statement and '#' as the start of an entity code, so the participant line broke."""
    path = tmp_path / "titles.py"
    path.write_text(
        "def run(sc):\n    rt = sc.start()\n    p = sc.project('p')\n"
        "    a = rt.create_session(p.id, 'R&D; team #1')\n"
        "    b = rt.create_session(p.id, 'Ops \"on call\"')\n"
        "    rt.tools_for(a.id).agent_send(b.id, 'hi')\n    sc.settle()\n"
        "    sc.expect(True, 'sent')\n")
    report, _ = run_scenario(str(path), db_url, stream=io.StringIO())
    titles = {x.split(" as ", 1)[1] for x in render_mermaid(report).splitlines()
              if x.strip().startswith("participant")}
    assert titles == {"R&D, team no.1", "Ops 'on call'"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["subagents", "focal_day"])
def test_the_diagram_draws_every_message_of_the_journal(name: str, db_url: str) -> None:
    """Messages a turn's commit journaled (a child's result, Focal's notices) or the
    scheduler did (a wake-up, a heartbeat) have no "sent" event: the diagram left them
    out, drawing 4 of focal_day's 10 messages. Each is drawn before the turn that took it."""
    report = run(name, db_url)
    diagram = render_mermaid(report).splitlines()
    arrows = [x for x in diagram if "->>" in x]
    assert len(arrows) == len(report["messages"])
    drawn = [m["id"] for m in report["messages"]
             if any(f": {m['id'][:16]}" in a for a in arrows)]
    assert drawn == [m["id"] for m in report["messages"]]
    if name == "subagents":
        order = [next(i for i, x in enumerate(diagram) if text in x) for text in
                 ("turn committed: changelog: 14", "subagent-result-",
                  "turn committed: noted (1/2)")]
        assert order == sorted(order)


def test_a_message_id_and_kind_mermaid_reads_specially_are_made_safe(tmp_path: Path,
                                                                     db_url: str) -> None:
    """Titles, notes and replies were made safe, a message's id and kind not: an
    idempotency key such as 'order#12;b' (any text is a valid id) ended the arrow's
    statement at ';' and Mermaid read '#12;' as an entity code, a control character."""
    path = tmp_path / "ids.py"
    path.write_text(
        "def run(sc):\n    rt = sc.start()\n    p = sc.project('p')\n"
        "    a = rt.create_session(p.id, 'A')\n"
        "    rt.post(a.id, 'hi', message_id='order#12;b', kind='k;1#')\n    sc.settle()\n"
        "    sc.expect(True, 'sent')\n")
    report, _ = run_scenario(str(path), db_url, stream=io.StringIO())
    assert not failures(report), failures(report)
    (arrow,) = [x for x in render_mermaid(report).splitlines() if "->>" in x]
    assert arrow.split(": ", 1)[1] == "orderno.12,b k,1no. (delivered, 0 failed attempts)"


@pytest.mark.timeout(60)
def test_cron_social_that_fails_half_way_leaves_no_active_job(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its morning job was paused only on the script's last line: a run that raised before
    it (a turn that never came, an interrupt) left the job active, and every later
    ``kinbox scenario run --db`` on that database was refused (exit 2, "1 active cron
    job(s)") until someone paused it by hand."""
    from kinbox.actors.cli_scenario import check_database
    from kinbox.actors.errors import ConfigError
    from kinbox.actors.scenario import Scenario

    def broken(self: Scenario, seconds: float) -> None:
        raise RuntimeError("the script failed half-way")

    monkeypatch.setattr(Scenario, "advance", broken)
    report = run("cron_social", db_url)
    assert report["error"]["type"] == "RuntimeError"
    monkeypatch.undo()
    try:
        check_database(db_url)
    except ConfigError as exc:
        pytest.fail(f"the next run is refused: {exc}")


REFUSING_SLACK = (
    "def refuse(route, text):\n    raise rules.ChannelRefused(403)\n\n"
    "class Idle:\n    def __init__(self, rt):\n        self.rt = rt\n"
    "    def wait(self, timeout=None):\n"
    "        return self.rt.social.wait_idle(timeout or 10)\n\n"
    "def run(sc):\n    rt = sc.start()\n"
    "    rt.social.register_channel('slack', send=refuse)\n"
    "    rt.social.allow('slack', ['U1'])\n"
)
"""A scenario script's start: a Slack channel whose platform refuses every reply, U1
allowed (``run`` goes on from there)."""


@pytest.mark.timeout(60)
def test_the_text_report_tells_a_social_reply_that_was_not_sent(tmp_path: Path,
                                                                db_url: str) -> None:
    """The report said the thread's turn committed "replying 'Booked.'" and nothing more:
    that the platform refused the reply, or that a sender was denied, was in the JSON
    timeline only, and the text a person reads told a story where the reply went out."""
    path = tmp_path / "refused_reply.py"
    path.write_text(
        "from kinbox.actors import social_rules as rules\n\n" + REFUSING_SLACK +
        "    sc.on('social-slack-T1', lambda turn: turn.reply('Booked.'))\n"
        "    for sender in ('U1', 'U9'):\n"
        "        rt.social.ingest({'platform': 'slack', 'sender_id': sender, 'thread_id': 'T1',\n"
        "                          'text': 'book it'})\n"
        "        sc.wait(Idle(rt))\n"
        "    sc.expect(True, 'ran')\n")
    report, _ = run_scenario(str(path), db_url, stream=io.StringIO())
    assert report["error"] is None, report["error"]
    text = render_text(report)
    assert "reply of slack: U1 [social-slack-T1] via slack NOT sent: failed after 1 attempt(s)" \
        in text, text
    assert "slack event from U9 denied (not on the allowlist)" in text, text


@pytest.mark.timeout(60)
def test_the_diagram_draws_the_turns_of_sessions_no_message_reached(tmp_path: Path,
                                                                   db_url: str) -> None:
    """A social thread's (or a cron job's) turns are direct, no inbox row: the diagram drew
    participants only from the journal's messages, so a run of such turns alone was an
    empty ``sequenceDiagram`` while its text report told two turns and a refused reply."""
    path = tmp_path / "social_only.py"
    path.write_text(
        "from kinbox.actors import social_rules as rules\n"
        "from kinbox.actors.scenario import failing\n\n" + REFUSING_SLACK +
        "    sc.on('social-slack-T1', failing(1))\n"
        "    for text in ('one', 'two'):\n"
        "        rt.social.ingest({'platform': 'slack', 'sender_id': 'U1', 'thread_id': 'T1',\n"
        "                          'text': text})\n"
        "        sc.wait(Idle(rt))\n"
        "    sc.expect(True, 'ran')\n")
    report, _ = run_scenario(str(path), db_url, stream=io.StringIO())
    assert report["error"] is None, report["error"]
    assert render_mermaid(report).splitlines()[1:-1] == [
        "sequenceDiagram",
        "    participant S0 as slack: U1",
        "    Note over S0: attempt failed, direct",
        "    Note over S0: turn committed: ok",
        "    Note over S0: reply NOT sent via slack (failed)",
    ]


@pytest.mark.timeout(120)
def test_another_scenario_runs_on_a_database_focal_day_ran_on(db_url: str) -> None:
    """focal_day left its heartbeat on, whose job counted as a Focal wake-up the next
    runtime would fire with its scripted brain: every other scenario on that database was
    refused ("1 Focal wake-up(s)"), even with the heartbeat switched off by hand, since
    its job stays active and fires to do nothing. The run switches it off at its end, and
    a heartbeat that is off is no wake-up."""
    from kinbox.actors.cli_scenario import check_database
    from kinbox.actors.errors import ConfigError

    assert run("focal_day", db_url)["ok"]
    try:
        check_database(db_url)
    except ConfigError as exc:
        pytest.fail(f"the next run is refused: {exc}")
    with Runtime(db=db_url) as rt:
        rt.focal.set_heartbeat(enabled=True)
    with pytest.raises(ConfigError, match="1 Focal wake-up"):
        check_database(db_url)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["cron_social", "focal_day"])
def test_a_clean_up_that_fails_too_does_not_hide_the_error_the_run_failed_with(
        name: str, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's clean-up at its end (pausing its job, switching the heartbeat off) ran in
    a ``finally``: on a runtime the failure had taken down with it, the clean-up failed
    too, and its error replaced the one the run failed with (the report named the
    clean-up's line and its ``WriterClosed``, not the script's own error)."""
    from kinbox.actors.scenario import Scenario

    def crashed_and_failed(self: Scenario, seconds: float) -> None:
        self.crash()  # the runtime goes down with the failure: the clean-up fails too
        raise RuntimeError("the run's own failure")

    monkeypatch.setattr(Scenario, "advance", crashed_and_failed)
    report = run(name, db_url)
    error = report["error"]
    assert (error["type"], error["message"].rsplit(": ", 1)[1]) == (
        "RuntimeError", "the run's own failure"), error
    (note,) = error["notes"]
    assert "WriterClosed" in note, note
    text = render_text(report)
    assert f"  note: {note}" in text, text


OUTAGE = """\
from urllib.parse import urlsplit, urlunsplit

import psycopg2


def take_the_database_down(url):
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = psycopg2.connect(urlunsplit(parts._replace(path="/postgres")))
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s", (name,))
    admin.close()


def run(sc):
    rt = sc.start()
    job = rt.cron.add("digest", "0 8 * * *", "Write the digest.")
    with sc.cleanup(rt.cron.pause, job["job_id"]):
        take_the_database_down(sc.db_url)
        rt.create_session(None, "after the outage")
"""


@pytest.mark.postgres
@pytest.mark.timeout(90)
def test_a_database_gone_for_the_report_too_still_reports_the_scripts_error(
        tmp_path: Path, pg_url: str) -> None:
    """The database went away under the script: its call failed, then the report's reads
    of the journal did too, and their error was all the run showed (``kinbox:
    connection ... failed``, no report, not the script's line). The report now comes
    without the journal's rows, the script's error in it, the reads' failure a note."""
    path = tmp_path / "outage.py"
    path.write_text(OUTAGE)
    try:
        report, _ = run_scenario(str(path), pg_url, stream=io.StringIO())
    finally:
        with database_down(pg_url):
            pass  # it takes connections again after the block
    error = report["error"]
    line = OUTAGE.splitlines().index('        rt.create_session(None, "after the outage")') + 1
    assert (error["type"], error["path"], error["lineno"]) == (
        "OperationalError", str(path), line), error
    assert len(error["notes"]) == 2, error["notes"]  # the clean-up's, the report's reads'
    assert report["messages"] == [] and not report["ok"]
    text = render_text(report)
    assert f"error: {path}:{line}: OperationalError" in text, text
