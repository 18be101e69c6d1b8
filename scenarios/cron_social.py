"""cron_social: a Slack thread and a morning cron job reach sessions that answer by agent_send.

Ann writes in a Slack thread. The signed event goes through social ingress
(allowlisted by her sender id) into the session ``social-slack-<thread>``; its
turn asks the "Concierge" session of the ``social`` project with
``agent_send``, and the Concierge answers the same way. The answer's turn
in the thread's session replies, and that reply leaves through the Slack
channel adapter by the thread's reply route. A message from someone not
on the allowlist is denied. At 08:00 the "morning digest" cron job runs
its turn in ``cron-<job>`` (``default`` project), opened by the system
reminder; it files the digest with the "Digest" session by ``agent_send``,
which confirms the same way; the cron session cannot reach the Slack
thread (another project). Expected: both answers arrived, the reply left
by its route, the cron run succeeded and was announced, every inbox
message ran exactly one turn, and no social event or cron run went
through the inbox.
"""

import threading
from typing import Any

from kinbox.actors import Runtime, ToolError, Turn
from kinbox.actors.scenario import Scenario


class SocialIdle:
    """What ``sc.wait`` waits on: every accepted social event through its turn."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def wait(self, timeout: float | None = None) -> bool:
        return self.rt.social.wait_idle(10.0 if timeout is None else timeout)


def run(sc: Scenario) -> None:
    rt = sc.start()
    thread_id = f"T{rt.new_id()[:6]}"  # a thread of this run (runs may share a database)
    concierge = rt.create_session(rt.project("social").id, "Concierge")
    digest = rt.create_session(rt.project("default").id, "Digest")
    job = rt.cron.add("morning digest", "0 8 * * *", "Write the morning digest.")
    # The demo's job ends with the run, whatever happened in it: a later scenario on this
    # database refuses a database with active schedules (its runtime would fire them with
    # its scripted brain). Not a bare ``finally``: a pause that fails too (on a runtime the
    # failure took down) would hide the error the run failed with.
    with sc.cleanup(rt.cron.pause, job["job_id"]):
        play(sc, rt, job, concierge.id, digest.id, thread_id)


def play(sc: Scenario, rt: Runtime, job: dict[str, Any], concierge_id: str, digest_id: str,
         thread_id: str) -> None:
    """The story itself: the Slack thread, the denied sender, the 08:00 run, the checks."""
    thread = f"social-slack-{thread_id}"
    cron_session = f"cron-{job['job_id']}"
    sent: list[tuple[dict[str, Any], str]] = []
    rt.social.register_channel("slack", send=lambda route, text: sent.append((route, text)))
    rt.social.allow("slack", ["U-ann"])
    refusals: list[str] = []
    # A direct (cron, social) turn's sends reach their targets while it is still
    # committing; an answer waits for the commit it answers, so the report is the same
    # run after run (the scenario's observer has recorded it by then).
    committed = {thread: threading.Event(), cron_session: threading.Event()}

    def on_commit(event: str, data: dict[str, Any]) -> None:
        if event == "turn_committed" and data.get("session_id") in committed:
            committed[data["session_id"]].set()

    rt.subscribe(on_commit)

    def thread_turn(turn: Turn) -> None:
        first = turn.messages[0]
        if first.kind == "social_message":
            question = first.content.splitlines()[-1]
            turn.tools.agent_send(concierge_id, f"Ann asks: {question}")
            turn.reply("Let me check with the concierge.")
        else:
            turn.reply(f"The concierge says: {first.content}")

    def concierge_turn(turn: Turn) -> None:
        committed[thread].wait(10)
        turn.tools.agent_send(thread, "Your table for two is booked at 20:00.")
        turn.reply("answered Ann's thread")

    def cron_turn(turn: Turn) -> None:
        first = turn.messages[0]
        if first.kind != "cron":
            turn.reply(f"noted: {first.content}")
            return
        turn.tools.agent_send(digest_id, "Digest: one guest question answered overnight.")
        try:
            turn.tools.agent_send(thread, "good morning")
        except ToolError as exc:
            refusals.append(exc.code)
        turn.reply("digest filed")

    def digest_turn(turn: Turn) -> None:
        committed[cron_session].wait(10)
        turn.tools.agent_send(cron_session, "Digest received and filed.")
        turn.reply("filed")

    sc.on(thread, thread_turn)
    sc.on(concierge_id, concierge_turn)
    sc.on(cron_session, cron_turn)
    sc.on(digest_id, digest_turn)

    route = {"channel": "C-dining", "thread_ts": thread_id}
    rt.social.ingest({"platform": "slack", "sender_id": "U-ann", "sender_name": "Ann",
                      "thread_id": thread_id, "text": "Can you book a table tonight?",
                      "reply_route": route, "event_id": f"{thread_id}-1"})
    for _ in range(2):  # the thread's turn, then the answer's turn and its reply
        sc.wait(SocialIdle(rt))
        sc.settle()
    # Then someone off the allowlist, using Ann's display name (once the thread is quiet,
    # so the refusal's place on the timeline is the same run after run).
    rt.social.ingest({"platform": "slack", "sender_id": "U-eve", "sender_name": "Ann",
                      "thread_id": thread_id, "text": "cancel everything",
                      "event_id": f"{thread_id}-2"})
    sc.wait(SocialIdle(rt))
    sc.note("the Slack thread is answered; now the clock moves to 08:00")
    sc.advance(8 * 3600)
    sc.settle()

    transcript = [e.text for e in rt.transcript(thread) if e.visible]
    sc.expect(transcript[0].startswith('[slack message from "Ann" (sender id U-ann)]'),
              "the thread's turn opened with the envelope line", transcript[0])
    sc.expect(transcript[-1] == "The concierge says: Your table for two is booked at 20:00.",
              "the Concierge's answer reached the thread by agent_send", transcript[-1])
    sc.expect(sent == [(route, "Let me check with the concierge."),
                       (route, "The concierge says: Your table for two is booked at 20:00.")],
              "both replies left through the Slack channel by the thread's route", repr(sent))
    stats = rt.social.statistics()
    sc.expect(stats["denied"] == 1 and stats["accepted"] == 2,
              "the sender not on the allowlist was denied, whatever the display name")
    runs = rt.cron.runs(job["job_id"])
    sc.expect([r["status"] for r in runs] == ["success"], "the 08:00 run succeeded once")
    reminder = rt.transcript(cron_session)[0].text
    sc.expect(reminder.startswith('<system-reminder>Scheduled cron job "morning digest"'),
              "the cron turn opened with the system reminder", reminder.splitlines()[0])
    sc.expect(rt.transcript(cron_session)[-1].text == "noted: Digest received and filed.",
              "the Digest session answered the cron session by agent_send")
    sc.expect(refusals == ["not_found"], "the cron session cannot reach the Slack thread")
    # Its own job's: the announcements are the database's, and another runtime's jobs
    # (a deployment's) may share it.
    announced = [a["run_id"] for a in rt.cron.drain_announcements()
                 if a["job_id"] == job["job_id"]]
    sc.expect(announced == [runs[0]["run_id"]], "the finished run was announced to the UI queue",
              f"announced {announced}, ran {[r['run_id'] for r in runs]}")
    rows = sc.inbox()
    sc.expect(sorted(r["target_chat_id"] for r in rows)
              == sorted([concierge_id, thread, digest_id, cron_session]),
              "only the four agent_send messages went through the inbox",
              repr([r["target_chat_id"] for r in rows]))
    sc.expect(set(sc.marker_counts().values()) == {1}, "each inbox message ran exactly one turn")
