"""Projects, sessions and transcripts: the records the actors address and write.

Writes go through the group-commit writer like the journal's; reads run on
the caller's thread. Records come back as frozen dataclasses so callers
never hold live peewee rows across threads.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal

import peewee as pw

from . import session_filters
from .errors import DuplicateError, RowNotFound
from .inbox_core import OPEN_STATES, PROCESSING
from .journal import TurnEntry
from .models import Project, Session, Tables
from .session_view import IDLE, live_columns
from .writer import GroupCommitWriter

Roots = Literal["all", "workers", "none"]
"""Which roots of its project a session's family read takes (:meth:`SessionStore.family`)."""

IDS_PER_READ = 500
"""Session ids one ``IN (...)`` names at most (SQLite bounds a statement's parameters)."""


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


def _project(p: Project) -> ProjectRecord:
    return ProjectRecord(p.id, p.slug, p.name, bool(p.archived), bool(p.hidden), p.created_at)


def _session(s: Session) -> SessionRecord:
    """The record of a row read by :meth:`SessionStore._select` (with its derived columns)."""
    return SessionRecord(s.id, s.project_id, s.title, s.kind, s.platform, s.parent_id,
                         s.live_status, s.created_at, s.recent,  # type: ignore[attr-defined]
                         json.loads(s.config or "{}"))


class SessionStore:
    """Projects, sessions and transcripts on one database."""

    def __init__(self, tables: Tables, writer: GroupCommitWriter) -> None:
        self.t = tables
        self.writer = writer

    # -- projects --------------------------------------------------------------------------

    def create_project(self, project_id: str, slug: str, name: str, now: float, *,
                       hidden: bool = False, archived: bool = False) -> ProjectRecord:
        """Insert a project; :class:`DuplicateError` if the slug or id is taken."""
        p = self.t.project

        def op() -> ProjectRecord:
            if p.select().where(p.slug == slug).exists():
                raise DuplicateError("project", "slug", slug)
            if p.select().where(p.id == project_id).exists():
                raise DuplicateError("project", "id", project_id)
            p.insert(id=project_id, slug=slug, name=name, hidden=hidden, archived=archived,
                     created_at=now).execute()
            return ProjectRecord(project_id, slug, name, archived, hidden, now)
        return self.writer.call(op)

    def ensure_project(self, project_id: str, slug: str, name: str, now: float, *,
                       hidden: bool = False) -> ProjectRecord:
        """Return the project with ``slug``, creating it if it does not exist (beside
        another process creating it too); :class:`DuplicateError` if ``project_id`` is
        another slug's."""
        p = self.t.project

        def op() -> ProjectRecord:
            row = p.get_or_none(p.slug == slug)
            if row is None:
                # Another process may be creating it too (two runtimes' first start on one
                # PostgreSQL database): its row wins, and this insert does nothing.
                p.insert(id=project_id, slug=slug, name=name, hidden=hidden,
                         created_at=now).on_conflict_ignore().execute()
                row = p.get_or_none(p.slug == slug)
                if row is None:  # the id is another slug's
                    raise DuplicateError("project", "id", project_id)
            return _project(row)
        return self.writer.call(op)

    def project(self, project_id: str) -> ProjectRecord | None:
        """The project with this id, or None."""
        p = self.t.project
        row = p.get_or_none(p.id == project_id)
        return _project(row) if row else None

    def project_by_slug(self, slug: str) -> ProjectRecord | None:
        """The project with this slug, or None."""
        p = self.t.project
        row = p.get_or_none(p.slug == slug)
        return _project(row) if row else None

    def projects(self) -> list[ProjectRecord]:
        """Every project, oldest first."""
        p = self.t.project
        return [_project(r) for r in p.select().order_by(p.created_at, p.id)]

    # -- sessions --------------------------------------------------------------------------

    def create_session_now(self, session_id: str, project_id: str | None, title: str,
                           kind: str, now: float, *, parent_id: str | None = None,
                           platform: str | None = None,
                           config: dict[str, Any] | None = None) -> SessionRecord:
        """Insert a session inside the caller's transaction (on the writer thread);
        :class:`DuplicateError` if the id is taken."""
        s = self.t.session
        # Not a read and then an insert: another process may be creating the same session
        # (the Focal chat, a cron job's or a social thread's) on PostgreSQL, and an insert
        # beside its uncommitted row waits for it and then fails on the key.
        if not s.insert(id=session_id, project_id=project_id, title=title, kind=kind,
                        platform=platform, parent_id=parent_id, status=IDLE,
                        config=json.dumps(config or {}, sort_keys=True),
                        created_at=now, updated_at=now).on_conflict_ignore().as_rowcount(
                        ).execute():
            raise DuplicateError("session", "id", session_id)
        return SessionRecord(session_id, project_id, title, kind, platform, parent_id, IDLE,
                             now, now, dict(config or {}))

    def create_session(self, session_id: str, project_id: str | None, title: str, kind: str,
                       now: float, *, parent_id: str | None = None, platform: str | None = None,
                       config: dict[str, Any] | None = None) -> SessionRecord:
        """Insert a session; :class:`DuplicateError` if the id is taken."""
        return self.writer.call(lambda: self.create_session_now(
            session_id, project_id, title, kind, now, parent_id=parent_id, platform=platform,
            config=config))

    def create_many(self, sessions: list[tuple[str, str | None, str, str]], now: float) -> int:
        """Bulk-insert (id, project_id, title, kind) sessions (benchmarks, imports)."""
        s = self.t.session

        def op() -> int:
            for first in range(0, len(sessions), 500):
                s.insert_many([{"id": i, "project_id": p, "title": t, "kind": k,
                                "status": IDLE, "config": "{}", "created_at": now,
                                "updated_at": now}
                               for i, p, t, k in sessions[first:first + 500]]).execute()
            return len(sessions)
        return self.writer.call(op, timeout=600)

    def _select(self) -> pw.ModelSelect:
        """Session rows with their derived status and recency (:mod:`.session_view`)."""
        return self.t.session.select(self.t.session, *live_columns(self.t))

    def session(self, session_id: str) -> SessionRecord | None:
        """The session with this id, or None."""
        s = self.t.session
        row = self._select().where(s.id == session_id).first()
        return _session(row) if row else None

    def sessions(self, *, project_id: str | None = None, kinds: tuple[str, ...] = (),
                 limit: int | None = None, offset: int = 0, hide: Collection[str] = (),
                 active_only: bool = False) -> list[SessionRecord]:
        """Sessions, most recently active first (ties by id): of one project or all, of
        ``kinds`` (all: empty), none whose kind or platform is in ``hide``, only the
        ``active`` ones with ``active_only``; at most ``limit`` from the ``offset``-th on.

        The filters and the cut are SQL: a page reads its rows, not every session. The
        order is still worked out over every session the filters keep (a recency is one
        index probe of its transcript's end: no index orders by it)."""
        s = self.t.session
        q = self._select().order_by(pw.SQL("recent").desc(), s.id)
        if project_id is not None:
            q = q.where(s.project_id == project_id)
        if kinds:
            q = q.where(s.kind.in_(kinds))
        if hide:
            q = q.where(session_filters.outside(self.t, hide))
        if active_only:
            q = q.where(s.id.in_(session_filters.active_ids(self.t)))
        if limit or offset:
            q = q.limit(limit).offset(offset)
        return [_session(r) for r in q]

    def sessions_named(self, project_id: str, key: str, *, hide: Collection[str] = ()
                       ) -> list[SessionRecord]:
        """The project's sessions (none hidden by ``hide``) that ``key`` may designate: by
        id, or by title up to Unicode normalisation (a wider set: the caller's rule
        decides, :func:`.session_filters.may_be_named`), most recently active first."""
        s = self.t.session
        q = self._select().where((s.project_id == project_id)
                                 & session_filters.may_be_named(self.t, key))
        if hide:
            q = q.where(session_filters.outside(self.t, hide))
        return [_session(r) for r in q.order_by(pw.SQL("recent").desc(), s.id)]

    def sessions_at_work(self, project_id: str, also: Collection[str] = ()
                         ) -> list[SessionRecord]:
        """A project's sessions that have a task, are active (a row of theirs processing,
        a direct turn's mark) or are among ``also``, most recently active first.

        What Focal's context can list (:mod:`kinbox.actors.focal_context`): read by
        :meth:`sessions`, every Focal turn read every session the project ever had, its
        cost growing with the database's age while the text it made stayed ten sessions
        long. Each condition here is an index read, whatever the project's size."""
        s, task = self.t.session, self.t.task
        # One UNION of ids, each part an index read; an OR of the three conditions in
        # the WHERE had SQLite test them on every session of the project instead.
        ids = (task.select(task.chat_id.alias("id")).where(task.project_id == project_id)
               | session_filters.active_ids(self.t))
        # ``also`` joins in Python: an OR with it in the WHERE read every session again.
        wanted = sorted({sid for (sid,) in ids.tuples()} | set(also))
        found = [_session(r) for start in range(0, len(wanted), IDS_PER_READ)
                 for r in self._select().where(
                     s.id.in_(wanted[start:start + IDS_PER_READ])
                     & (s.project_id == project_id))]
        found.sort(key=lambda r: r.id)
        found.sort(key=lambda r: r.updated_at, reverse=True)  # stable: ties by id
        return found

    def family(self, session: SessionRecord, *, roots: Roots = "all") -> list[SessionRecord]:
        """Everyone a family roster can name: parent, parent's children, own children,
        grandchildren, and the roots of the session's project (for shared workers):
        ``all`` of them, only those whose config may name a worker (``workers``: the
        caller knows the roster is after those), or ``none``."""
        s = self.t.session
        near = [session.id] + ([session.parent_id] if session.parent_id else [])
        cond = s.id.in_(near) | s.parent_id.in_(near)
        if roots != "none":
            root = s.parent_id.is_null() & (s.project_id == session.project_id)
            if roots == "workers":
                root &= session_filters.names_a_worker(self.t)
            cond |= root
        first = list(self._select().where(cond))
        children = [r.id for r in first if r.parent_id == session.id]
        grand = list(self._select().where(s.parent_id.in_(children))) if children else []
        seen: dict[str, Session] = {r.id: r for r in [*first, *grand]}
        return [_session(r) for r in seen.values()]

    def update_session(self, session_id: str, now: float, **changes: Any) -> None:
        """Change columns of a session (``config`` is a dict)."""
        s = self.t.session
        if "status" in changes:  # derived (session_view); a direct turn marks its own
            raise ValueError("a session's status is not set by update_session")
        if "config" in changes:
            changes["config"] = json.dumps(changes["config"], sort_keys=True)

        def op() -> None:
            if not s.update(updated_at=now, **changes).where(s.id == session_id).execute():
                raise RowNotFound("session", session_id)
        self.writer.call(op)

    def end_direct_turn_now(self, session_id: str, owner: str, turn_id: str,
                            now: float) -> bool:
        """End the direct-turn mark of the turn ``turn_id`` of runtime ``owner``, inside the
        caller's transaction; False when the session holds no such mark (another runtime
        took it after this one's was ended as a gone runtime's: it stays)."""
        s = self.t.session
        return bool(s.update(turn_owner=None, turn_id=None, updated_at=now).where(
            (s.id == session_id) & (s.turn_owner == owner)
            & (s.turn_id == turn_id)).execute())

    def end_direct_turn(self, session_id: str, owner: str, turn_id: str,
                        now: float) -> bool:
        """:meth:`end_direct_turn_now` in a transaction of its own."""
        return self.writer.call(
            lambda: self.end_direct_turn_now(session_id, owner, turn_id, now))

    def take_direct_turn(self, session_id: str, owner: str, turn_id: str,
                         now: float) -> bool:
        """Mark the session for the direct turn ``turn_id`` of runtime ``owner``; False
        (nothing written) while another runtime's direct turn holds the mark.

        From the mark on, no runtime on PostgreSQL leases the session a new row (claims
        skip it, and a turn's commit does not chain its next row into it), so the inbox
        turns of other runtimes that run now are the last before it:
        :meth:`others_processing` says when they are over. (This runtime's own inbox turn
        is ordered in its memory: ``RunningTurns``.)"""
        s = self.t.session

        def mark() -> bool:
            if s.update(turn_owner=owner, turn_id=turn_id, updated_at=now).where(
                    (s.id == session_id)
                    & (s.turn_owner.is_null() | (s.turn_owner == owner))).execute():
                return True
            if not s.select(s.id).where(s.id == session_id).exists():
                raise RowNotFound("session", session_id)
            return False
        return self.writer.call(mark)

    def others_processing(self, session_id: str, owner: str) -> bool:
        """Does a runtime other than ``owner`` hold a row of the session in processing (an
        inbox turn the session's marked direct turn waits for)?"""
        m = self.t.inbox
        return (m.select(m.message_id)
                .where((m.target_chat_id == session_id) & (m.status == PROCESSING)
                       & (m.lease_owner != owner)).exists())

    def direct_turn(self, session_id: str) -> tuple[str, str | None] | None:
        """The runtime running a direct turn of the session and that turn's id; None when
        none runs."""
        s = self.t.session
        row = s.select(s.turn_owner, s.turn_id).where(s.id == session_id).first()
        if row is None or row.turn_owner is None:
            return None
        return row.turn_owner, row.turn_id

    def direct_turn_owners(self) -> set[str]:
        """The runtimes whose direct turns mark sessions now."""
        s = self.t.session
        return {r.turn_owner for r in s.select(s.turn_owner).distinct().where(
            s.turn_owner.is_null(False))}

    def end_direct_turn_marks(self, now: float, owners: set[str] | None = None) -> int:
        """End the direct-turn marks of ``owners`` (runtimes known to be gone), or every
        one (the start of a runtime that holds the database alone: no direct turn runs,
        so a mark is a dead process's); how many."""
        s = self.t.session
        cond = (s.turn_owner.is_null(False) if owners is None
                else s.turn_owner.in_(sorted(owners)))
        return self.writer.call(lambda: s.update(turn_owner=None, turn_id=None,
                                                 updated_at=now).where(cond).execute())

    def patch_config_now(self, session_id: str, patch: dict[str, Any], now: float) -> None:
        """Merge ``patch`` into a session's config inside the caller's transaction."""
        s = self.t.session
        row = s.get_or_none(s.id == session_id)
        if row is None:
            raise RowNotFound("session", session_id)
        config = {**json.loads(row.config or "{}"), **patch}
        s.update(config=json.dumps(config, sort_keys=True), updated_at=now).where(
            s.id == session_id).execute()

    def patch_config(self, session_id: str, patch: dict[str, Any], now: float) -> None:
        """Merge ``patch`` into a session's config."""
        self.writer.call(lambda: self.patch_config_now(session_id, patch, now))

    def session_count(self) -> int:
        """How many sessions exist."""
        return self.t.session.select().count()

    # -- transcripts -----------------------------------------------------------------------

    def append(self, session_id: str, entries: list[TurnEntry], now: float) -> None:
        """Append entries outside a delivered turn (a user typing into a session)."""
        tr = self.t.transcript
        self.writer.call(lambda: tr.insert_many([
            {"session_id": session_id, "role": e.role, "text": e.text, "visible": e.visible,
             "message_id": e.message_id, "sender_id": e.sender_id, "kind": e.kind,
             "created_at": now} for e in entries]).execute())

    def transcript(self, session_id: str, *, last: int | None = None,
                   visible_only: bool = False) -> list[EntryRecord]:
        """A session's transcript, oldest first: every entry, or only the ``last`` N
        (of the visible ones with ``visible_only``), read with a LIMIT."""
        tr = self.t.transcript
        q = tr.select().where(tr.session_id == session_id)
        if visible_only:
            q = q.where(tr.visible == True)  # noqa: E712 (a SQL expression)
        rows = (list(q.order_by(tr.id)) if last is None else
                list(reversed(q.order_by(tr.id.desc()).limit(last))))
        return [EntryRecord(e.id, e.session_id, e.role, e.text, bool(e.visible), e.message_id,
                            e.created_at, e.sender_id, e.kind)
                for e in rows]

    def recent_message_ids(self, kind: str, limit: int) -> list[str]:
        """Ids of the newest ``limit`` messages of ``kind`` the database holds, oldest
        first: committed in a transcript, or waiting in the inbox (open rows; a delivered
        one is in its transcript). Each read walks its table backwards from the newest
        row until it has ``limit`` (a start-up read: a kind that is rare in a large
        database costs a scan, which no index on every transcript write would)."""
        tr, m = self.t.transcript, self.t.inbox
        entries = (tr.select(tr.created_at, tr.message_id)
                   .where(tr.kind == kind, tr.message_id.is_null(False))
                   .order_by(tr.id.desc()).limit(limit))
        waiting = (m.select(m.created_at, m.message_id)
                   .where(m.kind == kind, m.status.in_(OPEN_STATES))
                   .order_by(m.seq.desc()).limit(limit))
        newest = sorted([*((r.created_at, r.message_id) for r in entries),
                         *((r.created_at, r.message_id) for r in waiting)])
        return list(dict.fromkeys(mid for _, mid in newest))[-limit:]

    def marker_counts(self) -> dict[str, int]:
        """Committed delivery markers per message id (the crash checker's evidence)."""
        mk = self.t.marker
        q = mk.select(mk.message_id, pw.fn.COUNT(mk.id).alias("n")).group_by(mk.message_id)
        return {r.message_id: r.n for r in q}
