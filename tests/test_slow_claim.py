"""A claim answered after the dispatcher stopped waiting: the rows it leased still run.

On SQLite the dispatcher's claim is a writer operation. When its batch runs past the
claim's wait (a slow disk, a database another process keeps locked), the wait ends with a
``WriteTimeout`` that says the claim may yet commit, and the dispatcher took it as a claim
that failed. It then committed: its rows were leased to this runtime with nothing to run
them (no slot held, no lease renewed) until their leases ran out, and then only as
suspects, one at a time. A write that landed counts as written (as a turn's commit does,
``steps.landed``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.persistence import GroupCommitWriter
from kinbox.persistence import writer as writer_module

from .helpers import SHORT, wait_for

MakeRuntime = Callable[..., Runtime]

pytestmark = pytest.mark.timeout(60)


class ClaimFailedHeard(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "claim failed" in message or "slow" in message:  # taken as failed, or waited on
            self.event.set()


def test_a_claim_answered_after_its_wait_runs_the_rows_it_leased(
        make_runtime: MakeRuntime, clock: ManualClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def brain(turn: Turn) -> None:
        seen.append(turn.messages[0].message_id)
        if len(seen) == 1:
            raise RuntimeError("the model was busy")  # a retry, which a claim takes

    rt = make_runtime(brain=brain)
    sid = rt.create_session(rt.create_project("p").id, "S").id
    rt.post(sid, "one", message_id="m1")
    wait_for(lambda: rt.inbox()[0]["status"] == "pending" and rt.inbox()[0]["attempts"] == 1,
             what="the failed first attempt")
    rt.run_until_idle(timeout=20)

    writer = rt.context.journal.writer
    heard = ClaimFailedHeard()
    for name in ("kinbox.dispatcher", "kinbox.writer"):
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "handlers", [*logger.handlers, heard])
    # The writer's waits are short here: the claim's batch outruns them.
    monkeypatch.setattr(writer_module, "WRITE_TIMEOUT", SHORT)
    monkeypatch.setattr(writer, "call",
                        lambda op, timeout=SHORT: GroupCommitWriter.call(writer, op, timeout))
    gate, holding, batch_done = threading.Event(), threading.Event(), threading.Event()
    writer.submit(lambda: (holding.set(), gate.wait(20)))  # the writer is busy ...
    assert holding.wait(10)

    def then() -> None:
        wait_for(lambda: writer.queued() >= 1, timeout=20, what="the claim to queue")
        writer.submit(lambda: batch_done.wait(20))  # ... so the claim's batch waits on this
        gate.set()
    threading.Thread(target=then, daemon=True).start()
    clock.advance(60)  # the retry is due: the next claim takes it
    rt.context.wake_dispatcher()
    try:
        assert heard.event.wait(20), "the claim never timed out"
    finally:
        batch_done.set()  # the claim commits: m1 leased to this runtime
    wait_for(lambda: rt.inbox()[0]["status"] == "delivered", timeout=20,
             what="the claimed row's turn")
    assert seen == ["m1", "m1"]
    assert not rt.inbox()[0]["suspect"]


def test_a_cron_run_leased_after_its_wait_still_runs(
        make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Firing a due job leases its run to this runtime, as a claim leases rows. A fire
    whose batch outran the writer's wait was taken as failed: the tick ended, the run
    committed leased here with nothing to run or renew it, and it ran only once its lease
    ran out, taken over (a takeover counted against the run's limit)."""
    from kinbox.persistence import firing

    clock = ManualClock(1_700_000_040.0)  # a whole minute: an every-minute job is due in 60 s
    rt = make_runtime(brain=lambda turn: "done", clock=clock)
    job_id = str(rt.cron.add("tick", "* * * * *", "Say the time.")["job_id"])
    writer = rt.context.journal.writer
    monkeypatch.setattr(writer_module, "WRITE_TIMEOUT", SHORT)
    monkeypatch.setattr(writer, "call",
                        lambda op, timeout=SHORT: GroupCommitWriter.call(writer, op, timeout))
    entered, release = threading.Event(), threading.Event()
    real_fire = firing.fire_due

    def slow_fire(*args: object, **kwargs: object) -> object:
        entered.set()
        assert release.wait(20)  # the batch runs past the fire's wait
        return real_fire(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(firing, "fire_due", slow_fire)
    advancing = threading.Thread(target=clock.advance, args=(60.0,), daemon=True)
    advancing.start()  # the job is due: a tick fires it
    assert entered.wait(20), "the due job was never fired"
    threading.Timer(SHORT * 3, release.set).start()  # past the wait, well inside a lease
    wait_for(lambda: [r["status"] for r in rt.cron.runs(job_id)] == ["success"], timeout=20,
             what="the leased run to run")
    [run] = rt.cron.runs(job_id)
    assert run["takeovers"] == 0 and clock.now() == 1_700_000_100.0
    advancing.join(20)
