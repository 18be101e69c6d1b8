"""Sub-agents (T5, A1): children created by ``agent()`` that report back durably.

A child is a session of kind ``subagent`` in its parent's project. Its work
arrives as a ``subagent_task`` message; when the turn that handles it ends,
the parent's wake-up (``subagent-result-<task>``, kind ``subagent_result``)
and the task's new status commit in the same transaction as the child's
turn, so a crash between the child's end and the parent's turn loses
nothing. A child stopped by its own parent does not wake it (the parent
knows); stopped by anyone else, it does.
"""

from __future__ import annotations

from ..persistence import NewMessage, TaskChange
from .context import RuntimeContext, TurnEffects
from .tasks import TaskService
from .turn import Turn, TurnOutcome

TASK_KIND = "subagent_task"
RESULT_KIND = "subagent_result"
RESULT_LIMIT = 20_000


def result_message_id(task_id: str) -> str:
    """The idempotency key of a task's (first) result wake-up."""
    return f"subagent-result-{task_id}"


def next_result_id(ctx: RuntimeContext, base: str) -> str:
    """The id of this outcome's wake-up: ``base``, or ``base-2``, ``base-3``... once a
    requeued task reports again (its first outcome holds ``base``, with other text).

    Read before the commit: only this child's turns, one at a time, write these rows,
    and a commit that did not happen wrote none of them."""
    mid, n = base, 1
    while ctx.journal.hot.existing(mid) is not None:
        n += 1
        mid = f"{base}-{n}"
    return mid


def task_message_id(task_id: str) -> str:
    """The idempotency key of the message that hands a child its task."""
    return f"subagent-task-{task_id}"


def report_back(ctx: RuntimeContext, turn: Turn, outcome: TurnOutcome) -> TurnEffects | None:
    """Outbox hook: the parent's wake-up and the task's end, for a child's task turn."""
    task_messages = [m for m in turn.all_messages if m.kind == TASK_KIND]
    if not task_messages:
        return None
    child = ctx.store.session(turn.session_id)
    if child is None or child.parent_id is None:
        return None
    effects = TurnEffects()
    task_id = str(task_messages[0].payload.get("task_id", ""))
    # What the child itself made of its task in this turn (it asked the user, it gave up)
    # stands: a turn that ends well does not make a blocked task completed.
    own = turn.outbox.tasks.get(task_id) if turn.outbox is not None else None
    changes: dict[str, object] | None
    if not outcome.ok:
        state, changes = "failed", {"status": "blocked", "blocked_on": "error",
                                    "reason": outcome.error}
        text = f"Sub-agent {child.id} failed: {outcome.error}"
    elif outcome.stopped_by is not None:
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
        changed.append(service.apply_in_txn(child.id, task_id, changes, now))

    def announce() -> None:
        for change in changed:
            service.notify(change)

    if task_id and changes is not None:
        effects.ops.append(finish_task)
        effects.after.append(announce)
    if text:
        base = result_message_id(task_id or turn.messages[0].message_id)
        effects.messages.append(NewMessage(
            next_result_id(ctx, base), child.parent_id,
            text[:RESULT_LIMIT], kind=RESULT_KIND, sender=child.id,
            payload={"task_id": task_id, "child_id": child.id, "outcome": state}))
    return effects
