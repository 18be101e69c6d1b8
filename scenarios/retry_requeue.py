"""retry_requeue: a brain that keeps failing is retried with backoff, fails, and is requeued.

A Planner asks an Importer to load a file; the Importer's model provider
times out on every attempt. The inbox retries after 2, 4, 8 and 16 seconds
(on the scenario clock) and marks the row ``failed`` after the fifth
failure. The provider recovers; an operator requeues the row, which keeps
its history, and the next attempt succeeds.
Expected: five failed attempts at t = 0, 2, 6, 14, 30 s, the row
``failed`` with attempts 5, then ``delivered`` after the requeue with one
committed turn.
"""

from kinbox.actors import Turn
from kinbox.actors.scenario import Scenario, failing


def run(sc: Scenario) -> None:
    rt = sc.start()
    project = sc.project("data", "Data pipeline")
    planner = rt.create_session(project.id, "Planner")
    importer = rt.create_session(project.id, "Importer")
    attempts_at: list[float] = []

    def imported(turn: Turn) -> None:
        turn.reply("imported 1,204 rows")

    flaky = failing(5, then=imported)

    def importer_turn(turn: Turn) -> object:
        attempts_at.append(sc.clock.now())
        return flaky(turn)

    sc.on(importer.id, importer_turn)
    receipt = rt.tools_for(planner.id).agent_send(importer.id, "load sales.csv")
    message_id = receipt["message_id"]
    sc.settle()
    for delay in (2, 4, 8, 16):
        sc.advance(delay)
        sc.settle()

    row = sc.inbox()[0]
    sc.expect((row["status"], row["attempts"]) == ("failed", 5),
              "the row failed after five attempts", f"{row['status']} / {row['attempts']}")
    gaps = [round(t - attempts_at[0]) for t in attempts_at]
    sc.expect(gaps == [0, 2, 6, 14, 30], "attempts backed off 2, 4, 8, 16 s", repr(gaps))

    sc.note("the provider is back; an operator requeues the row")
    rt.requeue(message_id)
    sc.settle()
    row = sc.inbox()[0]
    sc.expect(row["status"] == "delivered", "the requeued row was delivered")
    sc.expect(sc.marker_counts() == {message_id: 1}, "exactly one committed turn")
    history = [h["event"] for h in rt.context.journal.history(message_id)]
    sc.expect(history == ["retry"] * 4 + ["failed", "requeued"],
              "the row's history was kept through the requeue", repr(history))
