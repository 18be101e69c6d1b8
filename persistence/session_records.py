"""The records the session store hands out: projects, sessions, transcript entries.

Frozen dataclasses, so that callers never hold live peewee rows across threads
(:mod:`.sessions` reads the rows and builds these). Plain data only: no database.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProjectRecord:
    """A project (S4)."""

    id: str
    slug: str
    name: str
    archived: bool
    hidden: bool
    created_at: float


@dataclass(frozen=True)
class SessionRecord:
    """A session (S1)."""

    id: str
    project_id: str | None
    title: str
    kind: str
    platform: str | None
    parent_id: str | None
    status: str
    """``active`` while one of its messages is leased to a turn (here or in another
    process) or a direct turn of it runs, else ``idle`` (:mod:`.session_view`)."""
    created_at: float
    updated_at: float
    """Its latest activity: creation, a change, or its newest transcript entry."""
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SessionPage:
    """One page of a walk over sessions in creation order, newest first
    (:meth:`~.sessions.SessionStore.sessions_page`)."""

    sessions: list[SessionRecord]
    after: str | None
    """The cursor of the next page (its ``after``); None: this page is the last."""


@dataclass(frozen=True)
class EntryRecord:
    """A transcript entry."""

    id: int
    session_id: str
    role: str
    text: str
    visible: bool
    message_id: str | None
    created_at: float
    sender_id: str | None = None
    """Who sent the message this entry records; None for the user and for replies."""
    kind: str | None = None
    """That message's kind (``agent_message``, ``subagent_result``...)."""
