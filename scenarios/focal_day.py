"""focal_day: a day of SUZENT, the Focal agent, on the scenario clock.

The user asks SUZENT to fix a login bug and write release notes. Focal
dispatches two new sessions (``agent_send(agent_id="new", ...)``) and sets
a reminder for the stand-up in an hour. "Fix login" finds the bug but
blocks on the user (which browsers?); "Release notes" drafts and, once the
user approves, finishes its task. Focal hears each event through its inbox.
The heartbeat runs every 30 minutes: quiet while nothing needs attention,
it checks in once the question has waited two hours, then stays quiet while
nothing changes. The reminder fires at the hour.
Expected: two Focal-started sessions; a blocked notice and a finished
notice to Focal; the heartbeat run once with findings and skipped once
without change; the reminder turn and its user notification.
Focal is one agent per database, and its heartbeat schedule and notes
persist: a second run on the same ``--db`` continues the first one's day,
so a database an earlier run left Focal in is refused (exit 2) before it runs:
give a fresh one (or none: the default is a temporary one).
"""

from typing import Any

from kinbox.actors import Runtime, Turn
from kinbox.actors.scenario import Scenario

FOCAL = "focal-suzent"
ONCE_PER_DATABASE = "focal"  # a database holding an earlier run's Focal is refused


def run(sc: Scenario) -> None:
    rt = sc.start()
    # The demo's heartbeat ends with the run, whatever happened in it: a later scenario on
    # this database refuses one whose heartbeat runs (its runtime would fire it with its
    # scripted brain). Not a bare ``finally``: a switch that fails too (on a runtime the
    # failure took down) would hide the error the run failed with.
    with sc.cleanup(rt.focal.set_heartbeat, enabled=False):
        day(sc, rt)


def day(sc: Scenario, rt: Runtime) -> None:
    """The story itself: Focal's two sessions, the stand-up reminder, the heartbeats."""
    beats: list[dict[str, Any]] = []
    rt.subscribe(lambda event, data: beats.append(data) if event == "heartbeat" else None)
    rt.get_or_create_focal_chat()
    web = sc.project("web", "Web app")
    docs = sc.project("docs", "Documentation")
    started: dict[str, str] = {}

    def focal(turn: Turn) -> None:
        message = turn.messages[0]
        if message.sender_id == "user":
            for project, title, task in ((web, "Fix login", "fix the login bug"),
                                         (docs, "Release notes", "write the 2.0 notes")):
                out = turn.tools.agent_send(agent_id="new", project_id=project.id, title=title,
                                            task_title=task, message=f"Please {task}.")
                started[title] = out["agent_id"]
            turn.tools.schedule_wakeup("reminder", at=sc.clock.now() + 3600,
                                       note="stand-up in 5 minutes")
            turn.reply("On it: two sessions started, stand-up reminder set.")
        elif message.kind == "focal_heartbeat":
            turn.reply("Fix login still waits for your answer about browsers.")
        elif message.kind == "focal_wakeup":
            turn.reply("Stand-up in 5 minutes.")
        else:
            turn.reply(f"Heard: {message.kind}")

    def fix_login(turn: Turn) -> None:
        task = turn.tools.task_list()["tasks"][0]["task_id"]
        turn.tools.task_update(task, status="blocked", blocked_on="user",
                               reason="which browsers must we support?")
        turn.reply("Found it: a cookie flag. Which browsers must we support?")

    def release_notes(turn: Turn) -> None:
        if "publish" in turn.messages[0].content:
            task = turn.tools.task_list()["tasks"][0]["task_id"]
            turn.tools.task_update(task, status="completed")
            turn.reply("Published.")
        else:
            turn.reply("Draft ready for review.")

    scripts = {"Fix login": fix_login, "Release notes": release_notes}

    def by_title(turn: Turn) -> None:  # Focal's sessions get their ids only when created
        session = rt.session(turn.session_id)
        scripts[session.title](turn) if session else None

    sc.on(FOCAL, focal)
    sc.brain.on_prefix("chat-", by_title)
    rt.post(FOCAL, "Fix the login bug and write the 2.0 release notes.", sender="user")
    sc.settle()
    sc.note("the user approves the release notes")
    rt.post(started["Release notes"], "Looks good, publish it.", sender="user")
    sc.settle()

    for _ in range(5):  # 30, 60, 90, 120, 150 minutes
        sc.advance(30 * 60)
        sc.settle()

    to_focal = [r["kind"] for r in sc.inbox(target=FOCAL)]
    sessions = [rt.session(sid) for sid in started.values()]
    sc.expect(all(s is not None and s.config.get("spawned_by_focal") and s.parent_id == FOCAL
                  for s in sessions), "Focal started two sessions in their projects")
    sc.expect("task_blocked_notification" in to_focal, "Focal heard that Fix login blocked")
    sc.expect("session_finished_notification" in to_focal,
              "Focal heard that Release notes finished")
    runs = [b for b in beats if b["run"]]
    skipped_same = [b for b in beats if b["reason"] == "nothing changed since the last check-in"]
    sc.expect(len(runs) == 1 and runs[0]["findings"] == 1,
              "the heartbeat checked in once, with one finding", repr(beats))
    sc.expect(len(skipped_same) == 1, "the heartbeat was skipped once without change")
    sc.expect(to_focal.count("focal_wakeup") == 1, "the stand-up reminder fired once")
    sc.expect(any(n["text"] == "Stand-up in 5 minutes." for n in rt.focal.notifications),
              "the reminder reached the user as a notification")
