"""Tasks owned by sessions (K1): durable rows, written through the group-commit writer.

The rules (which statuses exist, what ``blocked`` needs) are checked by the
caller before anything is written; this store applies a change and reports
what it did, including how many open tasks the session has left, which is
how "the session closed its last open task" is noticed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import peewee as pw

from . import paging
from .database import is_postgres
from .errors import RowNotFound
from .models import Tables, Task
from .writer import GroupCommitWriter

OPEN_TASK_STATES = ("pending", "in_progress", "blocked")
RUNNING_TASK_STATES = ("pending", "in_progress")
"""A task in these is running (or about to): not blocked on anyone, not ended."""


@dataclass(frozen=True)
class TaskRecord:
    """A task."""

    id: str
    project_id: str | None
    chat_id: str
    title: str
    status: str
    blocked_on: str | None
    reason: str | None
    created_at: float
    updated_at: float

    def to_dict(self) -> dict[str, Any]:
        """The task as a tool result."""
        return {"task_id": self.id, "chat_id": self.chat_id, "title": self.title,
                "status": self.status, "blocked_on": self.blocked_on, "reason": self.reason,
                "updated_at": self.updated_at}


@dataclass(frozen=True)
class TaskChange:
    """What an update did: the task before and after, and the open tasks left."""

    before: TaskRecord | None
    after: TaskRecord
    open_left: int


def _record(t: Task) -> TaskRecord:
    return TaskRecord(t.id, t.project_id, t.chat_id, t.title, t.status, t.blocked_on, t.reason,
                      t.created_at, t.updated_at)


class TaskStore:
    """Tasks on one database."""

    def __init__(self, tables: Tables, writer: GroupCommitWriter) -> None:
        self.t = tables
        self.writer = writer

    def _open_count(self, chat_id: str) -> int:
        t = self.t.task
        return t.select().where(t.chat_id == chat_id, t.status.in_(OPEN_TASK_STATES)).count()

    def create_now(self, task_id: str, project_id: str | None, chat_id: str, title: str,
                   status: str, now: float) -> TaskChange:
        """Insert a task inside the caller's transaction (on the writer thread)."""
        t = self.t.task
        t.insert(id=task_id, project_id=project_id, chat_id=chat_id, title=title,
                 status=status, created_at=now, updated_at=now).execute()
        return TaskChange(None, _record(t.get(t.id == task_id)), self._open_count(chat_id))

    def create(self, task_id: str, project_id: str | None, chat_id: str, title: str,
               status: str, now: float) -> TaskChange:
        """Insert a task."""
        return self.writer.call(
            lambda: self.create_now(task_id, project_id, chat_id, title, status, now))

    def apply(self, task_id: str, chat_id: str, changes: dict[str, Any],
              now: float) -> TaskChange:
        """Apply ``changes`` inside the caller's transaction (on the writer thread).

        On PostgreSQL the session's row is locked first: a change of another of its tasks
        in flight in another process is waited for, and this one's before and open count
        (statements after the lock) see it. Read alongside it (READ COMMITTED), two
        processes completing a session's last two tasks each counted the other's open,
        and neither closed the session."""
        if is_postgres(self.t.db):
            s = self.t.session
            s.select(s.id).where(s.id == chat_id).for_update().execute()
        t = self.t.task
        row = t.get_or_none((t.id == task_id) & (t.chat_id == chat_id))
        if row is None:
            raise RowNotFound("task", task_id, f" in session {chat_id!r}")
        before = _record(row)
        t.update(updated_at=now, **changes).where(t.id == task_id).execute()
        return TaskChange(before, _record(t.get(t.id == task_id)), self._open_count(chat_id))

    def update(self, task_id: str, chat_id: str, changes: dict[str, Any],
               now: float) -> TaskChange:
        """Apply ``changes`` to a task of ``chat_id``; :class:`RowNotFound` if it has none such."""
        return self.writer.call(lambda: self.apply(task_id, chat_id, changes, now))

    def get(self, task_id: str) -> TaskRecord | None:
        """The task with this id, or None."""
        t = self.t.task
        row = t.get_or_none(t.id == task_id)
        return _record(row) if row else None

    def for_session(self, chat_id: str) -> list[TaskRecord]:
        """A session's tasks, oldest first."""
        t = self.t.task
        return [_record(r) for r in t.select().where(t.chat_id == chat_id)
                .order_by(t.created_at, t.id)]

    def running_children(self, parent_id: str, handed_by: str) -> int:
        """How many sub-agents of ``parent_id`` still run the task it handed them
        (:data:`RUNNING_TASK_STATES`): a task the inbox message ``handed_by + task id``
        handed over, not the tasks a child made for itself (a child that ended leaves
        those as they were). By the sessions' parent index, the tasks' chat one and the
        inbox's message id. A first message pruned while its task runs on in a hand-back
        (a deploy's; the task message ended long before) is a child not counted."""
        t, s, m = self.t.task, self.t.session, self.t.inbox
        handed = m.select(m.message_id).where(m.message_id == pw.Value(handed_by).concat(t.id))
        return (t.select().join(s, on=(s.id == t.chat_id))
                .where(s.parent_id == parent_id, s.kind == "subagent",
                       t.status.in_(RUNNING_TASK_STATES), pw.fn.EXISTS(handed)).count())

    def open_of_chats(self, chat_prefix: str, statuses: tuple[str, ...]) -> list[TaskRecord]:
        """The tasks in ``statuses`` of sessions whose id starts with ``chat_prefix``
        (a start's look for sub-agent tasks whose message ended outside a turn)."""
        t = self.t.task
        return [_record(r) for r in t.select().where(
            t.chat_id.startswith(chat_prefix), t.status.in_(list(statuses)))
            .order_by(t.created_at, t.id)]

    def for_project(self, project_id: str, *, statuses: tuple[str, ...] = (),
                    limit: int | None = None, offset: int = 0) -> list[TaskRecord]:
        """A project's tasks, oldest first (ties by id, which is unique): those in
        ``statuses`` (all: empty), at most ``limit`` from the ``offset``-th on. Without
        ``limit`` and ``statuses`` it reads every task the project ever had, done ones
        too: a cost that grows with the database's age. A bound outside
        :mod:`.paging`'s is :class:`~.errors.InvalidArgument`."""
        limit, offset = paging.limit(limit), paging.offset(offset)
        t = self.t.task
        q = t.select().where(t.project_id == project_id)
        if statuses:
            q = q.where(t.status.in_(list(statuses)))
        q = q.order_by(t.created_at, t.id)
        return [_record(r) for r in paging.cut(q, limit, offset)]

    def for_chats(self, project_id: str, chat_ids: Sequence[str]) -> list[TaskRecord]:
        """Every task of the project's sessions ``chat_ids`` (a few), oldest first."""
        t = self.t.task
        if not chat_ids:
            return []
        return [_record(r) for r in t.select().where(
            t.project_id == project_id, t.chat_id.in_(list(chat_ids)))
            .order_by(t.created_at, t.id)]

    def last_updates(self, project_id: str) -> dict[str, float]:
        """chat id -> when its latest task of the project last changed (one aggregate:
        no task is read into memory, and none from the table: the index
        ``tasks_project_id_chat_id_updated_at`` holds every value it reads, grouped)."""
        t = self.t.task
        q = (t.select(t.chat_id, pw.fn.MAX(t.updated_at).alias("at"))
             .where(t.project_id == project_id).group_by(t.chat_id))
        return {r.chat_id: float(r.at) for r in q}
