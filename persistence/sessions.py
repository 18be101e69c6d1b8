"""Projects, sessions and transcripts: the records the actors address and write.

Writes go through the group-commit writer like the journal's; reads run on
the caller's thread. Records come back as frozen dataclasses so callers
never hold live peewee rows across threads (:mod:`.session_records`). The
direct-turn marks on session rows are :mod:`.direct_marks`'s, a base class of
the store.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any, Literal

import peewee as pw

from . import paging, session_filters
from .conflicts import unless_present
from .database import is_postgres
from .direct_marks import DirectTurnMarks
from .errors import DuplicateError, RowNotFound
from .inbox_core import OPEN_STATES
from .journal import TurnEntry
from .models import Project, Session, Tables
from .session_records import EntryRecord, ProjectRecord, SessionPage, SessionRecord
from .session_view import IDLE, live_columns
from .writer import GroupCommitWriter

Roots = Literal["all", "workers", "none"]
"""Which roots of its project a session's family read takes (:meth:`SessionStore.family`)."""

IDS_PER_READ = 500
"""Session ids one ``IN (...)`` names at most (SQLite bounds a statement's parameters)."""


def _project(p: Project) -> ProjectRecord:
    return ProjectRecord(p.id, p.slug, p.name, bool(p.archived), bool(p.hidden), p.created_at)


def _session(s: Session) -> SessionRecord:
    """The record of a row read by :meth:`SessionStore._select` (with its derived columns)."""
    return SessionRecord(s.id, s.project_id, s.title, s.kind, s.platform, s.parent_id,
                         s.live_status, s.created_at, s.recent,  # type: ignore[attr-defined]
                         json.loads(s.config or "{}"))


class SessionStore(DirectTurnMarks):
    """Projects, sessions and transcripts on one database (the direct-turn marks:
    :class:`.direct_marks.DirectTurnMarks`)."""

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
                # Its id and slug both: any unique conflict (a NOT NULL one raises).
                unless_present(p.insert(id=project_id, slug=slug, name=name, hidden=hidden,
                                        created_at=now)).execute()
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
        if not unless_present(s.insert(id=session_id, project_id=project_id, title=title,
                                       kind=kind, platform=platform, parent_id=parent_id,
                                       status=IDLE,
                                       config=json.dumps(config or {}, sort_keys=True),
                                       created_at=now, updated_at=now),
                              s.id).as_rowcount().execute():
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
        index probe of its transcript's end: no index orders by it). ``limit`` None:
        every session; :class:`~.errors.InvalidArgument` for a bound outside :mod:`.paging`'s."""
        limit, offset = paging.limit(limit), paging.offset(offset)
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
        return [_session(r) for r in paging.cut(q, limit, offset)]

    def sessions_page(self, *, project_id: str | None = None, limit: int | None = 100,
                      after: str | paging.Keyset | None = None, offset: int = 0
                      ) -> SessionPage:
        """A page of sessions (of one project, or all) newest first by creation, ties by
        id: at most ``limit`` past the cursor ``after`` (None: from the newest) but the
        first ``offset`` of them, and the cursor of the next page. (``offset`` is for the
        ``--offset`` of ``kinbox sessions list``: sessions created meanwhile shift it.)

        Not by recency, as :meth:`sessions` lists: a session's recency changes with each
        of its turns, so one active between two reads moves ahead of the page boundary,
        and the walk shows another twice and it never (an offset or a cursor alike). A
        creation time never changes: each session that existed when the walk began is
        on exactly one page; one created meanwhile comes before the walk's start (or,
        stamped by a clock behind, once on a later page). An index walk from the cursor
        (``sessions_created_at_id``, per project ``sessions_project_id_created_at_id``),
        whatever the page's depth. Bounds and cursor: :mod:`.paging`."""
        limit, position = paging.limit(limit), paging.keyset(after)
        offset = paging.offset(offset)
        s = self.t.session
        q = self._select().order_by(s.created_at.desc(), s.id.desc())
        if project_id is not None:
            q = q.where(s.project_id == project_id)
        if position is not None:
            q = q.where(pw.Tuple(s.created_at, s.id) < pw.Tuple(position.at, position.id))
        rows = [_session(r) for r in paging.cut(q, None if limit is None else limit + 1, offset)]
        if limit is None or len(rows) <= limit:
            return SessionPage(rows, None)
        last = rows[limit - 1]
        return SessionPage(rows[:limit], paging.Keyset(last.created_at, last.id).token())

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
        grandchildren (of the session's project), and the roots of the session's project
        (for shared workers):
        ``all`` of them, only those whose config may name a worker (``workers``: the
        caller knows the roster is after those), or ``none``."""
        s = self.t.session
        near = [session.id] + ([session.parent_id] if session.parent_id else [])
        # Kin of the session's own project only (S2): a parent's children elsewhere are
        # never on its roster, and a parent like Focal has them in every project.
        cond = s.id.in_(near) | (s.parent_id.in_(near) & (s.project_id == session.project_id))
        if roots != "none":
            root = s.parent_id.is_null() & (s.project_id == session.project_id)
            if roots == "workers":
                root &= session_filters.names_a_worker(self.t)
            cond |= root
        first = list(self._select().where(cond))
        children = [r.id for r in first if r.parent_id == session.id]
        grand = (list(self._select().where(s.parent_id.in_(children),
                                           s.project_id == session.project_id))
                 if children else [])
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

    def config_now(self, session_id: str) -> dict[str, Any]:
        """A session's config inside the caller's transaction, its row locked until the
        commit (PostgreSQL; SQLite's writes are serial): a change computed from it is not
        lost to another process's change of the same row in between (:class:`RowNotFound`
        when there is no such session)."""
        s = self.t.session
        query = s.select(s.config).where(s.id == session_id)
        if is_postgres(self.t.db):
            query = query.for_update()
        row = query.first()
        if row is None:
            raise RowNotFound("session", session_id)
        return dict(json.loads(row.config or "{}"))

    def patch_config_now(self, session_id: str, patch: dict[str, Any], now: float) -> None:
        """Merge ``patch`` into a session's config inside the caller's transaction (the
        merge reads the row locked, :meth:`config_now`: two processes patching other keys
        of one config at once both keep theirs)."""
        s = self.t.session
        config = {**self.config_now(session_id), **patch}
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
                   visible_only: bool = False, before_id: int | None = None,
                   roles: Collection[str] | None = None) -> list[EntryRecord]:
        """A session's transcript, oldest first: every entry, or only the ``last`` N
        (of the visible ones with ``visible_only``, of those ``roles`` with ``roles``),
        read with a LIMIT (``last`` as a page's ``limit``, :mod:`.paging`). ``before_id``
        keeps only entries older than that entry id (unique, in order within a session):
        the page before one whose oldest entry has it, found through the ``(session_id,
        id)`` index (a keyset position, :func:`.paging.position`)."""
        last = paging.limit(last, "last")
        tr = self.t.transcript
        q = self._entries(tr.select(), session_id, visible_only, before_id, roles)
        rows = (list(q.order_by(tr.id)) if last is None else
                list(reversed(q.order_by(tr.id.desc()).limit(last))))
        return [EntryRecord(e.id, e.session_id, e.role, e.text, bool(e.visible), e.message_id,
                            e.created_at, e.sender_id, e.kind)
                for e in rows]

    def count_entries(self, session_id: str, *, visible_only: bool = False,
                      before_id: int | None = None,
                      roles: Collection[str] | None = None) -> int:
        """How many entries :meth:`transcript` would read with the same filters and no
        ``last``, counted in the database (no text read)."""
        tr = self.t.transcript
        return self._entries(tr.select(pw.fn.COUNT(tr.id)), session_id, visible_only,
                             before_id, roles).scalar() or 0

    def _entries(self, q: pw.Select, session_id: str, visible_only: bool,
                 before_id: int | None, roles: Collection[str] | None) -> pw.Select:
        """``q`` narrowed to one session's entries as :meth:`transcript` filters them."""
        before_id = paging.position(before_id, "before_id")
        tr = self.t.transcript
        q = q.where(tr.session_id == session_id)
        if visible_only:
            q = q.where(tr.visible == True)  # noqa: E712 (a SQL expression)
        if before_id is not None:
            q = q.where(tr.id < before_id)
        if roles is not None:
            q = q.where(tr.role.in_(list(roles)))
        return q

    def recent_message_ids(self, kind: str, limit: int | None) -> list[str]:
        """Ids of the newest ``limit`` messages of ``kind`` the database holds, oldest
        first: committed in a transcript, or waiting in the inbox (open rows; a delivered
        one is in its transcript). Each read walks its table backwards from the newest
        row until it has ``limit`` (a start-up read: a kind that is rare in a large
        database costs a scan, which no index on every transcript write would).
        ``limit`` as a page's (:mod:`.paging`): None reads every such id."""
        limit = paging.limit(limit)
        tr, m = self.t.transcript, self.t.inbox
        entries = (tr.select(tr.created_at, tr.message_id)
                   .where(tr.kind == kind, tr.message_id.is_null(False))
                   .order_by(tr.id.desc()).limit(limit))
        waiting = (m.select(m.created_at, m.message_id)
                   .where(m.kind == kind, m.status.in_(OPEN_STATES))
                   .order_by(m.seq.desc()).limit(limit))
        newest = sorted([*((r.created_at, r.message_id) for r in entries),
                         *((r.created_at, r.message_id) for r in waiting)])
        ids = list(dict.fromkeys(mid for _, mid in newest))
        return ids if limit is None else ids[-limit:]

    def marker_counts(self) -> dict[str, int]:
        """Committed delivery markers per message id (the crash checker's evidence)."""
        mk = self.t.marker
        q = mk.select(mk.message_id, pw.fn.COUNT(mk.id).alias("n")).group_by(mk.message_id)
        return {r.message_id: r.n for r in q}
