"""The global context added to every Focal turn (FO3). Pure.

Every non-archived, non-hidden project with its id and slug; up to 10
sessions per project with their tasks. Sessions come from the project's
tasks plus any session running now; those with work waiting on the user
come first, then running ones, then the rest by recency. A session with no
tasks that is not running is not listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .inline_text import inline

SESSIONS_PER_PROJECT = 10


@dataclass(frozen=True)
class ProjectInfo:
    """A project as the context shows it."""

    id: str
    slug: str
    archived: bool = False
    hidden: bool = False


@dataclass(frozen=True)
class TaskInfo:
    """A task as the context shows it."""

    title: str
    status: str
    blocked_on: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class SessionInfo:
    """A session as the context shows it."""

    id: str
    project_id: str | None
    title: str
    running: bool
    updated_at: float
    tasks: tuple[TaskInfo, ...] = ()
    has_tasks: bool = False
    """It has tasks, though ``tasks`` may hold only its open ones: the caller reads every
    task only of the sessions the context lists (a project's done tasks grow for ever)."""

    @property
    def waiting_on_user(self) -> bool:
        """A task of this session is blocked on the user."""
        return any(t.status == "blocked" and t.blocked_on == "user" for t in self.tasks)


def rank(sessions: Sequence[SessionInfo]) -> list[SessionInfo]:
    """Listed sessions in order: waiting on the user, running, then most recent."""
    listed = [s for s in sessions if s.tasks or s.has_tasks or s.running]
    return sorted(listed, key=lambda s: (not s.waiting_on_user, not s.running, -s.updated_at,
                                         s.id))


def _task_line(t: TaskInfo) -> str:
    blocked = f", blocked on {t.blocked_on}" if t.status == "blocked" and t.blocked_on else ""
    reason = f": {inline(t.reason)}" if t.reason else ""
    return f"    - [{t.status}{blocked}] {inline(t.title)}{reason}"


def build_focal_global_context(projects: Sequence[ProjectInfo],
                               sessions: Sequence[SessionInfo]) -> str:
    """The text added to a Focal turn."""
    lines = ["Projects and their sessions:"]
    for project in projects:
        if project.archived or project.hidden:
            continue
        lines.append(f"- project {project.slug} (id {project.id})")
        mine = rank([s for s in sessions if s.project_id == project.id])
        for s in mine[:SESSIONS_PER_PROJECT]:
            state = ("waiting on the user" if s.waiting_on_user
                     else "running" if s.running else "idle")
            lines.append(f"  - session {inline(s.title)} (id {s.id}, {state})")
            lines.extend(_task_line(t) for t in s.tasks)
        if len(mine) > SESSIONS_PER_PROJECT:
            lines.append(f"  - ... {len(mine) - SESSIONS_PER_PROJECT} more sessions")
    return "\n".join(lines)
