"""Sub-agents (T5, A1): children created by ``agent()`` that report back durably.

A child is a session of kind ``subagent`` in its parent's project. Its work
arrives as a ``subagent_task`` message; when the turn that handles it ends,
the parent's wake-up (``subagent-result-<task>``, kind ``subagent_result``)
and the task's new status commit in the same transaction as the child's
turn, so a crash between the child's end and the parent's turn loses
nothing. A child stopped by its own parent does not wake it (the parent
knows); stopped by anyone else, it does, except by the runtime's own graceful
stop (a deploy): that turn commits a message handing the task back, which
the next start runs, so the work goes on as after a crash. A child that had
settled its task (completed, blocked, cancelled) before any of these stops
is reported as settled. A child that
left its task blocked (waiting on the user) and settles it in a later turn
wakes its parent again with that outcome.

A task message can also end outside any turn: an operator cancels it, or a
claim finds its turn died with its process once too often and makes it
``failed``. No turn commits then, so :func:`report_ended` does the same work
(the task's end, the parent's wake-up) in a transaction of its own, asked by
whoever ended the row, and by every start for what a crash in between left.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator
from functools import partial

from ..persistence import (
    NewMessage,
    PersistenceError,
    RowNotFound,
    SessionRecord,
    TaskChange,
)
from ..persistence.numbered_ids import numbered
from ..persistence.tasks import RUNNING_TASK_STATES
from . import task_rules
from .context import HookReads, RuntimeContext, TurnEffects
from .running import RUNTIME_STOP
from .tasks import TaskService
from .turn import Message, Turn, TurnOutcome

log = logging.getLogger("kinbox.subagents")

TASK_KIND = "subagent_task"
RESULT_KIND = "subagent_result"
RESULT_LIMIT = 20_000


def result_message_id(task_id: str) -> str:
    """The idempotency key of a task's (first) result wake-up."""
    return f"subagent-result-{task_id}"


def result_ids(ctx: RuntimeContext, task_id: str) -> list[str]:
    """The ids of a task's result wake-ups written so far, oldest first."""
    return taken_ids(ctx, result_message_id(task_id))


def taken_ids(ctx: RuntimeContext, base: str) -> list[str]:
    """The ids of ``base``'s messages written so far, oldest first (as :func:`next_free_id`
    chose them, in order, with no gap)."""
    return list(itertools.takewhile(lambda mid: ctx.journal.hot.existing(mid) is not None,
                                    numbered(base)))



def next_free_id(ctx: RuntimeContext, base: str) -> str:
    """``base``, or ``base-2``, ``base-3``... the first no inbox row holds: a requeued task
    reports again (its first outcome holds ``base``, with other text), a task is handed
    back after each restart that stopped it.

    Read before the commit: only this child's turns, one at a time, write these rows,
    and a commit that did not happen wrote none of them (their task is open until that
    commit, which keeps the chain from a prune). Focal's notices choose theirs inside
    the commit, where the walk holds the members it found against a prune
    (:meth:`~kinbox.persistence.hot_path.HotPath.first_free`)."""
    return ctx.journal.hot.first_free(base)


REPORT_INTERVAL = 30.0
"""Seconds between a delivering runtime's looks for child tasks whose message another
process ended (an operator's ``kinbox inbox cancel``): :func:`report_orphans`."""

UNREPORTED = RUNNING_TASK_STATES
"""A child task's states before its outcome was reported to the parent."""

TASK_MESSAGE_PREFIX = "subagent-task-"
CHILD_PREFIX = "subagent-"
"""How a child session's id begins (``subagent-sub_<8 hex>``, see ``tools``)."""


def task_message_id(task_id: str) -> str:
    """The idempotency key of the message that hands a child its task."""
    return f"{TASK_MESSAGE_PREFIX}{task_id}"


def report_back(ctx: RuntimeContext, turn: Turn, outcome: TurnOutcome) -> HookReads | None:
    """Outbox hook: the parent's wake-up and the task's end, for a child's task turn. Both
    cases read (the child's session, the task, the wake-up ids taken): what it returns
    is that work (:data:`.context.OutboxHook`)."""
    task_messages = [m for m in turn.all_messages if m.kind == TASK_KIND]
    if not task_messages:
        if not outcome.ok or turn.outbox is None or not turn.outbox.tasks:
            return None  # most turns: no task changed, nothing to read
        return partial(_settled_later, ctx, turn)
    return partial(_reported, ctx, turn, outcome, task_messages)


def _reported(ctx: RuntimeContext, turn: Turn, outcome: TurnOutcome,
              task_messages: list[Message]) -> TurnEffects | None:
    """:func:`report_back` of a child's task turn."""
    child = ctx.store.session(turn.session_id)
    if child is None or child.parent_id is None:
        return None
    effects = TurnEffects()
    task_id = str(task_messages[0].payload.get("task_id", ""))
    # What the child itself made of its task in this turn (it asked the user, it gave up)
    # stands: a turn that ends well does not make a blocked task completed.
    own = turn.outbox.tasks.get(task_id) if turn.outbox is not None else None
    # A stop (a deploy's, its parent's, anyone's) of a child which had settled its task
    # (completed it, asked the user, gave up) stopped nothing: what it did stands, and it
    # is reported as any settled task is, not cancelled, not re-run.
    deploy = outcome.stopped_by == RUNTIME_STOP
    settled = own is not None and own.status not in UNREPORTED
    changes: dict[str, object] | None
    if not outcome.ok:
        state, changes, text = _failed(child.id, outcome.error or "the turn failed")
    elif deploy and task_id and not settled:
        # The runtime is stopping (a deploy): nobody gave up on the child. Its task goes
        # on after the next start, handed back by a message committed with this turn.
        effects.messages.append(NewMessage(
            next_free_id(ctx, f"{task_message_id(task_id)}-resumed"), child.id,
            task_messages[0].content, kind=TASK_KIND, sender=task_messages[0].sender_id,
            payload={"task_id": task_id, "resumed": True}))
        return effects
    elif outcome.stopped_by is not None and not settled:
        state, changes = "stopped", {"status": "cancelled", "blocked_on": None}
        text = f"Sub-agent {child.id} was stopped by {outcome.stopped_by}."
        if outcome.stopped_by == child.parent_id:
            text = ""  # the parent stopped it: no wake-up
    elif own is not None and own.status in ("blocked", "cancelled"):
        state, changes = own.status, None
        text = turn.replies[-1] if turn.replies else (
            f"(the sub-agent left its task {own.status}"
            + (f": {own.reason})" if own.reason else ")"))
    else:
        state, changes = "completed", {"status": "completed", "blocked_on": None}
        text = turn.replies[-1] if turn.replies else "(the sub-agent finished without a reply)"
    service = TaskService(ctx)
    now = ctx.now()
    changed: list[TaskChange] = []

    def finish_task() -> None:
        assert changes is not None
        # The last run's change alone: a run a conflict rolled back is run again (see
        # kinbox.persistence.writer), and only the run that committed is announced.
        changed[:] = [service.apply_in_txn(child.id, task_id, changes, now)]

    def announce() -> None:
        for change in changed:
            service.notify(change)

    if task_id and changes is not None:
        effects.ops.append(finish_task)
        effects.after.append(announce)
    if text:
        effects.messages.append(_wake(ctx, child, task_id or turn.messages[0].message_id,
                                      text, state))
    return effects


def _settled_later(ctx: RuntimeContext, turn: Turn) -> TurnEffects | None:
    """A child that left its task blocked (its parent was told so) completes or cancels it
    in a later turn (the user answered, a sibling helped): the parent hears that outcome
    too, committed with the turn (a turn that succeeded and changed tasks). So too when
    the child took the answer in one turn (its task ``in_progress`` again) and settles
    the task in a later one: the parent's last word on it was still "blocked"."""
    assert turn.outbox is not None
    child = ctx.store.session(turn.session_id)
    if child is None or child.parent_id is None or child.kind != "subagent":
        return None
    effects = TurnEffects()
    for task in turn.outbox.tasks.values():
        before = ctx.tasks.get(task.id) if task.chat_id == child.id else None
        if (before is not None and task.status in ("completed", "cancelled")
                and (before.status == "blocked"
                     or (before.status in task_rules.OPEN_STATUSES
                         and _last_outcome(ctx, task.id) == "blocked"))
                and ctx.journal.hot.existing(task_message_id(task.id)) is not None):
            text = turn.replies[-1] if turn.replies else (
                f"(the sub-agent {task.status} its task)")
            effects.messages.append(_wake(ctx, child, task.id, text, task.status))
    return effects if effects.messages else None


def _last_outcome(ctx: RuntimeContext, task_id: str) -> str | None:
    """The outcome the parent last heard of a child's task (None: none, or pruned)."""
    ids = result_ids(ctx, task_id)
    if not ids:
        return None
    try:
        return str(ctx.journal.get(ids[-1])["payload"].get("outcome"))
    except RowNotFound:
        return None


def _failed(child_id: str, error: str) -> tuple[str, dict[str, object], str]:
    """A failed child task: its outcome, the task's change (the reason within a task
    reason's limit) and the parent's wake-up text."""
    return ("failed", {"status": "blocked", "blocked_on": "error",
                       "reason": error[:task_rules.REASON_LIMIT]},
            f"Sub-agent {child_id} failed: {error}")


def _wake(ctx: RuntimeContext, child: SessionRecord, task_id: str, text: str,
          outcome: str) -> NewMessage:
    """The parent's wake-up with a child task's outcome."""
    assert child.parent_id is not None
    return NewMessage(next_free_id(ctx, result_message_id(task_id)), child.parent_id,
                      text[:RESULT_LIMIT], kind=RESULT_KIND, sender=child.id,
                      payload={"task_id": task_id, "child_id": child.id, "outcome": outcome})


class Reopened:
    """What an operator's requeue of child task messages does to their tasks: a task whose
    failure was reported (blocked on ``error``) is ``in_progress`` again, in the
    requeue's transaction. Its next end is then reported like its first, whoever ends
    it: the run's turn, an operator's cancel, the claim that fails it, a start after a
    crash (a reported task is never reported again, so one left blocked on its old
    failure was not, and its parent never heard of the cancel)."""

    def __init__(self, ctx: RuntimeContext) -> None:
        self._ctx = ctx
        self._changes: list[TaskChange] = []

    def in_txn(self, message_ids: list[str]) -> None:
        """Inside the requeue's transaction: reopen the failed tasks of these rows."""
        ctx = self._ctx
        now = ctx.now()
        changes: list[TaskChange] = []
        for mid in message_ids:
            if not mid.startswith(TASK_MESSAGE_PREFIX):
                continue
            row = ctx.journal.get(mid)
            task = ctx.tasks.get(str(row["payload"].get("task_id", "")))
            if (task is not None and task.chat_id == row["target_chat_id"]
                    and task.status == "blocked" and task.blocked_on == "error"):
                changes.append(TaskService(ctx).apply_in_txn(
                    task.chat_id, task.id, {"status": "in_progress", "blocked_on": None,
                                            "reason": None}, now))
        # The last run's alone: a run a conflict rolled back is run again.
        self._changes = changes

    def announce(self) -> None:
        """After the commit: observers hear of each reopened task (once: a requeue in
        batches announces after each)."""
        changes, self._changes = self._changes, []
        for change in changes:
            TaskService(self._ctx).notify(change)


def report_ended(ctx: RuntimeContext, message_ids: Iterable[str]) -> int:
    """Report the child tasks whose message ended outside a turn (``failed`` by a claim,
    ``cancelled`` by an operator) while the task is still open: the task ends and the
    parent is woken, in one transaction; how many. Idempotent: a reported task is no
    longer open."""
    reported = 0
    for mid in message_ids:
        if not mid.startswith(TASK_MESSAGE_PREFIX):
            continue
        try:
            reported += _report_one(ctx, mid)
        except PersistenceError as exc:  # the next start looks again
            log.error("could not report the end of %s to its parent: %s", mid, exc)
    return reported


def report_orphans(ctx: RuntimeContext) -> int:
    """:func:`report_ended` for every open child task, whichever of its messages ended (the
    first, or one that handed it back after a deploy): at a start, what a crash between a
    row's end and its report left; then every :data:`REPORT_INTERVAL`, what another
    process ended."""
    open_tasks = ctx.tasks.open_of_chats(CHILD_PREFIX, UNREPORTED)
    return sum(report_task(ctx, t.id) for t in open_tasks)


def report_task(ctx: RuntimeContext, task_id: str) -> int:
    """:func:`report_ended` for one task, whichever of its messages ended: 1 if it was
    reported here, 0 if it was before (or is open, or ended in a turn, which reports)."""
    return report_ended(ctx, _task_messages(ctx, task_id))


def task_message_chain(task_id: str) -> Iterator[str]:
    """The ids a task's messages take, in order: the first, then each hand-back
    (``-resumed``, ``-resumed-2``... as :func:`next_free_id` chose them, with no gap);
    endless, so a reader stops at the first that does not exist."""
    base = task_message_id(task_id)
    return itertools.chain([base], numbered(f"{base}-resumed"))


def _task_messages(ctx: RuntimeContext, task_id: str) -> list[str]:
    """The ids of a task's messages (:func:`task_message_chain`) that exist, and the first."""
    ids = task_message_chain(task_id)
    return [next(ids), *itertools.takewhile(
        lambda mid: ctx.journal.hot.existing(mid) is not None, ids)]


def _report_one(ctx: RuntimeContext, mid: str) -> int:
    try:
        row = ctx.journal.get(mid)
    except RowNotFound:
        return 0
    status = row["status"]
    task_id = str(row["payload"].get("task_id", ""))
    task = ctx.tasks.get(task_id)
    child = ctx.store.session(row["target_chat_id"])
    if (status not in ("failed", "cancelled") or task is None or child is None
            or child.parent_id is None or task.status not in UNREPORTED):
        return 0
    # A failure's last line (the error itself); a cancel's who and why, from its history.
    detail = (row["last_error"] if status == "failed"
              else next((h["detail"] for h in reversed(ctx.journal.history(mid))
                         if h["event"] == "cancelled"), ""))
    why = (detail or "").strip().splitlines()[-1:] or [status]
    if status == "failed":
        _, changes, text = _failed(child.id, why[0])
    else:
        changes = {"status": "cancelled", "blocked_on": None}
        text = f"Sub-agent {child.id}'s task was cancelled: {why[0]}"
    service = TaskService(ctx)
    wake = _wake(ctx, child, task_id, text, status)

    def op() -> TaskChange | None:
        current = ctx.tasks.get(task_id)
        if current is None or current.status not in UNREPORTED:
            return None  # reported meanwhile
        now = ctx.now()
        change = service.apply_in_txn(child.id, task_id, changes, now)
        ctx.journal.enqueue_now(wake, now)
        return change

    change = ctx.journal.writer.call(op)
    if change is None:
        return 0
    service.notify(change)
    ctx.wake_dispatcher()
    log.info("reported the %s task %s of %s to its parent %s", status, task_id, child.id,
             child.parent_id)
    return 1
