"""Pruning through the runtime: ``rt.prune``, ``retention=``, and what a prune keeps."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kinbox.actors import ConfigError, Runtime, Turn
from kinbox.actors.clock import ManualClock
from kinbox.actors.pruning import RETENTION_INTERVAL
from kinbox.persistence.retention import MIN_RETENTION

from .helpers import wait_for

DAY = 86400.0


class Recorder:
    """A brain that records the message ids of every turn it runs."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, turn: Turn) -> None:
        self.seen += [m.message_id for m in turn.messages]
        turn.reply("ok")


def test_a_restart_after_a_prune_replays_exactly_the_unacknowledged_rows(
        make_runtime: Callable[..., Runtime], clock: ManualClock) -> None:
    first = Recorder()
    rt = make_runtime(brain=first)
    project = rt.create_project("acme")
    alice = rt.create_session(project.id, "Alice")
    for k in range(3):
        rt.post(alice.id, f"old {k}", message_id=f"old-{k}")
    rt.run_until_idle(timeout=10)
    assert first.seen == ["old-0", "old-1", "old-2"]
    rt.stop()
    # Rows that a crash or a stop left unacknowledged: written while no runtime delivers.
    clock.advance(40 * DAY)
    with Runtime(db=rt.url, clock=clock) as sender:  # send-only: claims nothing
        for k in range(2):
            sender.post(alice.id, f"new {k}", message_id=f"new-{k}")
        assert sender.prune(30 * DAY) == {"rows": 3, "markers": 3, "events": 0,
                                              "cron_runs": 0}
    second = Recorder()
    again = make_runtime(brain=second)
    again.run_until_idle(timeout=10)
    assert second.seen == ["new-0", "new-1"]
    assert [r["message_id"] for r in again.inbox()] == ["new-0", "new-1"]
    assert [e.text for e in again.transcript(alice.id) if e.role == "user"] == [
        "old 0", "old 1", "old 2", "new 0", "new 1"]


def test_a_message_id_is_deduplicated_until_its_row_is_pruned(
        make_runtime: Callable[..., Runtime], clock: ManualClock) -> None:
    """The de-duplication window of ``post(message_id=...)`` is the retention period."""
    brain = Recorder()
    rt = make_runtime(brain=brain)
    bob = rt.create_session(rt.create_project("acme").id, "Bob")
    assert rt.post(bob.id, "pay invoice 7", message_id="invoice-7").created
    rt.run_until_idle(timeout=10)
    clock.advance(10 * DAY)
    assert not rt.post(bob.id, "pay invoice 7", message_id="invoice-7").created
    rt.run_until_idle(timeout=10)
    assert brain.seen == ["invoice-7"]
    clock.advance(25 * DAY)
    assert rt.prune(30 * DAY)["rows"] == 1
    assert rt.post(bob.id, "pay invoice 7", message_id="invoice-7").created  # new again
    rt.run_until_idle(timeout=10)
    assert brain.seen == ["invoice-7", "invoice-7"]


def test_a_dry_run_prune_changes_nothing(make_runtime: Callable[..., Runtime],
                                         clock: ManualClock) -> None:
    rt = make_runtime(brain=Recorder())
    bob = rt.create_session(rt.create_project("acme").id, "Bob")
    rt.post(bob.id, "hello")
    rt.run_until_idle(timeout=10)
    clock.advance(3 * DAY)
    before = (rt.inbox(), rt.marker_counts())
    assert rt.prune(2 * DAY, dry_run=True) == {"rows": 1, "markers": 1, "events": 0,
                                                      "cron_runs": 0}
    assert (rt.inbox(), rt.marker_counts()) == before


@pytest.mark.parametrize(("args", "field"), [
    ({"older_than": 0}, "older_than"), ({"older_than": -5}, "older_than"),
    ({"older_than": float("nan")}, "older_than"), ({"older_than": "30d"}, "older_than"),
    ({"older_than": True}, "older_than"), ({"older_than": 30 * DAY, "batch": 0}, "batch"),
    ({"older_than": 30 * DAY, "batch": 2.5}, "batch"),
])
def test_prune_refuses_bad_arguments_naming_the_field(
        make_runtime: Callable[..., Runtime], args: dict[str, object], field: str) -> None:
    rt = make_runtime()
    with pytest.raises(ConfigError) as err:
        rt.prune(**args)  # type: ignore[arg-type]
    assert err.value.field == field


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), "30d", 10**400])
def test_a_bad_retention_fails_at_construction(value: object) -> None:
    with pytest.raises(ConfigError) as err:
        Runtime(db="sqlite:///unused.db", retention=value)  # type: ignore[arg-type]
    assert err.value.field == "retention"


@pytest.mark.parametrize("dry_run", [False, True])
def test_prune_refuses_an_age_shorter_than_a_peers_resends(
        make_runtime: Callable[..., Runtime], clock: ManualClock, dry_run: bool) -> None:
    """A row pruned while a paired device may still re-send it would run twice."""
    rt = make_runtime(brain=Recorder())
    bob = rt.create_session(rt.create_project("acme").id, "Bob")
    rt.post(bob.id, "hello", message_id="m-1")
    rt.run_until_idle(timeout=10)
    clock.advance(3 * DAY)
    for short in (DAY, MIN_RETENTION - 1):
        with pytest.raises(ConfigError) as err:
            rt.prune(short, dry_run=dry_run)
        assert err.value.field == "older_than"
    assert [r["message_id"] for r in rt.inbox()] == ["m-1"]
    assert rt.prune(MIN_RETENTION, dry_run=dry_run)["rows"] == 1


@pytest.mark.parametrize("value", [3600, DAY, MIN_RETENTION - 1])
def test_a_retention_shorter_than_a_peers_resends_fails_at_construction(
        value: float) -> None:
    with pytest.raises(ConfigError) as err:
        Runtime(db="sqlite:///unused.db", retention=value)
    assert err.value.field == "retention"


def test_a_runtime_with_a_retention_prunes_on_its_tick_by_its_clock(
        make_runtime: Callable[..., Runtime], clock: ManualClock) -> None:
    rt = make_runtime(brain=Recorder(), retention=7 * DAY)
    bob = rt.create_session(rt.create_project("acme").id, "Bob")
    for k in range(3):
        rt.post(bob.id, f"hello {k}")
    rt.run_until_idle(timeout=10)
    clock.advance(RETENTION_INTERVAL)  # a pass: nothing is old enough yet
    clock.advance(6 * DAY)
    rt.post(bob.id, "recent")
    rt.run_until_idle(timeout=10)
    assert len(rt.inbox()) == 4
    clock.advance(2 * DAY)  # the first three are 8 days old, the last 2 days
    wait_for(lambda: len(rt.inbox()) == 1, what="the retention's pass")
    assert [r["content"] for r in rt.inbox()] == ["recent"]
    assert rt.marker_counts() == {rt.inbox()[0]["message_id"]: 1}


def test_a_foreground_wait_reads_a_pruned_task_message_as_finished(
        make_runtime: Callable[..., Runtime], clock: ManualClock) -> None:
    """Only a finished row is ever pruned: a wait that finds its child's task message gone
    (a short retention, a slow parent) has its answer, and does not fail on the absence."""
    def brain(turn: Turn) -> None:
        if turn.session_id == "a" and turn.messages[0].content == "go":
            turn.reply(str(turn.tools.agent("compute")["task_id"]))
        else:
            turn.reply("42")  # the child: its task turn completes the task

    rt = make_runtime(brain=brain, max_active_sessions=4)
    rt.create_session(rt.create_project("p").id, "A", session_id="a")
    rt.post("a", "go")
    rt.run_until_idle(timeout=30)
    task_id = next(e.text for e in rt.transcript("a") if e.role == "assistant")
    clock.advance(3 * DAY)
    assert rt.prune(2 * DAY)["rows"] >= 2  # the task message went with the others
    assert rt.tools_for("a").child_finished(task_id) is True
