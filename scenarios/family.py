"""family: a parent, three children and a grandchild talk within the nuclear family.

Mira (a root session) has three sub-agents, Ana, Ben and Cleo; Ben has a
child of his own, Dot. The story: Ana reports to her parent by role; Mira
answers Ben by name; Mira steers Ana while Ana's long turn is running
(receipt ``queued``, and Ana sees it inside that same turn); Mira sends Ben
three quick notes, so her broadcast a moment later fails for Ben alone
(rate limit: 3 per burst, one more each second) while Ana and Cleo get it;
Mira cannot reach her grandchild Dot directly; one second later the bucket
has refilled and Ben hears the news.
Expected: every receipt printed in the timeline, the broadcast's failed
entry naming Ben and the rate limit, the steering message seen inside
Ana's running turn, and every accepted message delivered exactly once.
"""

import json
import threading

from kinbox.actors import ToolError, Turn
from kinbox.actors.scenario import Scenario


def run(sc: Scenario) -> None:
    rt = sc.start()
    project = sc.project("family", "A family of agents")
    mira = rt.create_session(project.id, "Mira")
    kids = {n: rt.create_session(project.id, n, kind="subagent", parent_id=mira.id)
            for n in ("Ana", "Ben", "Cleo")}
    dot = rt.create_session(project.id, "Dot", kind="subagent", parent_id=kids["Ben"].id)
    ana_running = threading.Event()
    steered: list[str] = []

    def receipt(label: str, r: dict) -> None:
        sc.note(f"{label}: {json.dumps(r, sort_keys=True)}")

    def ana(turn: Turn) -> None:
        if turn.messages[0].content == "start the long analysis":
            ana_running.set()
            while not steered and not turn.wait_stop_requested(0.01):
                steered.extend(m.content for m in turn.steering())
            turn.reply(f"adjusted the analysis: {steered}")
        else:
            turn.reply("noted")

    sc.on(kids["Ana"].id, ana)
    mira_tools = rt.tools_for(mira.id)
    ben_roster = rt.tools_for(kids["Ben"].id).list_agents()["agents"]
    sc.note("roster of Ben: " + ", ".join(f"{a['relationship']} {a['name']}" for a in ben_roster))
    sc.expect([a["name"] for a in ben_roster] == ["Mira", "Ana", "Cleo", "Dot"],
              "Ben's roster is parent, siblings by name, child")

    receipt("Ana -> parent", rt.tools_for(kids["Ana"].id).send(
        "the data set is loaded", receiver_role="parent"))
    receipt("Mira -> child Ben", mira_tools.send("please check the outliers",
                                                 receiver_role="child", receiver_name="Ben"))
    sc.settle()

    rt.post(kids["Ana"].id, "start the long analysis", sender=mira.id)
    sc.expect(sc.wait(ana_running), "Ana's long turn is running")
    steer = mira_tools.send("use the 2025 data only", receiver_role="child", receiver_name="Ana")
    receipt("Mira -> running Ana", steer)
    sc.settle()
    sc.expect(steer["deliveryStatus"] == "queued", "a running target's receipt says queued")
    sc.expect(steered == ["use the 2025 data only"],
              "Ana saw the steering message inside her running turn", repr(steered))

    sc.advance(3)  # Mira's bucket for Ben is full again
    for n in range(3):
        mira_tools.send(f"note {n + 1}", receiver_role="child", receiver_name="Ben")
    sc.settle()
    result = mira_tools.send("all", "we ship on Friday")
    for r in result["receipts"]:
        receipt("broadcast", r)
    sc.settle()
    failed = [r for r in result["receipts"] if "error" in r]
    sc.expect(len(result["receipts"]) == 3 and len(failed) == 1
              and failed[0]["target"] == kids["Ben"].id and "Rate limit" in failed[0]["error"],
              "the broadcast failed for Ben alone, on the rate limit")

    try:
        mira_tools.send("hello grandchild", receiver_role="child", receiver_name="Dot")
        reach = "sent"
    except ToolError as exc:
        reach = exc.message
    sc.note(f"Mira -> grandchild Dot: {reach}")
    sc.expect(reach == "Agent reach is limited to parent, siblings, and children",
              "a grandparent cannot reach a grandchild directly")

    sc.advance(1)
    receipt("Mira -> Ben, a second later", mira_tools.send(
        "we ship on Friday", receiver_role="child", receiver_name="Ben"))
    sc.settle()

    rows = sc.inbox()
    sc.expect(all(r["status"] == "delivered" for r in rows), "every accepted message delivered")
    sc.expect(set(sc.marker_counts().values()) == {1}, "each message committed exactly one turn")
    sc.expect(sc.inbox(target=dot.id) == [], "nothing reached Dot")
