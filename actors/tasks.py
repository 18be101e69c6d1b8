"""Tasks of sessions (K1): create, update and list, with their events.

Rules live in :mod:`.task_rules`. A change and the messages it causes
(through ``ctx.task_hooks``, e.g. a Focal notice) commit in one transaction;
observers hear ``task_changed``, ``task_blocked`` and ``session_closed``
once it is durable.
"""

from __future__ import annotations

from dataclasses import replace

from ..persistence import RowNotFound, TaskChange, TaskRecord
from . import task_rules
from .context import RuntimeContext
from .errors import ToolError
from .ids import short
from .outbox import Writes
from .validation import quoted


def view(task: TaskRecord) -> task_rules.TaskView:
    """The rule module's view of a task."""
    return task_rules.TaskView(task.status, task.blocked_on, task.reason)


class TaskService:
    """Task operations on behalf of sessions; ``writes`` says when they commit (at once,
    or with the calling turn: :mod:`.outbox`)."""

    def __init__(self, ctx: RuntimeContext, writes: Writes | None = None) -> None:
        self.ctx = ctx
        self.writes = writes if writes is not None else Writes(ctx, None)

    def create(self, chat_id: str, project_id: str | None, title: str,
               status: str = "pending") -> TaskRecord:
        """Create a task for a session."""
        if status not in task_rules.OPEN_STATUSES:
            raise ToolError("invalid_argument",
                            f"a new task starts as pending or in_progress, not {quoted(status)}.")
        task_id = f"task-{short(self.ctx.new_id(), 12)}"
        now = self.ctx.now()
        record = TaskRecord(task_id, project_id, chat_id, title, status, None, None, now, now)
        self.writes.note_task(record)
        change = self.writes.write(
            lambda: self.ctx.tasks.create_now(task_id, project_id, chat_id, title, status, now),
            TaskChange(None, record, 0), self.notify)
        return change.after

    def apply_in_txn(self, chat_id: str, task_id: str, changes: dict[str, object],
                     now: float, opening: int = 0, nth: int = 0) -> TaskChange:
        """Apply a change inside the current transaction, enqueueing what hooks ask for.
        ``opening``: tasks of the session this transaction leaves open that are not open
        yet (a turn's later changes): the session is not closed before them. ``nth``: in
        a turn's commit, which of the turn's updates of this task this is (:meth:`_net`)."""
        change = self.ctx.tasks.apply(task_id, chat_id, changes, now)
        if opening:
            change = replace(change, open_left=change.open_left + opening)
        if nth:
            change = self._net(change, nth)
        for hook in self.ctx.task_hooks:
            for message in hook(self.ctx, change):
                self.ctx.journal.enqueue_now(message, now)
        return change

    def update(self, chat_id: str, task_id: str, status: object = None,
               blocked_on: object = None, reason: object = None) -> TaskRecord:
        """Validate and apply an update to one of ``chat_id``'s tasks."""
        task = self.writes.task(task_id) if isinstance(task_id, str) else None
        if task is None or task.chat_id != chat_id:
            raise ToolError("not_found", f"Task '{task_id}' does not exist in this session.")
        changes = task_rules.check_update(view(task), status, blocked_on, reason)
        now = self.ctx.now()
        after = replace(task, updated_at=now, **changes)  # type: ignore[arg-type]
        self.writes.note_task(after)
        box = self.writes.outbox
        nth = box.count_update(task_id) if box is not None else 0

        def announce(change: TaskChange) -> None:
            self.ctx.wake_dispatcher()  # a hook may have queued a notice
            self.notify(change)

        def apply() -> TaskChange:
            # In a turn this runs at its commit: what the call did not name is taken from
            # the row as it is then, not as the call read it, so a turn's reason-only
            # update does not reopen a task the user completed meanwhile. Arguments that
            # no longer fit the row (blocked_on for a task no longer blocked) keep what
            # the call checked.
            current = self.ctx.tasks.get(task_id)
            try:
                fresh = (task_rules.check_update(view(current), status, blocked_on, reason)
                         if current is not None else changes)
            except ToolError:
                fresh = changes
            return self.apply_in_txn(chat_id, task_id, fresh, now,
                                     self._opened_later(chat_id, task_id, fresh["status"]),
                                     nth)
        try:
            change = self.writes.write(apply, TaskChange(task, after, 0), announce)
        except RowNotFound as exc:
            raise ToolError("not_found", str(exc)) from exc
        return change.after

    def _net(self, change: TaskChange, nth: int) -> TaskChange:
        """The ``nth`` of a turn's updates of a task, as its rules judge it: the turn's
        updates commit together, so what they mean is the turn's net change, judged with
        the last (from the row before the first); an earlier one is judged as no change.
        Judged alone, a task blocked and unblocked again in one turn told Focal the
        session waited on the user, one unblocked and blocked again on the same question
        told it again, and one completed, reopened and completed again told it the
        session finished twice."""
        box = self.writes.outbox
        if box is None:
            return change
        task_id = change.after.id
        if nth == 1 and change.before is not None:
            box.tasks_before[task_id] = change.before  # a retried commit sets it again
        if nth < box.task_updates.get(task_id, nth):
            return replace(change, before=change.after)  # the turn changes it again
        return replace(change, before=box.tasks_before.get(task_id, change.before))

    def _opened_later(self, chat_id: str, task_id: str, status: str) -> int:
        """In a turn's commit, for a change giving ``task_id`` ``status``: the tasks of
        ``chat_id`` that the turn leaves open (as its calls saw them) and that this change
        leaves not open, and those the turn creates after it, its later changes in the
        same transaction. A turn that completes its step and then creates the next one,
        or completes its task and then takes it back (``in_progress``: it was not done),
        never leaves the session without an open task; one that creates the next step and
        completes it too closes the session once, with that last change. Judged alone,
        its first change closed the session (``session_closed``, Focal's notice)."""
        box = self.writes.outbox
        if box is None:
            return 0
        mine = [t for t in box.tasks.values() if t.chat_id == chat_id and t.id != task_id]
        others = 0
        for t in mine:
            row = self.ctx.tasks.get(t.id)
            if row is None or (t.status in task_rules.OPEN_STATUSES
                               and row.status not in task_rules.OPEN_STATUSES):
                others += 1
        final = box.tasks.get(task_id)
        reopened = (final is not None and final.status in task_rules.OPEN_STATUSES
                    and status not in task_rules.OPEN_STATUSES)
        return others + reopened

    def notify(self, change: TaskChange) -> None:
        """Tell observers what a committed change means."""
        before = view(change.before) if change.before else None
        after = view(change.after)
        task = change.after
        self.ctx.emit("task_changed", task_id=task.id, session_id=task.chat_id,
                      status=task.status)
        if task_rules.became_blocked(before, after):
            self.ctx.emit("task_blocked", task_id=task.id, session_id=task.chat_id,
                          blocked_on=task.blocked_on, reason=task.reason)
        if task_rules.closes_session(before, after, change.open_left):
            self.ctx.emit("session_closed", session_id=task.chat_id, task_id=task.id)
