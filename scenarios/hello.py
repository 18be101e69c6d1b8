"""hello: two sessions of one project talk through the durable inbox.

Alice sends Bob two messages with ``agent_send``. Bob's brain answers each
in his own transcript and, for the question, sends Alice a reply of his
own, which wakes Alice for a turn. Expected: three messages, all
``delivered`` with no failed attempts, exactly one committed turn per
message, and both transcripts holding the conversation in order.
"""

from kinbox.actors import Turn
from kinbox.actors.scenario import Scenario


def run(sc: Scenario) -> None:
    rt = sc.start()
    project = sc.project("hello", "Hello world")
    alice = rt.create_session(project.id, "Alice")
    bob = rt.create_session(project.id, "Bob")

    def bob_turn(turn: Turn) -> None:
        for message in turn.messages:
            turn.reply(f"Bob read: {message.content}")
            if message.content.endswith("?"):
                turn.tools.agent_send(alice.id, "I'm well, thanks for asking!")

    def alice_turn(turn: Turn) -> None:
        turn.reply("Glad to hear it.")

    sc.on(bob.id, bob_turn)
    sc.on(alice.id, alice_turn)

    tools = rt.tools_for(alice.id)
    tools.agent_send(bob.id, "Hello Bob!")
    tools.agent_send(bob.id, "How are you?")
    sc.settle()

    rows = sc.inbox()
    sc.expect(len(rows) == 3, "three messages were journaled", f"{len(rows)} rows")
    sc.expect(all(r["status"] == "delivered" and r["attempts"] == 0 for r in rows),
              "every message was delivered on its first attempt")
    markers = sc.marker_counts()
    sc.expect(all(markers.get(r["message_id"]) == 1 for r in rows),
              "each message committed exactly one turn")
    bob_lines = [e.text for e in rt.transcript(bob.id)]
    sc.expect(bob_lines == ["Hello Bob!", "Bob read: Hello Bob!", "How are you?",
                            "Bob read: How are you?"],
              "Bob's transcript holds both messages and answers, in order", repr(bob_lines))
    alice_lines = [e.text for e in rt.transcript(alice.id)]
    sc.expect(alice_lines == ["I'm well, thanks for asking!", "Glad to hear it."],
              "Alice was woken by Bob's reply", repr(alice_lines))
