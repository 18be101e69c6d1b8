"""crash_restart: the runtime dies in the middle of a turn; nothing is lost or doubled.

An editor session sends three drafts to a Reviewer. The Reviewer is halfway
through the second draft when the runtime is killed (no graceful shutdown,
memory gone). A new runtime starts on the same database: the first draft,
already acknowledged, is not reviewed again; the second is reviewed again
from the start (its first attempt never committed) and the third follows.
Expected: three drafts delivered, each with exactly one committed turn,
the second one started twice, and the reviewer's transcript in order.
"""

import threading

from kinbox.actors import Turn
from kinbox.actors.scenario import Scenario


def run(sc: Scenario) -> None:
    rt = sc.start()
    project = sc.project("docs", "Documentation")
    editor = rt.create_session(project.id, "Editor")
    reviewer = rt.create_session(project.id, "Reviewer")
    started: list[str] = []
    halfway = threading.Event()
    never = threading.Event()

    def review(turn: Turn) -> None:
        draft = turn.messages[0].content
        started.append(draft)
        if draft == "draft 2" and started.count("draft 2") == 1:
            halfway.set()
            never.wait(30)  # the crash comes while this turn runs
        turn.reply(f"reviewed {draft}")

    sc.on(reviewer.id, review)
    tools = rt.tools_for(editor.id)
    for n in (1, 2, 3):
        tools.agent_send(reviewer.id, f"draft {n}")
    sc.expect(sc.wait(halfway), "the reviewer was halfway through draft 2")
    sc.note("kill the runtime mid-turn")
    sc.crash()
    never.set()  # the old turn finishes on a dead runtime: its commit must not land
    rt = sc.restart()
    sc.settle()

    rows = sc.inbox()
    sc.expect([r["status"] for r in rows] == ["delivered"] * 3, "all three drafts delivered")
    sc.expect(sorted(sc.marker_counts().values()) == [1, 1, 1],
              "each draft has exactly one committed turn")
    sc.expect(started == ["draft 1", "draft 2", "draft 2", "draft 3"],
              "only the interrupted draft ran again", repr(started))
    lines = [e.text for e in rt.transcript(reviewer.id) if e.role == "assistant"]
    sc.expect(lines == ["reviewed draft 1", "reviewed draft 2", "reviewed draft 3"],
              "the reviewer's transcript is complete and in order", repr(lines))
