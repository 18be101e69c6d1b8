"""subagents: a parent hands work to two sub-agents and hears back from both.

A user asks the "Lead" session to research a release. Lead calls ``agent()``
twice: one child checks the changelog, one checks open bugs. Each child's
completion wakes Lead through the durable inbox (``subagent_result``, id
``subagent-result-<task>``), and Lead writes the summary once both are in.
Expected: five messages (the request, two task hand-offs, two results), all
delivered once; both children's tasks completed; children never hold agent
tools; Lead's last reply quotes both results.
"""

from kinbox.actors import ToolError, Turn
from kinbox.actors.scenario import Scenario


def run(sc: Scenario) -> None:
    rt = sc.start()
    project = sc.project("release", "Release 2.0")
    lead = rt.create_session(project.id, "Lead")
    results: list[str] = []
    refusals: list[str] = []

    def lead_turn(turn: Turn) -> None:
        for message in turn.messages:
            if message.kind == "subagent_result":
                results.append(message.content)
                turn.reply(f"noted ({len(results)}/2): {message.content}")
                if len(results) == 2:
                    turn.reply("Summary: " + " | ".join(sorted(results)))
            else:
                for job in ("check the changelog", "check open bugs"):
                    turn.tools.agent(description=job, title=job.title())
                turn.reply("Two helpers are on it.")

    def child_turn(turn: Turn) -> None:
        try:
            turn.tools.agent_send(lead.id, "can I message you directly?")
        except ToolError as exc:
            refusals.append(exc.code)
        job = turn.messages[0].content
        turn.reply("changelog: 14 entries, all reviewed" if "changelog" in job
                   else "bugs: 2 open, none blocking")

    sc.on(lead.id, lead_turn)
    sc.on_children(child_turn)
    rt.post(lead.id, "Is release 2.0 ready?")
    sc.settle()

    rows = sc.inbox()
    kinds = sorted(r["kind"] for r in rows)
    sc.expect(kinds == ["agent_message", "subagent_result", "subagent_result",
                        "subagent_task", "subagent_task"],
              "the request, two hand-offs and two results went through the inbox", repr(kinds))
    sc.expect(all(r["status"] == "delivered" for r in rows), "every message was delivered")
    sc.expect(set(sc.marker_counts().values()) == {1}, "each message committed exactly one turn")
    sc.expect(all(r["message_id"].startswith("subagent-result-task-")
                  for r in rows if r["kind"] == "subagent_result"),
              "results carry the subagent-result-<task> id")
    children = [s for s in rt.sessions(project.id) if s.kind == "subagent"]
    tasks = [t for c in children for t in rt.context.tasks.for_session(c.id)]
    sc.expect(len(children) == 2 and all(c.parent_id == lead.id for c in children),
              "two children of Lead in its project")
    sc.expect([t.status for t in tasks] == ["completed", "completed"],
              "both children's tasks are completed")
    sc.expect(refusals == ["execution_failed", "execution_failed"],
              "children were refused the agent tools")
    last = rt.transcript(lead.id)[-1].text
    sc.expect(last.startswith("Summary:") and "changelog" in last and "bugs" in last,
              "Lead summarized both results", last)
